"""The engine thread: one background thread owns the `LLMEngine`; asyncio code talks to it through an inbox.

The event loop never runs engine code. It puts add/abort commands into a thread-safe inbox; the engine
thread applies them between steps, runs `step()` while there is work (and sleeps on an event when there is
none), records per-request timing, and hands outputs back to the loop: it keeps the latest output of each
request in a pending map and wakes the loop with one `call_soon_threadsafe` for everything pending (at most
every `stream_interval` seconds). Outputs are cumulative, so whoever falls behind simply sees the latest state
of its requests (coalesced), never a backlog.

If `step()` itself raises, the engine is considered broken: every open request fails with
`EngineDeadError`, `healthy` turns False (the server's /readyz goes red) and new requests are refused.
Per-request failures reported by the engine (finish_reason "error") only end the requests concerned.

`hetero_infer.worker.engine_process.ProcessAsyncEngine` is the same interface with the engine in its own
process (the server's default): a receiver thread takes this engine thread's place.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from hetero_infer.worker.outputs import RequestOutput
from hetero_infer.worker.sampling_params import SamplingParams

logger = logging.getLogger("hetero_infer.async_engine")

class EngineDeadError(RuntimeError):
    """The engine loop has stopped (a step raised, or the engine was shut down)."""


class RequestFailedError(RuntimeError):
    """The engine finished a request with finish_reason "error" (an executor failure in its step)."""


class RequestRejectedError(ValueError):
    """The engine refused a request in `add_request` (bad prompt or parameters)."""


class EngineLike(Protocol):
    def add_request(
        self, request_id: str, prompt: str | None, prompt_token_ids: list[int], params: SamplingParams
    ) -> None: ...
    def abort_request(self, request_id: str) -> None: ...
    def step(self) -> list[RequestOutput]: ...
    def has_unfinished_requests(self) -> bool: ...
    def stats(self) -> Any: ...


@dataclass(slots=True)
class EngineRequest:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams


@dataclass(slots=True)
class RequestTiming:
    """One engine request as the engine thread saw it: times are `time.monotonic()`; `num_tokens` is set
    when it finishes."""

    arrival: float
    prompt_tokens: int
    first_scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    num_tokens: int = 0
    inter_token: list[float] = field(default_factory=list)


class TimingSink(Protocol):
    """Receives the timing of each request when it ends (finished, failed or aborted)."""

    def observe_request(self, timing: RequestTiming, finished_at: float, finish_reason: str) -> None: ...


class OutputStream:
    """Cumulative outputs of one or more engine requests, as seen by the event loop.

    Only the latest output of each request is kept, so a slow consumer receives coalesced updates.
    """

    __slots__ = ("request_ids", "_latest", "_event", "_error", "_unfinished")

    def __init__(self, request_ids: Sequence[str]) -> None:
        self.request_ids = tuple(request_ids)
        self._latest: dict[str, RequestOutput] = {}
        self._event = asyncio.Event()
        self._error: BaseException | None = None
        self._unfinished = set(request_ids)

    def _put(self, output: RequestOutput) -> None:
        self._latest[output.request_id] = output
        if output.finished:
            self._unfinished.discard(output.request_id)
        self._event.set()

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        self._event.set()

    async def next(self) -> list[RequestOutput]:
        """Wait for news; return the latest output of every request that progressed since the last call.

        Returns [] once everything has finished; raises the stream's error if it failed.
        """
        while not self._latest:
            if self._error is not None:
                raise self._error
            if not self._unfinished:
                return []
            self._event.clear()
            await self._event.wait()
        latest = list(self._latest.values())
        self._latest.clear()
        return latest


_ADD = 0
_ABORT = 1


class AsyncEngine:
    """Runs an engine on its own thread and exposes it to asyncio code.

    `stream_interval` (seconds) bounds how often the engine thread wakes the event loop: outputs of the
    steps in between are coalesced (outputs are cumulative, the latest wins). With steps slower than the
    interval (any real model) every step is delivered at once; with very fast steps (the mock executor)
    the loop is woken at most every `stream_interval`, which keeps the serving overhead per token small.
    """

    def __init__(self, engine: EngineLike, *, timing_sink: TimingSink | None = None,
                 stream_interval: float = 0.0) -> None:
        self.engine = engine
        self.timing_sink = timing_sink
        self.stream_interval = stream_interval
        self._inbox: deque[tuple[int, Any]] = deque()
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # Outputs waiting for the loop (engine thread writes, loop takes), guarded by _lock.
        self._lock = threading.Lock()
        self._pending: dict[str, RequestOutput] = {}
        self._delivery_scheduled = False
        # Engine-thread state.
        self._timings: dict[str, RequestTiming] = {}
        # Loop-side state (only touched on the event-loop thread).
        self._streams: dict[str, OutputStream] = {}
        self._dead: BaseException | None = None
        # Written by the engine thread, read anywhere (a reference swap is atomic).
        self._stats: Any = None
        self.steps = 0

    # ----------------------------------------------------------------- lifecycle (loop thread)
    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        if self._thread is not None:
            raise RuntimeError("AsyncEngine already started")
        self._loop = loop or asyncio.get_running_loop()
        self._stats = self.engine.stats()
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the engine thread (open requests fail with EngineDeadError)."""
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._dead is None:
            self._on_dead(EngineDeadError("the engine was shut down"))

    @property
    def healthy(self) -> bool:
        return self._dead is None and self._thread is not None and self._thread.is_alive()

    @property
    def error(self) -> str | None:
        return None if self._dead is None else str(self._dead)

    @property
    def num_open_requests(self) -> int:
        """Engine requests submitted and not yet finished (as the loop sees them)."""
        return len(self._streams)

    def stats(self) -> Any:
        """The latest engine stats snapshot (taken on the engine thread)."""
        return self._stats

    # ----------------------------------------------------------------- requests (loop thread)
    def submit(self, requests: Sequence[EngineRequest], arrival: float | None = None) -> OutputStream:
        """Queue requests for the engine; their outputs arrive on the returned stream."""
        stream, arrival = self._register(requests, arrival)
        for r in requests:
            self._inbox.append((_ADD, (r, arrival)))
        self._wake.set()
        return stream

    def _register(self, requests: Sequence[EngineRequest], arrival: float | None) -> tuple[OutputStream, float]:
        """Check the engine is alive and the ids are new; map every id to one new stream."""
        if self._dead is not None:
            raise EngineDeadError(str(self._dead))
        stream = OutputStream([r.request_id for r in requests])
        for r in requests:
            if r.request_id in self._streams:
                raise ValueError(f"duplicate request id {r.request_id!r}")
        for r in requests:
            self._streams[r.request_id] = stream
        return stream, time.monotonic() if arrival is None else arrival

    def abort(self, stream: OutputStream) -> None:
        """Abort every unfinished request of a stream; the engine frees their KV blocks at its next turn."""
        aborted = False
        for rid in stream.request_ids:
            if self._streams.pop(rid, None) is None:
                continue
            self._inbox.append((_ABORT, rid))
            aborted = True
        if aborted:
            self._wake.set()

    def fail_all(self, error: BaseException) -> None:
        """Abort every open request and fail its stream with `error` (used at the end of a drain)."""
        streams = {id(s): s for s in self._streams.values()}
        for stream in streams.values():
            self.abort(stream)
            stream._fail(error)

    # ----------------------------------------------------------------- engine thread
    def _run(self) -> None:
        engine = self.engine
        inbox = self._inbox
        wake = self._wake
        loop = self._loop
        assert loop is not None
        last_flush = 0.0
        try:
            while not self._stop:
                wake.clear()
                rejected: list[tuple[str, BaseException]] = []
                while inbox:
                    kind, item = inbox.popleft()
                    if kind == _ADD:
                        request, arrival = item
                        try:
                            engine.add_request(request.request_id, request.prompt, request.prompt_token_ids,
                                               request.params)
                        except Exception as exc:  # a refused request must not stop the engine
                            rejected.append((request.request_id, exc))
                        else:
                            self._timings[request.request_id] = RequestTiming(arrival, len(request.prompt_token_ids))
                    else:
                        engine.abort_request(item)
                        self._end_timing(item, time.monotonic(), "abort")
                if rejected:
                    loop.call_soon_threadsafe(self._on_rejected, rejected)
                if not engine.has_unfinished_requests():
                    self._stats = engine.stats()
                    self._flush(loop)
                    if not inbox:
                        wake.wait()
                    continue
                t0 = time.monotonic()
                outputs = engine.step()
                t1 = time.monotonic()
                self.steps += 1
                self._stats = engine.stats()  # cheap counters; read by /metrics at scrape time
                if outputs:
                    self._record(outputs, t0, t1)
                    with self._lock:
                        for out in outputs:
                            self._pending[out.request_id] = out
                    if t1 - last_flush >= self.stream_interval:
                        self._flush(loop)
                        last_flush = t1
        except BaseException as exc:  # the engine is broken: fail everything, turn unhealthy
            logger.exception("engine step failed; the engine is stopped")
            err = EngineDeadError(f"engine failure: {type(exc).__name__}: {exc}")
            try:
                loop.call_soon_threadsafe(self._on_dead, err)
            except RuntimeError:  # loop already closed
                pass

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wake the loop for the pending outputs (once: the loop takes everything pending when it runs)."""
        with self._lock:
            if not self._pending or self._delivery_scheduled:
                return
            self._delivery_scheduled = True
        loop.call_soon_threadsafe(self._deliver)

    def _record(self, outputs: list[RequestOutput], step_start: float, step_end: float) -> None:
        """Per-request timing (engine thread): first scheduled, first token, gaps between output steps."""
        timings = self._timings
        for out in outputs:
            timing = timings.get(out.request_id)
            if timing is None:
                continue
            if out.error:
                self._end_timing(out.request_id, step_end, "error")
                continue
            # The engine returns an output for a request only when the step gave it new tokens.
            if timing.last_token is None:
                timing.first_token = step_end
                scheduled = out.metrics.get("first_scheduled_time") if out.metrics else None
                timing.first_scheduled = step_start if scheduled is None else scheduled
            else:
                timing.inter_token.append(step_end - timing.last_token)
            timing.last_token = step_end
            if out.finished:
                timing.num_tokens = sum(len(c.token_ids) for c in out.outputs)
                self._end_timing(out.request_id, step_end, _finish_reason(out))

    def _end_timing(self, rid: str, now: float, reason: str) -> None:
        timing = self._timings.pop(rid, None)
        if timing is not None and self.timing_sink is not None:
            try:
                self.timing_sink.observe_request(timing, now, reason)
            except Exception:  # metrics must never break serving
                logger.exception("timing sink failed")

    # ----------------------------------------------------------------- callbacks (loop thread)
    def _deliver(self) -> None:
        with self._lock:
            batch = self._pending
            self._pending = {}
            self._delivery_scheduled = False
        streams = self._streams
        for rid, out in batch.items():
            stream = streams.get(rid)
            if stream is None:  # aborted meanwhile
                continue
            if out.finished:
                del streams[rid]
                if out.error:
                    stream._fail(RequestFailedError(str(out.error)))
                    continue
            stream._put(out)

    def _on_rejected(self, rejected: list[tuple[str, BaseException]]) -> None:
        for rid, exc in rejected:
            stream = self._streams.pop(rid, None)
            if stream is not None:
                # Its sibling requests (multi-prompt) are no longer wanted either.
                self.abort(stream)
                wrapped = RequestRejectedError(str(exc)) if isinstance(exc, ValueError) else exc
                stream._fail(wrapped)

    def _on_dead(self, error: BaseException) -> None:
        self._dead = error
        for stream in list(self._streams.values()):
            stream._fail(error)
        self._streams.clear()
        self._inbox.clear()


def _finish_reason(out: RequestOutput) -> str:
    reasons = {c.finish_reason for c in out.outputs}
    if "error" in reasons:
        return "error"
    if "abort" in reasons:
        return "abort"
    if "length" in reasons:
        return "length"
    return "stop"

