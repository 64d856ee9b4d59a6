"""The engine core in its own process, so that the engine loop and the HTTP event loop do not share one GIL.

The child (`spawn` context, daemon) builds `LLMEngine(config)` and loops: it applies the commands of the parent
(add / abort / shutdown) — without blocking while it has work, blocking when idle —, runs `step()`, and sends
back per step only what is NEW: for each output the new token ids, new text and new logprobs entries of every
sample, its finish/stop reasons, error and metrics; plus the `EngineStats` snapshot and the step start/end
times (`time.monotonic()`, the same clock in both processes on Linux). Steps are batched into one message at
most every `stream_interval` seconds (and always when the engine turns idle), so a slow parent gets fewer,
bigger messages rather than a backlog.

The parent side is `ProcessAsyncEngine`: the `AsyncEngine` interface the server uses (submit / abort /
fail_all / stats / healthy / error / shutdown, `OutputStream`), with a receiver thread in place of the engine
thread. It rebuilds the cumulative `RequestOutput` of each request from the deltas and feeds the same
pending / flush / deliver machinery and timing recording, so consumers see what they see in thread mode.
If the child dies (crash, killed), the receiver sees end-of-file and the engine turns dead (/readyz red,
open requests fail with `EngineDeadError`).

The child never outlives the parent: it is a daemon process (terminated at the parent's exit), it asks the
kernel for SIGKILL when the parent dies (Linux PR_SET_PDEATHSIG) and it exits on end-of-file of the command
pipe or when its parent process id changes.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import pickle
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
)
from hetero_infer.worker.config import EngineConfig
from hetero_infer.worker.outputs import CompletionOutput, RequestOutput

logger = logging.getLogger("hetero_infer.engine_process")

_PROTO = pickle.HIGHEST_PROTOCOL  # 5 on the supported Pythons

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


def _child_main(config: EngineConfig, cmd_conn: Any, out_conn: Any, parent_pid: int, interval: float) -> None:
    _set_parent_death_signal()
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
    out_conn.send_bytes(pickle.dumps((_M_READY, (limits, engine.stats())), _PROTO))
    try:
        _child_loop(engine, cmd_conn, out_conn, parent_pid, interval)
    except (EOFError, BrokenPipeError, ConnectionResetError):  # the parent is gone
        return
    except BaseException as exc:
        logging.getLogger("hetero_infer.engine_process").exception("engine step failed; the engine is stopped")
        try:
            out_conn.send_bytes(pickle.dumps((_M_FATAL, f"engine failure: {type(exc).__name__}: {exc}"), _PROTO))
        except Exception:
            pass


class _Sent:
    """What the parent already has of one sample: lengths of tokens, text and logprobs."""

    __slots__ = ("tokens", "text_len", "logprobs")

    def __init__(self) -> None:
        self.tokens = 0
        self.text_len = 0
        self.logprobs = 0


def _child_loop(engine: Any, cmd_conn: Any, out_conn: Any, parent_pid: int, interval: float) -> None:
    loads, dumps = pickle.loads, pickle.dumps
    sent: dict[str, dict[int, _Sent]] = {}
    steps: list[tuple[float, float, list[tuple]]] = []
    rejected: list[tuple[str, str, bool]] = []
    aborted: list[str] = []
    last_send = 0.0
    dirty = False  # something happened since the last message (stats to refresh)

    def send() -> None:
        nonlocal steps, rejected, aborted, dirty
        out_conn.send_bytes(dumps((_M_BATCH, (steps, rejected, aborted, engine.stats())), _PROTO))
        steps, rejected, aborted = [], [], []
        dirty = False

    while True:
        busy = engine.has_unfinished_requests()
        if not busy:
            if dirty or steps or rejected or aborted:
                send()
            # Idle: block on the command pipe, checking now and then that the parent still lives.
            while not cmd_conn.poll(1.0):
                if os.getppid() != parent_pid:
                    return
        while cmd_conn.poll():
            kind, item = loads(cmd_conn.recv_bytes())
            dirty = True
            if kind == _C_ADD:
                rid, prompt, ids, params = item
                try:
                    engine.add_request(rid, prompt, ids, params)
                except Exception as exc:  # a refused request must not stop the engine
                    rejected.append((rid, str(exc), isinstance(exc, ValueError)))
            elif kind == _C_ABORT:
                for rid in item:
                    if rid in engine.requests:
                        engine.abort_request(rid)
                        aborted.append(rid)
                    sent.pop(rid, None)
            else:
                return
        if not engine.has_unfinished_requests():
            continue
        t0 = time.monotonic()
        outputs = engine.step()
        t1 = time.monotonic()
        if outputs:
            steps.append((t0, t1, [_delta(out, sent) for out in outputs]))
        if t1 - last_send >= interval and (steps or rejected or aborted):
            send()
            last_send = t1


def _delta(out: RequestOutput, sent: dict[str, dict[int, _Sent]]) -> tuple:
    per = sent.get(out.request_id)
    metrics = None
    if per is None:
        per = sent[out.request_id] = {}
        metrics = out.metrics
    samples = []
    for c in out.outputs:
        s = per.get(c.index)
        if s is None:
            s = per[c.index] = _Sent()
        new_ids = c.token_ids[s.tokens:]
        s.tokens = len(c.token_ids)
        # The engine's text only ever grows (the detokenizer emits prefixes of every later text); a shorter one
        # (never expected) is sent whole.
        text = c.text
        if len(text) >= s.text_len:
            new_text, reset = text[s.text_len:], False
        else:
            new_text, reset = text, True
        s.text_len = len(text)
        new_lp = None
        if c.logprobs is not None:
            new_lp = c.logprobs[s.logprobs:]
            s.logprobs = len(c.logprobs)
        samples.append((c.index, new_ids, new_text, reset, new_lp, c.cumulative_logprob, c.finish_reason,
                        c.stop_reason))
    if out.finished:
        sent.pop(out.request_id, None)
        metrics = out.metrics
    return (out.request_id, out.finished, out.error, metrics, samples)


# ============================================================================ parent
class EngineProcess:
    """The child process and its two pipes; `start()` spawns it, `wait_ready()` waits for its limits."""

    def __init__(self, config: EngineConfig, stream_interval: float = 0.0) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._cmd_recv, self.cmd_conn = ctx.Pipe(duplex=False)
        self.out_conn, self._out_send = ctx.Pipe(duplex=False)
        self.process = ctx.Process(
            target=_child_main, name="engine-core", daemon=True,
            args=(config, self._cmd_recv, self._out_send, os.getpid(), stream_interval))
        self.limits: EngineLimits | None = None
        self.initial_stats: Any = None
        self._send_lock = threading.Lock()

    def start(self) -> None:
        """Spawn the child (call this on the main thread: the parent-death signal follows the creating thread)."""
        self.process.start()
        self._cmd_recv.close()  # the child's ends: closed here, so that either side's death reads as EOF
        self._out_send.close()

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

    def send(self, kind: int, item: Any) -> None:
        data = pickle.dumps((kind, item), _PROTO)
        with self._send_lock:
            self.cmd_conn.send_bytes(data)

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the child to stop, then make sure it is gone (terminate, then kill)."""
        if self.process.is_alive():
            try:
                self.send(_C_SHUTDOWN, None)
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


class _Sample:
    __slots__ = ("index", "token_ids", "text", "logprobs", "cumulative_logprob", "finish_reason", "stop_reason")

    def __init__(self, index: int) -> None:
        self.index = index
        self.token_ids: list[int] = []
        self.text: list[str] = []  # pieces, joined when an output is built
        self.logprobs: list[dict[int, float]] | None = None
        self.cumulative_logprob: float | None = None
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None


class _Tracked:
    __slots__ = ("prompt", "prompt_token_ids", "samples", "order", "finished", "error", "metrics")

    def __init__(self, prompt: str | None, prompt_token_ids: list[int]) -> None:
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.samples: dict[int, _Sample] = {}
        self.order: list[_Sample] = []
        self.finished = False
        self.error: str | None = None
        self.metrics: dict[str, float] = {}


class ProcessAsyncEngine(AsyncEngine):
    """`AsyncEngine` whose engine runs in an `EngineProcess`; a receiver thread takes the engine thread's place."""

    def __init__(self, core: EngineProcess, *, timing_sink: TimingSink | None = None,
                 stream_interval: float = 0.0) -> None:
        super().__init__(None, timing_sink=timing_sink, stream_interval=stream_interval)  # type: ignore[arg-type]
        self.core = core
        self._tracked: dict[str, _Tracked] = {}  # written by the loop (submit), read/popped by the receiver

    # ----------------------------------------------------------------- lifecycle (loop thread)
    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        if self._thread is not None:
            raise RuntimeError("AsyncEngine already started")
        self._loop = loop or asyncio.get_running_loop()
        self._stats = self.core.initial_stats
        self._thread = threading.Thread(target=self._run, name="engine-receiver", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        self._stop = True
        self.core.stop(timeout)
        if self._thread is not None:
            self._thread.join(timeout)
        if self._dead is None:
            self._on_dead(EngineDeadError("the engine was shut down"))

    @property
    def healthy(self) -> bool:
        return super().healthy and self.core.process.is_alive()

    # ----------------------------------------------------------------- requests (loop thread)
    def submit(self, requests: Sequence[EngineRequest], arrival: float | None = None) -> OutputStream:
        stream, arrival = self._register(requests, arrival)
        for r in requests:
            self._tracked[r.request_id] = _Tracked(r.prompt, list(r.prompt_token_ids))
            self._timings[r.request_id] = RequestTiming(arrival, len(r.prompt_token_ids))
            try:
                self.core.send(_C_ADD, (r.request_id, r.prompt, r.prompt_token_ids, r.params))
            except OSError as exc:  # the child is gone; the receiver reports it
                raise EngineDeadError(f"the engine process is gone: {exc}") from None
        return stream

    def abort(self, stream: OutputStream) -> None:
        rids = [rid for rid in stream.request_ids if self._streams.pop(rid, None) is not None]
        if rids:
            try:
                self.core.send(_C_ABORT, rids)
            except OSError:
                pass

    # ----------------------------------------------------------------- receiver thread
    def _run(self) -> None:
        loop = self._loop
        assert loop is not None
        conn = self.core.out_conn
        loads = pickle.loads
        try:
            while not self._stop:
                try:
                    data = conn.recv_bytes()
                except (EOFError, OSError):
                    if self._stop:
                        return
                    self.core.process.join(2)
                    raise EngineDeadError(
                        f"engine failure: the engine process exited (exit code {self.core.process.exitcode})"
                    ) from None
                kind, item = loads(data)
                if kind == _M_FATAL:
                    raise EngineDeadError(item)
                steps, rejected, aborted, stats = item
                now = time.monotonic()
                for rid in aborted:
                    self._tracked.pop(rid, None)
                    self._end_timing(rid, now, "abort")
                if rejected:
                    errs: list[tuple[str, BaseException]] = []
                    for rid, message, is_value_error in rejected:
                        self._tracked.pop(rid, None)
                        self._timings.pop(rid, None)
                        errs.append((rid, ValueError(message) if is_value_error else RuntimeError(message)))
                    loop.call_soon_threadsafe(self._on_rejected, errs)
                touched: dict[str, _Tracked] = {}
                for t0, t1, deltas in steps:
                    self._apply(deltas, t0, t1, touched)
                    self.steps += 1
                if touched:
                    with self._lock:
                        pending = self._pending
                        for rid, t in touched.items():
                            pending[rid] = _build(rid, t)
                self._stats = stats
                self._flush(loop)
        except BaseException as exc:
            err = exc if isinstance(exc, EngineDeadError) else \
                EngineDeadError(f"engine failure: {type(exc).__name__}: {exc}")
            logger.error("%s; the engine is stopped", err)
            try:
                loop.call_soon_threadsafe(self._on_dead, err)
            except RuntimeError:  # loop already closed
                pass

    def _apply(self, deltas: list[tuple], step_start: float, step_end: float, touched: dict[str, _Tracked]) -> None:
        """Append the deltas of one step to the requests' state and record their timing (as `_record` does in
        thread mode); the outputs are built once per message, for the requests touched."""
        tracked = self._tracked
        timings = self._timings
        for rid, finished, error, metrics, samples in deltas:
            t = tracked.pop(rid, None) if finished else tracked.get(rid)
            if t is None:  # aborted meanwhile
                continue
            for index, new_ids, new_text, reset, new_lp, cum_lp, finish_reason, stop_reason in samples:
                s = t.samples.get(index)
                if s is None:
                    s = t.samples[index] = _Sample(index)
                    t.order.append(s)
                s.token_ids += new_ids
                if reset:
                    s.text = [new_text]
                elif new_text:
                    s.text.append(new_text)
                if new_lp is not None:
                    if s.logprobs is None:
                        s.logprobs = []
                    s.logprobs += new_lp
                s.cumulative_logprob = cum_lp
                s.finish_reason = finish_reason
                s.stop_reason = stop_reason
            if metrics is not None:
                t.metrics = metrics
            t.finished = finished
            t.error = error
            touched[rid] = t
            timing = timings.get(rid)
            if timing is None:
                continue
            if error:
                self._end_timing(rid, step_end, "error")
                continue
            if timing.last_token is None:
                timing.first_token = step_end
                scheduled = t.metrics.get("first_scheduled_time")
                timing.first_scheduled = step_start if scheduled is None else scheduled
            else:
                timing.inter_token.append(step_end - timing.last_token)
            timing.last_token = step_end
            if finished:
                timing.num_tokens = sum(len(s.token_ids) for s in t.order)
                self._end_timing(rid, step_end, _finish_reason_of(t))


def _build(rid: str, t: _Tracked) -> RequestOutput:
    outs = []
    for s in t.order:
        if len(s.text) > 1:
            s.text = ["".join(s.text)]
        outs.append(CompletionOutput(s.index, s.text[0] if s.text else "", list(s.token_ids), s.cumulative_logprob,
                                     list(s.logprobs) if s.logprobs is not None else None, s.finish_reason,
                                     s.stop_reason))
    out = RequestOutput(rid, t.prompt, t.prompt_token_ids, outs, t.finished, dict(t.metrics))
    out.error = t.error
    return out


def _finish_reason_of(t: _Tracked) -> str:
    reasons = {s.finish_reason for s in t.order}
    for r in ("error", "abort", "length"):
        if r in reasons:
            return r
    return "stop"


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
