"""The engine core in its own process, so that the engine loop and the HTTP event loop do not share one GIL.

The child (`spawn` context, daemon) builds `LLMEngine(config)` and loops: it applies the commands of the parent
(batches of add / abort / shutdown) — without blocking while it has work, blocking when idle —, runs `step()`
with delta outputs, and sends back only what is NEW, at most every `stream_interval` seconds (and always when
the engine turns idle): one entry per request that progressed since the previous message, with the new token
ids, new text and new logprobs entries of every sample (the deltas of all steps in between, merged), its
finish/stop reasons, error and metrics, and the end time of every step that gave it tokens
(`time.monotonic()`, the same clock in both processes on Linux: the parent records the per-request timing, first
token and the gap between every two output steps, from them); plus the requests it refused or aborted and the
`EngineStats` snapshot. A slow parent gets fewer, bigger messages rather than a backlog.

The parent side is `ProcessAsyncEngine`: the `AsyncEngine` interface the server uses (submit / abort /
fail_all / stats / healthy / error / shutdown, `OutputStream`), without a thread: the event loop reads the
child's pipe when it is readable and merges the deltas into the requests' streams, which hand out cumulative
outputs exactly as in thread mode. If the child dies (crash, killed), the pipe reads end-of-file and the engine
turns dead (/readyz red, open requests fail with `EngineDeadError`).

The child never outlives the parent: it is a daemon process (terminated at the parent's exit), it asks the
kernel for SIGKILL when the parent dies (Linux PR_SET_PDEATHSIG) and it exits on end-of-file of the command
pipe or when its parent process id changes.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import multiprocessing
import os
import pickle
import select
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hetero_infer.worker.async_engine import (
    AsyncEngine,
    EngineDeadError,
    EngineRequest,
    OutputStream,
    RequestTiming,
    TimingSink,
    take_entries,
)
from hetero_infer.worker.config import EngineConfig
from hetero_infer.worker.gc_freeze import freeze_startup_objects

logger = logging.getLogger("hetero_infer.engine_process")

_PROTO = pickle.HIGHEST_PROTOCOL  # 5 on the supported Pythons
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)  # Linux
_PIPE_SIZE = 1 << 20

# Commands (parent -> child)
_C_ADD, _C_ABORT, _C_SHUTDOWN = 0, 1, 2
# Messages (child -> parent)
_M_READY, _M_LOAD_ERROR, _M_BATCH, _M_FATAL = 0, 1, 2, 3


@dataclass(frozen=True)
class EngineLimits:
    """What the parent needs to know of the engine to validate requests without it."""

    model_name: str
    max_model_len: int
    vocab_size: int
    num_blocks: int
    block_size: int
    eos_token_ids: tuple[int, ...]


# ============================================================================ child
def _set_parent_death_signal() -> None:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:  # not Linux: the pipe end-of-file and the parent-pid check remain
        pass


def _child_main(config: EngineConfig, cmd_conn: Any, out_conn: Any, parent_pid: int, interval: float,
                log: tuple[str, str] | None) -> None:
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
        from hetero_infer.worker.engine import LLMEngine

        engine = LLMEngine(config)
        limits = EngineLimits(engine.model_name, engine.max_model_len, int(engine.vocab_size),
                              engine.block_manager.num_blocks, engine.block_manager.block_size,
                              tuple(sorted(engine.tokenizer.eos_token_ids)))
    except BaseException as exc:
        out_conn.send_bytes(pickle.dumps((_M_LOAD_ERROR, f"{type(exc).__name__}: {exc}"), _PROTO))
        return
    freeze_startup_objects()
    logger.info(
        "engine process %d: %s loaded (executor %s, %d KV blocks of %d tokens)", os.getpid(), limits.model_name,
        config.executor, limits.num_blocks, limits.block_size)
    out_conn.send_bytes(pickle.dumps((_M_READY, (limits, engine.stats())), _PROTO))
    try:
        _child_loop(engine, cmd_conn, out_conn, parent_pid, interval)
    except (EOFError, BrokenPipeError, ConnectionResetError):  # the parent is gone
        return
    except BaseException as exc:
        logger.exception("engine step failed; the engine is stopped")
        try:
            out_conn.send_bytes(pickle.dumps((_M_FATAL, f"engine failure: {type(exc).__name__}: {exc}"), _PROTO))
        except Exception:
            pass


def _child_loop(engine: Any, cmd_conn: Any, out_conn: Any, parent_pid: int, interval: float) -> None:
    """Apply commands, step, and send what is new at most every `interval` seconds (always when idle).

    Requests are added with delta outputs; the engine merges the deltas of the steps between two messages per
    request (`LLMEngine.step_merged`), with the end time of every step that gave the request tokens, so a
    message holds one entry per request that progressed (not one per step) and the parent records the
    per-request timing from those times. Requests that end are sent at once, in a message of their own.
    """
    loads, dumps = pickle.loads, pickle.dumps
    monotonic = time.monotonic
    poller = select.poll()  # one poll object: Connection.poll() builds a selector per call (5 us, once per step)
    poller.register(cmd_conn.fileno(), select.POLLIN)
    poll = poller.poll
    pending: dict[str, list] = {}  # the deltas of the steps since the last message (merged)
    rejected: list[tuple[str, str, bool]] = []
    aborted: list[tuple[str, float, list[float] | None, int]] = []  # (request id, when, its step times and tokens
    # not sent yet)
    num_steps = 0
    last_send = 0.0
    dirty = False  # something happened since the last message (stats to refresh)

    def send(batch: dict[str, list], steps: int) -> None:
        nonlocal rejected, aborted, dirty
        out_conn.send_bytes(dumps((_M_BATCH, (steps, take_entries(batch), rejected, aborted, engine.stats())),
                                  _PROTO))
        rejected, aborted = [], []
        dirty = False

    while True:
        busy = engine.has_unfinished_requests()
        if not busy:
            if dirty or pending or rejected or aborted:
                send(pending, num_steps)
                pending, num_steps = {}, 0
            # Idle: block on the command pipe, checking now and then that the parent still lives.
            while not poll(1000):
                if os.getppid() != parent_pid:
                    return
        while poll(0):
            dirty = True
            for kind, item in loads(cmd_conn.recv_bytes()):
                if kind == _C_ADD:
                    rid, prompt, ids, params = item
                    try:
                        engine.add_request(rid, prompt, ids, params, delta=True)
                    except Exception as exc:  # a refused request must not stop the engine
                        rejected.append((rid, str(exc), isinstance(exc, ValueError)))
                elif kind == _C_ABORT:
                    now = monotonic()
                    for rid in item:
                        if rid not in engine.requests:  # finished already: its last entry stands
                            continue
                        engine.abort_request(rid)
                        e = pending.pop(rid, None)  # deltas not sent yet die with the request
                        aborted.append((rid, now, None, 0) if e is None else
                                       (rid, now, e[4], sum(len(smp[0]) for smp in e[3])))
                else:
                    return
        if not engine.has_unfinished_requests():
            continue
        ended = engine.step_merged(pending)  # the step's deltas, merged straight into `pending` (no objects)
        t = monotonic()
        num_steps += 1
        if t - last_send >= interval:
            send(pending, num_steps)
            pending, num_steps = {}, 0
            last_send = t
        elif ended:  # requests that ended go out at once: their clients wait for the end, not for more tokens
            send({rid: pending.pop(rid) for rid in [rid for rid, e in pending.items() if e[0]]}, 0)


# ============================================================================ parent
def _frame(data: bytes) -> bytes:
    """One message as `multiprocessing.Connection.send_bytes` frames it (what the child's `recv_bytes` reads):
    a signed 32-bit big-endian length, or -1 and a 64-bit one."""
    n = len(data)
    head = n.to_bytes(4, "big", signed=True) if n <= 0x7FFFFFFF else (-1).to_bytes(4, "big", signed=True) + \
        n.to_bytes(8, "big")
    return head + data


class EngineProcess:
    """The child process and its two pipes; `start()` spawns it, `wait_ready()` waits for its limits."""

    def __init__(self, config: EngineConfig, stream_interval: float = 0.0, log: tuple[str, str] | None = None) -> None:
        """log: (level, format) of the server's logging, for the child's records (None: Python's defaults)."""
        ctx = multiprocessing.get_context("spawn")
        self._cmd_recv, self.cmd_conn = ctx.Pipe(duplex=False)
        self.out_conn, self._out_send = ctx.Pipe(duplex=False)
        self.process = ctx.Process(
            target=_child_main, name="engine-core", daemon=True,
            args=(config, self._cmd_recv, self._out_send, os.getpid(), stream_interval, log))
        self.limits: EngineLimits | None = None
        self.initial_stats: Any = None
        self._send_lock = threading.Lock()

    def start(self) -> None:
        """Spawn the child (call this on the main thread: the parent-death signal follows the creating thread)."""
        self.process.start()
        self._cmd_recv.close()  # the child's ends: closed here, so that either side's death reads as EOF
        self._out_send.close()
        for conn in (self.cmd_conn, self.out_conn):  # room for bursts, so that neither side waits on the other
            try:
                fcntl.fcntl(conn.fileno(), _F_SETPIPE_SZ, _PIPE_SIZE)
            except OSError:
                pass

    def wait_ready(self) -> EngineLimits:
        """Block until the child has built its engine (RuntimeError with its reason if it could not)."""
        try:
            kind, item = pickle.loads(self.out_conn.recv_bytes())
        except EOFError:
            self.process.join(5)
            raise RuntimeError(f"the engine process exited while loading (exit code {self.process.exitcode})") from None
        if kind == _M_LOAD_ERROR:
            self.process.join(5)
            raise RuntimeError(item)
        self.limits, self.initial_stats = item
        return self.limits

    def send(self, commands: list[tuple[int, Any]]) -> None:
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
                    self.send([(_C_SHUTDOWN, None)])
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


class ProcessAsyncEngine(AsyncEngine):
    """`AsyncEngine` whose engine runs in an `EngineProcess`.

    There is no thread on this side: the event loop reads the child's messages itself when its pipe is readable
    (`add_reader`) and merges them straight into the requests' streams; commands go to the child as they come
    (`_send`).
    """

    def __init__(self, core: EngineProcess, *, timing_sink: TimingSink | None = None,
                 stream_interval: float = 0.0) -> None:
        super().__init__(None, timing_sink=timing_sink, stream_interval=stream_interval)  # type: ignore[arg-type]
        self.core = core
        self._started = False
        self._fd = -1
        self._buf = bytearray()
        self._cmd_fd = -1
        self._backlog = bytearray()  # command bytes the pipe had no room for yet (written when it drains)

    # ----------------------------------------------------------------- lifecycle (loop thread)
    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        if self._started:
            raise RuntimeError("AsyncEngine already started")
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
            _frame(pickle.dumps([(_C_SHUTDOWN, None)], _PROTO)))
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

    # ----------------------------------------------------------------- requests (loop thread)
    def submit(self, requests: Sequence[EngineRequest], arrival: float | None = None) -> OutputStream:
        stream, arrival = self._register(requests, arrival)
        for r in requests:
            self._timings[r.request_id] = RequestTiming(arrival, len(r.prompt_token_ids))
        self._send([(_C_ADD, (r.request_id, r.prompt, r.prompt_token_ids, r.params)) for r in requests])
        return stream

    def abort(self, stream: OutputStream) -> None:
        rids = [rid for rid in stream.request_ids if self._streams.pop(rid, None) is not None]
        if rids:
            self._send([(_C_ABORT, rids)])

    def _send(self, commands: list[tuple[int, Any]]) -> None:
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
                    self._apply_message(*item)
            except Exception as exc:  # a message we cannot use: the engine can no longer be trusted
                logger.exception("bad message from the engine process")
                self._fail_dead(f"engine failure: {type(exc).__name__}: {exc}")

    def _fail_dead(self, message: str) -> None:
        err = EngineDeadError(message)
        logger.error("%s; the engine is stopped", err)
        self._remove_reader()
        self._on_dead(err)

    def _apply_message(self, num_steps: int, entries: list[tuple], rejected: list[tuple[str, str, bool]],
                       aborted: list[tuple[str, float, list[float] | None, int]], stats: Any) -> None:
        """One message of the child: merge its deltas into the streams, record the requests' timing."""
        self.steps += num_steps
        self._stats = stats
        if rejected:
            self._on_rejected([(rid, ValueError(message) if is_value_error else RuntimeError(message))
                               for rid, message, is_value_error in rejected])
        self._apply(entries, aborted)


class EngineInfo:
    """Stands in for the `LLMEngine` on the server side in process mode: its facts and its request check."""

    def __init__(self, limits: EngineLimits, tokenizer: Any) -> None:
        self.limits = limits
        self.tokenizer = tokenizer
        self.model_name = limits.model_name
        self.max_model_len = limits.max_model_len
        self.vocab_size = limits.vocab_size

    def validate_request(self, prompt_token_ids: list[int], params: Any) -> int:
        from hetero_infer.worker.engine import validate_request

        lim = self.limits
        return validate_request(prompt_token_ids, params, vocab_size=lim.vocab_size,
                                max_model_len=lim.max_model_len, block_size=lim.block_size,
                                num_blocks=lim.num_blocks)


def load_parent_tokenizer(config: EngineConfig) -> Any:
    """The server's own tokenizer, as the engine builds it (same folder, same generation EOS ids)."""
    from hetero_infer.worker.engine import _generation_eos_ids
    from hetero_infer.worker.model_loader import resolve_model
    from hetero_infer.worker.tokenizer import Tokenizer

    folder, _ = resolve_model(config.model)
    return Tokenizer.from_pretrained(folder, extra_eos_token_ids=_generation_eos_ids(folder))
