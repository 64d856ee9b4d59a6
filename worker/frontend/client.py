"""The engine-client interface: what the server (and any other frontend: a router-side or test client) uses to
run requests on an engine, whether the engine runs on a thread of this process (`InprocEngineClient`) or in a
child process (`ProcessEngineClient`). Both drive the engine with the same busy loop
(`hetero_infer.worker.core.busy_loop`); this base class is their common loop-side half: it keeps one
`OutputStream` per submitted batch of requests, hands each engine hand-over (`EngineOutputs`) to the streams,
records the requests' timing and fails everything when the engine dies. Subclasses only move commands to the
loop (`_send`) and bring its outputs back (`_on_outputs`, called on the event loop).

Everything here runs on the event-loop thread.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from hetero_infer.contracts.block_hashes import BlockLog
from hetero_infer.contracts.lora import LoRARequest
from hetero_infer.worker.core.busy_loop import (
    ABORT,
    ADD,
    ADD_LORA,
    REMOVE_LORA,
    Command,
    EngineOutputs,
    EngineRequest,
)
from hetero_infer.worker.core.detokenizer import DeltaDetokenizer
from hetero_infer.worker.frontend.stream import OutputStream
from hetero_infer.worker.frontend.timing import RequestTiming, TimingSink, record_delta, record_steps
from hetero_infer.worker.structured.spec import GrammarSpec

logger = logging.getLogger("hetero_infer.engine_client")


class EngineDeadError(RuntimeError):
    """The engine loop has stopped (a step raised, the engine process died, or the engine was shut down)."""


class RequestFailedError(RuntimeError):
    """The engine finished a request with finish_reason "error" (an executor failure in its step)."""


class EngineClient(ABC):
    """submit / abort / fail_all / stats / healthy / error / shutdown, and an `OutputStream` per submission.

    `stream_interval` (seconds) bounds how often the busy loop hands outputs over for running requests: the
    deltas of the steps in between are merged per request. Requests that end are handed over at once."""

    def __init__(self, *, timing_sink: TimingSink | None = None, stream_interval: float = 0.0,
                 tokenizer: Any = None) -> None:
        self.timing_sink = timing_sink
        # the engine hands out token ids; their text is made here, on the event loop (in process mode: the API
        # process), while the engine runs its next steps. None: token ids only.
        self.detokenizer = DeltaDetokenizer(tokenizer)
        self.stream_interval = stream_interval
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timings: dict[str, RequestTiming] = {}
        self._streams: dict[str, OutputStream] = {}
        self._dead: BaseException | None = None
        self._stats: Any = None
        self.steps = 0
        self.block_log = BlockLog()  # the engine's prefix-cache hashes, for GET /v1/cache/blocks
        self._lora_waiters: dict[int, asyncio.Future[Any]] = {}  # add_lora / remove_lora calls, by token
        self._lora_tokens = itertools.count()
        # KV event batches the block log's state holds (None: the engine publishes none); before the first
        # hand-over the log is the empty cache, what the engine held before its first batch
        self.kv_events_seq: int | None = 0

    # ----------------------------------------------------------------- lifecycle
    @abstractmethod
    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Start serving (on the event loop that will read the streams)."""

    @abstractmethod
    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the engine loop (open requests fail with EngineDeadError)."""

    @property
    @abstractmethod
    def healthy(self) -> bool: ...

    @abstractmethod
    def _send(self, commands: list[Command]) -> None:
        """Hand commands to the busy loop, in order, without blocking."""

    @property
    def error(self) -> str | None:
        return None if self._dead is None else str(self._dead)

    @property
    def num_open_requests(self) -> int:
        """Engine requests submitted and not yet finished (as the loop sees them)."""
        return len(self._streams)

    def stats(self) -> Any:
        """The latest engine stats snapshot (taken by the busy loop at its latest hand-over)."""
        return self._stats

    # ----------------------------------------------------------------- requests
    def submit(self, requests: Sequence[EngineRequest], arrival: float | None = None) -> OutputStream:
        """Queue requests for the engine; their outputs arrive on the returned stream."""
        if self._dead is not None:
            raise EngineDeadError(str(self._dead))
        stream = OutputStream(requests)
        for r in requests:
            if r.request_id in self._streams:
                raise ValueError(f"duplicate request id {r.request_id!r}")
        arrival = time.monotonic() if arrival is None else arrival
        for r in requests:
            self._streams[r.request_id] = stream
            self._timings[r.request_id] = RequestTiming(arrival, len(r.prompt_token_ids), n=r.params.n,
                                                        max_tokens=r.max_tokens or r.params.max_tokens)
            self.detokenizer.add(r.request_id, r.prompt_token_ids, r.params)
        self._send([(ADD, r) for r in requests])
        return stream

    def abort(self, stream: OutputStream) -> None:
        """Abort every unfinished request of a stream; the engine frees their KV blocks at its next turn."""
        rids = [rid for rid in stream.request_ids if self._streams.pop(rid, None) is not None]
        for rid in rids:
            self.detokenizer.drop(rid)
        if rids:
            self._send([(ABORT, rids)])

    def fail_all(self, error: BaseException) -> None:
        """Abort every open request and fail its stream with `error` (used at the end of a drain)."""
        streams = {id(s): s for s in self._streams.values()}
        for stream in streams.values():
            self.abort(stream)
            stream._fail(error)

    @abstractmethod
    async def prepare_grammar(self, spec: GrammarSpec, deadline: float) -> None:
        """Have the engine compile a structured-output grammar off its stepping loop (the request is queued
        only once it is ready): ConstraintError if it does not compile, CompileTimeout if it was still queued at
        `deadline` (`time.monotonic()`); the caller bounds the wait itself."""

    # ----------------------------------------------------------------- LoRA adapters
    async def add_lora(self, lora_request: LoRARequest) -> None:
        """Have the engine read and check a LoRA adapter into host memory (between two steps; a no-op for one it
        holds already): LoRAAdapterError, and nothing changed, for a bad one."""
        await self._lora_command(ADD_LORA, lora_request)

    async def remove_lora(self, lora_name: str) -> bool:
        """Unload an adapter (False: the engine held none of that name); its running requests finish with it."""
        return await self._lora_command(REMOVE_LORA, lora_name)

    def list_loras(self) -> list[LoRARequest]:
        """The adapters the engine holds in host memory, as of its latest hand-over (fresh after an awaited
        add_lora / remove_lora)."""
        return list(getattr(self._stats, "loras", ()) or ())

    async def _lora_command(self, kind: int, arg: Any) -> Any:
        if self._dead is not None:
            raise EngineDeadError(str(self._dead))
        token = next(self._lora_tokens)
        waiter = self._lora_waiters[token] = asyncio.get_running_loop().create_future()
        try:
            self._send([(kind, (token, arg))])
            return await waiter
        finally:
            self._lora_waiters.pop(token, None)

    # ----------------------------------------------------------------- outputs (event loop)
    def _on_outputs(self, outputs: EngineOutputs) -> None:
        """One hand-over of the busy loop: streams, timing, stats."""
        self.steps += outputs.num_steps
        self._stats = outputs.stats
        for token, result in outputs.lora_results:
            waiter = self._lora_waiters.pop(token, None)
            if waiter is not None and not waiter.done():
                if isinstance(result, BaseException):
                    waiter.set_exception(result)
                else:
                    waiter.set_result(result)
        if any(outputs.cache_changes) or any(outputs.host_changes):
            self.block_log.apply(*outputs.cache_changes, *outputs.host_changes)
        self.kv_events_seq = outputs.kv_events_seq
        if outputs.rejected:
            self._on_rejected(outputs.rejected)
        streams = self._streams
        timings = self._timings
        fill_text = self.detokenizer.fill
        for delta in outputs.deltas:
            rid = delta.request_id
            stream = streams.get(rid)
            if stream is not None:  # else aborted meanwhile
                try:
                    fill_text(delta)
                except Exception as exc:  # this request's text only: the other deltas of the hand-over go on
                    self._on_text_error(stream, rid, exc)
                else:
                    if delta.finished:
                        del streams[rid]
                    if delta.error:
                        stream._fail(RequestFailedError(delta.error))
                    else:
                        stream._add(delta)
            timing = timings.get(rid)
            if timing is not None:
                reason = record_delta(timing, delta)
                if reason is not None:
                    self._end_timing(rid, delta.step_times[-1] if delta.step_times else time.monotonic(), reason)
        for a in outputs.aborted:
            timing = timings.get(a.request_id)
            if timing is not None:
                record_steps(timing, a.step_times, None, a.num_tokens)
                self._end_timing(a.request_id, a.when, "abort")

    def _end_timing(self, rid: str, now: float, reason: str) -> None:
        timing = self._timings.pop(rid, None)
        if timing is not None and self.timing_sink is not None:
            try:
                self.timing_sink.observe_request(timing, now, reason)
            except Exception:  # metrics must never break serving
                logger.exception("timing sink failed")

    def _on_text_error(self, stream: OutputStream, rid: str, exc: Exception) -> None:
        """A request whose text could not be made fails alone (its stream, and its siblings aborted in the engine,
        their KV blocks freed), as a failed step of its own would."""
        logger.error("could not make the text of request %s", rid, exc_info=exc)
        self.detokenizer.drop(rid)
        self.abort(stream)  # (a finished request is no longer in the engine: its abort is a no-op there)
        stream._fail(RequestFailedError(f"detokenization failed: {type(exc).__name__}: {exc}"))

    def _on_rejected(self, rejected: list[tuple[str, Exception]]) -> None:
        for rid, exc in rejected:
            self._timings.pop(rid, None)
            self.detokenizer.drop(rid)
            stream = self._streams.pop(rid, None)
            if stream is not None:
                self.abort(stream)  # its sibling requests (multi-prompt) are no longer wanted either
                stream._fail(exc)

    def _on_dead(self, error: BaseException) -> None:
        self._dead = error
        waiters, self._lora_waiters = self._lora_waiters, {}
        for waiter in waiters.values():
            if not waiter.done():
                waiter.set_exception(error)
        self.detokenizer = DeltaDetokenizer(self.detokenizer.tokenizer)
        for stream in list(self._streams.values()):
            stream._fail(error)
        self._streams.clear()
