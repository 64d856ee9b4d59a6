"""`ProcessEngineClient`: the engine core in its own process, so that the busy loop and the HTTP event loop
do not share one GIL.

The child (`spawn` context, daemon) builds `LLMEngine(config)`, reports its `EngineLimits`, and runs the busy
loop (`hetero_infer.worker.core.busy_loop`) over its two pipes: commands in (batches of add / abort /
shutdown; read without blocking while it has work, blocking when idle), `EngineOutputs` out (pickled: a merged
`RequestDelta` per request that progressed, with the end time of every step that gave it tokens, on the same
`time.monotonic()` clock as the parent on Linux; the requests refused or aborted; the `EngineStats` snapshot).

The parent side has no thread: the event loop reads the child's pipe when it is readable and hands each message
to `EngineClient._on_outputs`, exactly as the thread client does. Commands are written at once and without
blocking. If the child dies (crash, killed), the pipe reads end-of-file and the engine turns dead (/readyz red,
open requests fail with `EngineDeadError`).

The child never outlives the parent: it is a daemon process (terminated at the parent's exit), it asks the
kernel for SIGKILL when the parent dies (Linux PR_SET_PDEATHSIG) and it exits on end-of-file of the command
pipe or when its parent process id changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import itertools
import logging
import multiprocessing
import os
import pickle
import select
import signal
import sys
import threading
import types
from typing import Any

from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.model_source import ModelSourceError
from hetero_infer.worker.core.busy_loop import SHUTDOWN, Command, EngineOutputs, run_busy_loop
from hetero_infer.worker.core.request_check import EngineLimits
from hetero_infer.worker.frontend.client import EngineClient, EngineDeadError
from hetero_infer.worker.frontend.gc_freeze import freeze_startup_objects
from hetero_infer.worker.frontend.timing import TimingSink
from hetero_infer.worker.structured.spec import GrammarSpec

logger = logging.getLogger("hetero_infer.engine_process")

_PROTO = pickle.HIGHEST_PROTOCOL  # 5 on the supported Pythons
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)  # Linux
_PIPE_SIZE = 1 << 20

# Messages (child -> parent). While loading: _M_PINNED (the config with its model resolved into a folder), then
# _M_READY or _M_LOAD_ERROR (the exception's type name and message, and the exception where it can be raised as is).
_M_READY, _M_LOAD_ERROR, _M_BATCH, _M_FATAL, _M_GRAMMAR, _M_PINNED = 0, 1, 2, 3, 4, 5
# A command (parent -> child) that the child's link handles itself, never the busy loop: compile a grammar on the
# engine's compile threads, (token, spec, deadline); the answer comes back as _M_GRAMMAR (token, error or None).
_C_GRAMMAR = 100


# ============================================================================ child
def _set_parent_death_signal() -> None:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:  # not Linux: the pipe end-of-file and the parent-pid check remain
        pass


def _child_main(config: EngineConfig, cmd_conn: Any, out_conn: Any, parent_pid: int, interval: float,
                log: tuple[str, str] | None, offline: bool = False) -> None:
    _set_parent_death_signal()
    if log is not None:
        from hetero_infer.worker.server.logs import setup_child_logging

        setup_child_logging(*log)
    # A signal sent to the whole process group (Ctrl-C in a terminal, `kill -TERM -pgid`) must not kill the
    # engine under a draining server: the parent drains first, then stops us. Hence a process group of our own.
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if os.getppid() != parent_pid:
        return
    try:
        from hetero_infer.worker.runner.loader import pin_model

        config = pin_model(config)  # downloaded or converted once, here: the parent loads its tokenizer from it
        out_conn.send_bytes(pickle.dumps((_M_PINNED, config), _PROTO))
        from hetero_infer.worker.core.engine import LLMEngine

        engine = LLMEngine(config, offline=offline)
        limits = engine.limits
    except BaseException as exc:
        out_conn.send_bytes(pickle.dumps((_M_LOAD_ERROR, (type(exc).__name__, str(exc), _portable(exc))), _PROTO))
        return
    freeze_startup_objects()
    logger.info(
        "engine process %d: %s loaded (executor %s, %d KV blocks of %d tokens)", os.getpid(), limits.model_name,
        config.executor, limits.num_blocks, limits.block_size)
    out_conn.send_bytes(pickle.dumps((_M_READY, (limits, engine.stats())), _PROTO))
    try:
        run_busy_loop(engine, _PipeLink(cmd_conn, out_conn, parent_pid, engine.grammars), interval)
    except (EOFError, BrokenPipeError, ConnectionResetError):  # the parent is gone
        return
    except BaseException as exc:
        logger.exception("engine step failed; the engine is stopped")
        try:
            out_conn.send_bytes(pickle.dumps((_M_FATAL, f"engine failure: {type(exc).__name__}: {exc}"), _PROTO))
        except Exception:
            pass


def _portable(exc: BaseException) -> BaseException | None:
    """`exc` itself where the parent can raise it as it is (a built-in exception or the model source's, that
    pickles), else None."""
    from hetero_infer.model_source import ModelSourceError

    if not isinstance(exc, Exception) or (type(exc).__module__ != "builtins" and not isinstance(exc, ModelSourceError)):
        return None
    try:
        pickle.loads(pickle.dumps(exc, _PROTO))
    except Exception:
        return None
    return exc


class _PipeLink:
    """The busy loop's link in the child: commands from one pipe, outputs to the other."""

    def __init__(self, cmd_conn: Any, out_conn: Any, parent_pid: int, grammars: Any) -> None:
        self.cmd_conn = cmd_conn
        self.out_conn = out_conn
        self.parent_pid = parent_pid
        self.grammars = grammars  # the engine's GrammarCache: grammars compile on its threads, off the loop
        self._send_lock = threading.Lock()  # the loop's hand-overs and the compile threads' answers
        poller = select.poll()  # one poll object: Connection.poll() builds a selector per call (5 us per step)
        poller.register(cmd_conn.fileno(), select.POLLIN)
        self.poll = poller.poll

    def receive(self, block: bool) -> list[Command] | None:
        poll = self.poll
        if block:  # idle: wait for commands, checking now and then that the parent still lives
            while not poll(1000):
                if os.getppid() != self.parent_pid:
                    return None
        commands: list[Command] = []
        while poll(0):
            commands += pickle.loads(self.cmd_conn.recv_bytes())
        if any(kind == _C_GRAMMAR for kind, _ in commands):
            for kind, item in commands:
                if kind == _C_GRAMMAR:
                    self._prepare_grammar(*item)
            commands = [c for c in commands if c[0] != _C_GRAMMAR]
        return commands

    def send(self, outputs: EngineOutputs) -> None:
        self._send((_M_BATCH, outputs))

    def _send(self, message: tuple) -> None:
        data = pickle.dumps(message, _PROTO)
        with self._send_lock:
            self.out_conn.send_bytes(data)

    def _prepare_grammar(self, token: int, spec: Any, deadline: float) -> None:
        def answer(future: Any) -> None:  # on a compile thread (or here, for a cached grammar)
            try:
                self._send((_M_GRAMMAR, (token, future.exception())))
            except OSError:  # the parent is gone; the loop learns it at its next receive
                pass

        self.grammars.prepare(spec, deadline).add_done_callback(answer)


# ============================================================================ parent
@contextlib.contextmanager
def _main_module_hidden():
    """`spawn` runs the parent's main script again in the child (to find what it pickled by reference there); an
    `LLM(...)` at a script's top level, with no `if __name__ == "__main__":` guard, would then start an engine
    in the engine's own start-up. The child needs nothing of it (its config and commands are the package's own
    types), so it is not told of it."""
    main = sys.modules.get("__main__")
    if main is None or (getattr(main, "__file__", None) is None and getattr(main, "__spec__", None) is None):
        yield
        return
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def _frame(data: bytes) -> bytes:
    """One message as `multiprocessing.Connection.send_bytes` frames it (what the child's `recv_bytes` reads):
    a signed 32-bit big-endian length, or -1 and a 64-bit one."""
    n = len(data)
    head = n.to_bytes(4, "big", signed=True) if n <= 0x7FFFFFFF else (-1).to_bytes(4, "big", signed=True) + \
        n.to_bytes(8, "big")
    return head + data


class EngineProcess:
    """The child process and its two pipes; `start()` spawns it, `wait_pinned()` waits for its model's folder
    (the child downloads or converts the model first: the parent's own imports and tokenizer load run meanwhile),
    `wait_ready()` for its limits."""

    def __init__(self, config: EngineConfig, stream_interval: float = 0.0, log: tuple[str, str] | None = None,
                 offline: bool = False) -> None:
        """log: (level, format) of the server's logging, for the child's records (None: Python's defaults);
        offline: the engine serves a caller that waits for whole results (`LLM`: see `LLMEngine`)."""
        ctx = multiprocessing.get_context("spawn")
        self._cmd_recv, self.cmd_conn = ctx.Pipe(duplex=False)
        self.out_conn, self._out_send = ctx.Pipe(duplex=False)
        self.process = ctx.Process(
            target=_child_main, name="engine-core", daemon=True,
            args=(config, self._cmd_recv, self._out_send, os.getpid(), stream_interval, log, offline))
        self.pinned: EngineConfig | None = None
        self.limits: EngineLimits | None = None
        self.initial_stats: Any = None
        self._send_lock = threading.Lock()

    def start(self) -> None:
        """Spawn the child (call this on the main thread: the parent-death signal follows the creating thread)."""
        with _main_module_hidden():
            self.process.start()
        self._cmd_recv.close()  # the child's ends: closed here, so that either side's death reads as EOF
        self._out_send.close()
        for conn in (self.cmd_conn, self.out_conn):  # room for bursts, so that neither side waits on the other
            try:
                fcntl.fcntl(conn.fileno(), _F_SETPIPE_SZ, _PIPE_SIZE)
            except OSError:
                pass

    def wait_pinned(self) -> EngineConfig:
        """Block until the child has resolved its model into a local folder; the config that names it."""
        while self.pinned is None:
            self._receive_loading()
        return self.pinned

    def wait_ready(self) -> EngineLimits:
        """Block until the child has built its engine (RuntimeError with its reason if it could not; a model
        that cannot be fetched is the child's ModelSourceError, whose one line says it all)."""
        while self.limits is None:
            self._receive_loading()
        return self.limits

    def _receive_loading(self) -> None:
        try:
            kind, item = pickle.loads(self.out_conn.recv_bytes())
        except EOFError:
            self.process.join(5)
            raise RuntimeError(f"the engine process exited while loading (exit code {self.process.exitcode})") from None
        if kind == _M_LOAD_ERROR:
            self.process.join(5)
            name, message, exc = item
            if exc is not None:
                raise exc
            raise ModelSourceError(message) if name == ModelSourceError.__name__ else RuntimeError(f"{name}: {message}")
        if kind == _M_PINNED:
            self.pinned = item
        else:
            self.limits, self.initial_stats = item

    def send(self, commands: list[Command]) -> None:
        """Send commands (kind, item) to the child, in one message."""
        data = pickle.dumps(commands, _PROTO)
        with self._send_lock:
            self.cmd_conn.send_bytes(data)

    def stop(self, timeout: float = 10.0, ask: bool = True) -> None:
        """Ask the child to stop (`ask`: send it the shutdown command; False when the caller did), wait up to
        `timeout` seconds, then make sure it is gone (terminate, then kill)."""
        if self.process.is_alive():
            if ask:
                try:
                    self.send([(SHUTDOWN, None)])
                except OSError:
                    pass
            self.process.join(timeout)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(2)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(2)
        for conn in (self.cmd_conn, self.out_conn):
            try:
                conn.close()
            except OSError:
                pass

    @property
    def pid(self) -> int | None:
        return self.process.pid


class ProcessEngineClient(EngineClient):
    """The engine client whose engine runs in an `EngineProcess`: the event loop reads the child's messages
    itself when its pipe is readable (`add_reader`); commands go to the child as they come (`_send`)."""

    def __init__(self, core: EngineProcess, *, timing_sink: TimingSink | None = None,
                 stream_interval: float = 0.0, tokenizer: Any = None) -> None:
        """tokenizer: what this (the API) process detokenizes the engine's token ids with (None: no text)."""
        super().__init__(timing_sink=timing_sink, stream_interval=stream_interval, tokenizer=tokenizer)
        self.core = core
        self._started = False
        self._stop = False
        self._fd = -1
        self._buf = bytearray()
        self._cmd_fd = -1
        self._backlog = bytearray()  # command bytes the pipe had no room for yet (written when it drains)
        self._grammar_waiters: dict[int, asyncio.Future[None]] = {}  # prepare_grammar calls, by token
        self._grammar_tokens = itertools.count()

    # ----------------------------------------------------------------- lifecycle (loop thread)
    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        if self._started:
            raise RuntimeError("the engine client is already started")
        self._loop = loop or asyncio.get_running_loop()
        self._stats = self.core.initial_stats
        self._fd = self.core.out_conn.fileno()
        os.set_blocking(self._fd, False)
        self._loop.add_reader(self._fd, self._on_readable)
        self._cmd_fd = self.core.cmd_conn.fileno()
        os.set_blocking(self._cmd_fd, False)
        self._started = True

    def shutdown(self, timeout: float = 10.0) -> None:
        self._stop = True
        self._remove_reader()
        # Ask the child to stop unless commands are still stuck in front of the request (it is not reading:
        # then it is terminated at once).
        asked = self._cmd_fd >= 0 and not self._backlog and self._dead is None and self._write(
            _frame(pickle.dumps([(SHUTDOWN, None)], _PROTO)))
        if self._cmd_fd >= 0 and self._loop is not None and not self._loop.is_closed():
            self._loop.remove_writer(self._cmd_fd)
        self._cmd_fd = -1
        self._backlog.clear()
        self.core.stop(timeout if asked else 0.0, ask=False)
        if self._dead is None:
            self._on_dead(EngineDeadError("the engine was shut down"))

    def _remove_reader(self) -> None:
        if self._fd >= 0 and self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._fd)
        self._fd = -1

    @property
    def healthy(self) -> bool:
        # A child that dies closes its pipe: the loop reads end-of-file and turns the engine dead at once, so
        # this needs no system call per request.
        return self._dead is None and self._started and not self._stop

    # ----------------------------------------------------------------- commands (loop thread)
    def _send(self, commands: list[Command]) -> None:
        """Send commands to the child at once. Not batched per loop iteration: when many requests arrive
        together (clients that each send their next request as the previous one ends), the engine starts on
        the first while the loop is still parsing the others, instead of idling until the last is parsed and
        then taking them all in one step; the arrivals stay spread out, so later ends and arrivals overlap
        with the engine's work (measured: the time a finished request's slot stays empty halves)."""
        if self._dead is None and self._cmd_fd >= 0:
            frame = _frame(pickle.dumps(commands, _PROTO))
            if self._backlog:  # behind what is already waiting, in order
                self._backlog += frame
            elif not self._write(frame):
                assert self._loop is not None
                self._loop.add_writer(self._cmd_fd, self._write_backlog)

    def _write(self, frame: bytes) -> bool:
        """Write without blocking: the event loop must never wait for the child (a stopped or busy engine with
        a full pipe would freeze every connection; and a child blocked writing its outputs to a loop blocked
        writing commands would be a deadlock). What does not fit goes to the backlog; True if all went."""
        try:
            n = os.write(self._cmd_fd, frame)
        except BlockingIOError:
            n = 0
        except OSError:  # the child is gone: its output pipe reads end-of-file, which fails everything
            return True
        if n < len(frame):
            self._backlog += memoryview(frame)[n:]
            return False
        return True

    def _write_backlog(self) -> None:
        try:
            n = os.write(self._cmd_fd, self._backlog)
        except BlockingIOError:
            return
        except OSError:
            n = len(self._backlog)
        del self._backlog[:n]
        if not self._backlog:
            assert self._loop is not None
            self._loop.remove_writer(self._cmd_fd)

    async def prepare_grammar(self, spec: GrammarSpec, deadline: float) -> None:
        if self._dead is not None:
            raise EngineDeadError(str(self._dead))
        assert self._loop is not None
        token = next(self._grammar_tokens)
        waiter = self._grammar_waiters[token] = self._loop.create_future()
        try:
            self._send([(_C_GRAMMAR, (token, spec, deadline))])
            await waiter
        finally:
            self._grammar_waiters.pop(token, None)

    def _on_grammar(self, token: int, error: BaseException | None) -> None:
        waiter = self._grammar_waiters.pop(token, None)
        if waiter is not None and not waiter.done():
            if error is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(error)

    # ----------------------------------------------------------------- messages (loop thread)
    def _on_readable(self) -> None:
        try:
            data = os.read(self._fd, _PIPE_SIZE)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # end of file: the child is gone
            self._remove_reader()
            if not self._stop:
                self.core.process.join(2)
                self._fail_dead(f"engine failure: the engine process exited (exit code {self.core.process.exitcode})")
            return
        buf = self._buf
        buf += data
        pos, n = 0, len(buf)
        messages = []
        while n - pos >= 4:  # multiprocessing.Connection framing: a signed 32-bit size, or -1 and a 64-bit one
            size = int.from_bytes(buf[pos:pos + 4], "big", signed=True)
            head = 4
            if size == -1:
                if n - pos < 12:
                    break
                size = int.from_bytes(buf[pos + 4:pos + 12], "big")
                head = 12
            if n - pos - head < size:
                break
            messages.append(buf[pos + head:pos + head + size])
            pos += head + size
        del buf[:pos]
        for data in messages:
            if self._dead is not None:
                return
            try:
                kind, item = pickle.loads(data)
                if kind == _M_FATAL:
                    self._fail_dead(item)
                elif kind == _M_BATCH:
                    self._on_outputs(item)
                elif kind == _M_GRAMMAR:
                    self._on_grammar(*item)
            except Exception as exc:  # a message we cannot use: the engine can no longer be trusted
                logger.exception("bad message from the engine process")
                self._fail_dead(f"engine failure: {type(exc).__name__}: {exc}")

    def _fail_dead(self, message: str) -> None:
        err = EngineDeadError(message)
        logger.error("%s; the engine is stopped", err)
        self._remove_reader()
        self._on_dead(err)

    def _on_dead(self, error: BaseException) -> None:
        super()._on_dead(error)
        waiters, self._grammar_waiters = self._grammar_waiters, {}
        for waiter in waiters.values():
            if not waiter.done():
                waiter.set_exception(error)


def load_parent_tokenizer(config: EngineConfig) -> Any:
    """The server's own tokenizer, as the engine builds it (same folder, same generation EOS ids); None with
    `skip_tokenizer_init`."""
    from hetero_infer.contracts.tokenizer import load_tokenizer
    from hetero_infer.worker.runner.loader import resolve_engine_model

    folder, _ = resolve_engine_model(config)
    return load_tokenizer(folder, config.skip_tokenizer_init)
