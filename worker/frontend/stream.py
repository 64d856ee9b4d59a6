"""`OutputStream`: the outputs of one or more engine requests, as the event loop sees them."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from hetero_infer.worker.core.busy_loop import EngineRequest
from hetero_infer.worker.core.outputs import OutputAccumulator, RequestDelta, RequestOutput


class OutputStream:
    """The engine client hands each request's deltas to its stream (`_add`); a consumer takes them with
    `next_deltas()` (what the server formats: everything new per request since its previous call, merged, so a
    slow consumer gets coalesced updates, never a backlog) or `next()` (cumulative `RequestOutput`s, for the
    Python API). Use one of the two per stream."""

    __slots__ = ("request_ids", "_requests", "_changed", "_waiter", "_error", "_unfinished", "_accumulators")

    def __init__(self, requests: Sequence[EngineRequest]) -> None:
        self.request_ids = tuple(r.request_id for r in requests)
        self._requests = {r.request_id: r for r in requests}
        self._changed: dict[str, RequestDelta] = {}
        self._waiter: asyncio.Future[None] | None = None
        self._error: BaseException | None = None
        self._unfinished = set(self.request_ids)
        self._accumulators: dict[str, OutputAccumulator] = {}

    @property
    def done(self) -> bool:
        """Every request finished and everything taken: the next `next_deltas()` returns []."""
        return not self._unfinished and not self._changed and self._error is None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _add(self, delta: RequestDelta) -> None:
        """A request's new delta (event-loop thread)."""
        rid = delta.request_id
        earlier = self._changed.get(rid)
        if earlier is None:
            self._changed[rid] = delta
        else:
            earlier.merge(delta)
        if delta.finished:
            self._unfinished.discard(rid)
        self._wake()

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        self._wake()

    async def next_deltas(self) -> list[RequestDelta]:
        """Wait for news; return, per request that progressed since the last call, what is new.

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
        """As `next_deltas`, as the cumulative output of each request that progressed (copies)."""
        outputs = []
        for delta in await self.next_deltas():
            acc = self._accumulators.get(delta.request_id)
            if acc is None:
                r = self._requests[delta.request_id]
                acc = self._accumulators[delta.request_id] = OutputAccumulator(r.request_id, r.prompt,
                                                                               r.prompt_token_ids)
            acc.add(delta)
            outputs.append(acc.output())
        return outputs
