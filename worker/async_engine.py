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

from hetero_infer.worker.outputs import CompletionOutput, RequestOutput, take_entries
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
        self, request_id: str, prompt: str | None, prompt_token_ids: list[int], params: SamplingParams,
        *, delta: bool = False,
    ) -> None: ...
    def abort_request(self, request_id: str) -> None: ...
    def step_merged(self, pending: dict[str, list]) -> int: ...
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
    """The timing of one engine request (recorded on the event loop from the step times of its delta entries):
    times are `time.monotonic()`; `num_tokens` counts the tokens generated so far."""

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


class SampleState:
    """One sample (choice) of a request, accumulated from delta outputs. Reads like a `CompletionOutput`
    (`index`, `text`, `token_ids`, `logprobs`, `cumulative_logprob`, `finish_reason`, `stop_reason`), but is the
    live state: read it on the event loop before yielding to it, or take `output()`, a copy."""

    __slots__ = ("index", "token_ids", "_text", "_pieces", "logprobs", "cumulative_logprob", "finish_reason",
                 "stop_reason")

    def __init__(self, index: int) -> None:
        self.index = index
        self.token_ids: list[int] = []
        self._text = ""
        self._pieces: list[str] = []  # text deltas not yet joined into `_text`
        self.logprobs: list[dict[int, float]] | None = None
        self.cumulative_logprob: float | None = None
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None

    @property
    def text(self) -> str:
        if self._pieces:
            self._pieces.insert(0, self._text)
            self._text = "".join(self._pieces)
            self._pieces.clear()
        return self._text

    def add(self, token_ids: list[int], text: str, logprobs: list[dict[int, float]] | None,
            cumulative_logprob: float | None, finish_reason: str | None, stop_reason: int | str | None) -> None:
        if token_ids:
            self.token_ids += token_ids
        if text:
            self._pieces.append(text)
        if logprobs is not None:
            if self.logprobs is None:
                self.logprobs = list(logprobs)
            else:
                self.logprobs += logprobs
        self.cumulative_logprob = cumulative_logprob
        self.finish_reason = finish_reason
        self.stop_reason = stop_reason

    def output(self) -> CompletionOutput:
        return CompletionOutput(self.index, self.text, list(self.token_ids), self.cumulative_logprob,
                                None if self.logprobs is None else list(self.logprobs), self.finish_reason,
                                self.stop_reason)


class RequestState:
    """One engine request, accumulated from delta outputs. Reads like a `RequestOutput` (`request_id`,
    `outputs`, `finished`, ...) but is the live state (see `SampleState`); `output()` is a cumulative
    `RequestOutput` (a copy: later deltas do not change it)."""

    __slots__ = ("request_id", "prompt", "prompt_token_ids", "outputs", "finished", "error", "metrics")

    def __init__(self, request_id: str, prompt: str | None, prompt_token_ids: list[int]) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.outputs: list[SampleState] = []  # by sample index (they arrive in order)
        self.finished = False
        self.error: str | None = None
        self.metrics: dict[str, float] = {}

    def sample(self, index: int) -> SampleState:
        samples = self.outputs
        while len(samples) <= index:
            samples.append(SampleState(len(samples)))
        return samples[index]

    def output(self) -> RequestOutput:
        out = RequestOutput(self.request_id, self.prompt, self.prompt_token_ids, [s.output() for s in self.outputs],
                            self.finished, dict(self.metrics))
        out.error = self.error
        return out


class OutputStream:
    """Outputs of one or more engine requests, as seen by the event loop.

    The engine side hands over deltas (`AsyncEngine._apply_entries`); the stream accumulates them per request.
    `next()` returns the cumulative output of each request that progressed since the previous call (so a slow
    consumer receives coalesced updates); `next_states()` the same as live `RequestState`s, without copies.
    """

    __slots__ = ("request_ids", "_states", "_changed", "_waiter", "_error", "_unfinished")

    def __init__(self, requests: Sequence[EngineRequest]) -> None:
        self.request_ids = tuple(r.request_id for r in requests)
        self._states = {r.request_id: RequestState(r.request_id, r.prompt, r.prompt_token_ids) for r in requests}
        self._changed: dict[str, RequestState] = {}
        self._waiter: asyncio.Future[None] | None = None
        self._error: BaseException | None = None
        self._unfinished = set(self.request_ids)

    @property
    def done(self) -> bool:
        """Every request finished and everything taken: the next `next_states()` returns []."""
        return not self._unfinished and not self._changed and self._error is None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _changed_request(self, request_id: str, finished: bool) -> RequestState:
        """The state of a request that the caller is about to update (event-loop thread)."""
        state = self._states[request_id]
        self._changed[request_id] = state
        if finished:
            self._unfinished.discard(request_id)
        self._wake()
        return state

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        self._wake()

    async def next_states(self) -> list[RequestState]:
        """Wait for news; return the live state of every request that progressed since the last call.

        Returns [] once everything has finished; raises the stream's error if it failed.
        """
        while not self._changed:
            if self._error is not None:
                raise self._error
            if not self._unfinished:
                return []
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        changed = list(self._changed.values())
        self._changed.clear()
        return changed

    async def next(self) -> list[RequestOutput]:
        """As `next_states`, as cumulative `RequestOutput`s (copies)."""
        return [state.output() for state in await self.next_states()]


# ------------------------------------------------------------------------------------------- delta entries
# What the engine side hands the loop: merged delta outputs (`LLMEngine.step_merged`, `take_entries`; the format
# is described in hetero_infer.worker.outputs).


def record_entry(timing: RequestTiming, finished: bool, error: str | None, metrics: dict[str, float] | None,
                 samples: list[tuple], step_times: list[float]) -> str | None:
    """Per-request timing from a delta entry with step times (as `record_step` does per step): first
    scheduled, first token, the gap between every two output steps, tokens. Returns the finish reason when the
    entry ends the request (None while it runs); an error ends it at its last step."""
    if error:
        step_times = step_times[:-1]
    if step_times:
        last = timing.last_token
        if last is None:
            timing.first_token = step_times[0]
            scheduled = metrics.get("first_scheduled_time") if metrics else None
            timing.first_scheduled = step_times[0] if scheduled is None else scheduled
        else:
            timing.inter_token.append(step_times[0] - last)
        gaps = timing.inter_token
        for i in range(1, len(step_times)):
            gaps.append(step_times[i] - step_times[i - 1])
        timing.last_token = step_times[-1]
    for smp in samples:
        timing.num_tokens += len(smp[0])
    if error:
        return "error"
    return _reason_of({smp[4] for smp in samples}) if finished else None


_ADD = 0
_ABORT = 1


class AsyncEngine:
    """Runs an engine on its own thread and exposes it to asyncio code.

    `stream_interval` (seconds) bounds how often the engine thread wakes the event loop for running requests:
    the delta outputs of the steps in between are merged per request (`LLMEngine.step_merged`). With steps
    slower than the interval (any real model) every step is delivered at once; with very fast steps (the mock
    executor) the loop is woken at most every `stream_interval`, which keeps the serving overhead per token
    small. Requests that end are handed over at once: a client waits for the end of its request (and then
    sends the next one), not for more tokens.
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
        # What the engine thread hands the loop at each flush: (merged delta outputs of the steps since the
        # previous flush, with their step times, as `LLMEngine.step_merged` makes them; the requests aborted
        # meanwhile), guarded by _lock.
        self._lock = threading.Lock()
        self._handoff: list[tuple[dict[str, list], list[tuple[str, float, list[float] | None, int]]]] = []
        self._delivery_scheduled = False
        # Loop-side state (only touched on the event-loop thread).
        self._timings: dict[str, RequestTiming] = {}
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
            self._timings[r.request_id] = RequestTiming(arrival, len(r.prompt_token_ids))
            self._inbox.append((_ADD, r))
        self._wake.set()
        return stream

    def _register(self, requests: Sequence[EngineRequest], arrival: float | None) -> tuple[OutputStream, float]:
        """Check the engine is alive and the ids are new; map every id to one new stream."""
        if self._dead is not None:
            raise EngineDeadError(str(self._dead))
        stream = OutputStream(requests)
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
        monotonic = time.monotonic
        last_flush = 0.0
        # The deltas of the steps since the last flush, merged per request (the engine thread's own, until it
        # hands them over), and the requests aborted meanwhile.
        pending: dict[str, list] = {}
        aborted: list[tuple[str, float, list[float] | None, int]] = []

        def flush(ended_only: bool = False) -> None:
            """Hand everything over, or (`ended_only`) only the requests that ended."""
            nonlocal pending, aborted
            if ended_only:
                batch = {rid: pending.pop(rid) for rid in [rid for rid, e in pending.items() if e[0]]}
            else:
                batch, pending = pending, {}
            if not batch and not aborted:
                return
            with self._lock:
                self._handoff.append((batch, aborted))
                schedule = not self._delivery_scheduled
                self._delivery_scheduled = True
            aborted = []
            if schedule:
                loop.call_soon_threadsafe(self._deliver)

        try:
            while not self._stop:
                wake.clear()
                rejected: list[tuple[str, BaseException]] = []
                while inbox:
                    kind, item = inbox.popleft()
                    if kind == _ADD:
                        try:
                            engine.add_request(item.request_id, item.prompt, item.prompt_token_ids, item.params,
                                               delta=True)
                        except Exception as exc:  # a refused request must not stop the engine
                            rejected.append((item.request_id, exc))
                    else:
                        engine.abort_request(item)
                        # Deltas not handed over yet die with the request, unless it had finished (its last
                        # output stands, and the abort came too late to matter).
                        e = pending.get(item)
                        if e is None:
                            aborted.append((item, monotonic(), None, 0))
                        elif not e[0]:
                            del pending[item]
                            aborted.append((item, monotonic(), e[4], sum(len(smp[0]) for smp in e[3])))
                if rejected:
                    loop.call_soon_threadsafe(self._on_rejected, rejected)
                if not engine.has_unfinished_requests():
                    self._stats = engine.stats()
                    flush()
                    if not inbox:
                        wake.wait()
                    continue
                ended = engine.step_merged(pending)
                self.steps += 1
                self._stats = engine.stats()  # cheap counters; read by /metrics at scrape time
                now = monotonic()
                if now - last_flush >= self.stream_interval:
                    flush()
                    last_flush = now
                elif ended:  # requests that ended go out at once: their clients wait for the end, not for tokens
                    flush(ended_only=True)
        except BaseException as exc:  # the engine is broken: fail everything, turn unhealthy
            logger.exception("engine step failed; the engine is stopped")
            err = EngineDeadError(f"engine failure: {type(exc).__name__}: {exc}")
            try:
                loop.call_soon_threadsafe(self._on_dead, err)
            except RuntimeError:  # loop already closed
                pass

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
            handoff = self._handoff
            self._handoff = []
            self._delivery_scheduled = False
        for pending, aborted in handoff:
            self._apply(take_entries(pending), aborted)

    def _apply(self, entries: list[tuple], aborted: list[tuple[str, float, list[float] | None, int]]) -> None:
        """Hand delta entries to the requests' streams and record the requests' timing from their step times
        (`record_entry`); `aborted`: (request id, when, step times and number of tokens not handed over) of the
        requests the engine aborted while they ran."""
        self._apply_entries(entries)
        timings = self._timings
        for rid, finished, error, metrics, samples, step_times in entries:
            timing = timings.get(rid)
            if timing is not None:
                reason = record_entry(timing, finished, error, metrics, samples, step_times)
                if reason is not None:
                    self._end_timing(rid, step_times[-1] if step_times else time.monotonic(), reason)
        for rid, when, step_times, tokens in aborted:
            timing = timings.get(rid)
            if timing is not None:
                if step_times:
                    record_entry(timing, False, None, None, (), step_times)
                timing.num_tokens += tokens
                self._end_timing(rid, when, "abort")

    def _apply_entries(self, entries: list[tuple]) -> None:
        """Merge delta entries into the requests' streams (and end the streams of failed requests)."""
        streams = self._streams
        for rid, finished, error, metrics, samples, _ in entries:
            stream = streams.get(rid)
            if stream is None:  # aborted meanwhile
                continue
            if finished:
                del streams[rid]
                if error:
                    stream._fail(RequestFailedError(str(error)))
                    continue
            acc = stream._changed_request(rid, finished)
            for index, (ids, text, logprobs, cum_lp, finish_reason, stop_reason) in enumerate(samples):
                acc.sample(index).add(ids, text, logprobs, cum_lp, finish_reason, stop_reason)
            acc.finished = finished
            acc.error = error
            if metrics:
                acc.metrics = metrics

    def _on_rejected(self, rejected: list[tuple[str, BaseException]]) -> None:
        for rid, exc in rejected:
            self._timings.pop(rid, None)
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


def _reason_of(reasons: set[str | None]) -> str:
    """A request's finish reason from those of its samples."""
    if "error" in reasons:
        return "error"
    if "abort" in reasons:
        return "abort"
    if "length" in reasons:
        return "length"
    return "stop"
