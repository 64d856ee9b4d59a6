"""The worker side of the block report: a log of the hashes a worker's prefix cache gains and loses.

A worker calls `added(h)` when a block is registered in its prefix cache and `removed(h)` when it is evicted,
and answers `GET /v1/cache/blocks?epoch=E&since=N` with `report(E, N)`: a delta when it can, else a snapshot.
Kept here beside the index that reads it, so the two sides are tested together (tests/router/test_index.py).
"""

from __future__ import annotations

import uuid
from collections import deque

from hetero_infer.router.hashing import HASH_NAME
from hetero_infer.router.index import BlockReport


class BlockLog:
    def __init__(self, max_events: int = 65536, epoch: str | None = None) -> None:
        self.epoch = epoch or uuid.uuid4().hex
        self.seq = 0
        self.present: set[int] = set()
        self._events: deque[tuple[int, int, bool]] = deque(maxlen=max_events)  # (seq, hash, added)

    def added(self, h: int) -> None:
        if h not in self.present:
            self.present.add(h)
            self._record(h, True)

    def removed(self, h: int) -> None:
        if h in self.present:
            self.present.discard(h)
            self._record(h, False)

    def _record(self, h: int, added: bool) -> None:
        self.seq += 1
        self._events.append((self.seq, h, added))

    def report(self, epoch: str | None = None, since: int | None = None) -> BlockReport:
        """The change since `since` in `epoch`, or a snapshot when that is not this epoch or the log no longer
        reaches back that far."""
        oldest = self._events[0][0] if self._events else self.seq + 1
        if epoch != self.epoch or since is None or since > self.seq or since < oldest - 1:
            return BlockReport(self.epoch, self.seq, None, tuple(sorted(self.present)))
        first: dict[int, bool] = {}  # hash -> its first event after `since` was an add
        for seq, h, added in self._events:
            if seq > since and h not in first:
                first[h] = added
        added = tuple(sorted(h for h, was_add in first.items() if was_add and h in self.present))
        removed = tuple(sorted(h for h, was_add in first.items() if not was_add and h not in self.present))
        return BlockReport(self.epoch, self.seq, since, added, removed)

    def to_json(self, epoch: str | None, since: int | None, block_size: int) -> dict:
        r = self.report(epoch, since)
        return {"epoch": r.epoch, "seq": r.seq, "since": r.since, "added": list(r.added),
                "removed": list(r.removed), "block_size": block_size, "hash": HASH_NAME}
