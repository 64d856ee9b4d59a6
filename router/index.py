"""Which worker holds which prefix blocks: exact from the workers' block reports, else approximate.

A reporting worker's entry is what its reports say (confirmed blocks) plus what the router has sent it since
(pending blocks). A snapshot replaces the confirmed blocks, a delta applies on top only when it continues the
last report seen (same epoch, `since` equal to the last `seq`); anything else is refused and the caller asks for
a snapshot. A pending block is confirmed by the first report that holds it, and dropped by a report asked for
after its request ended that does not (the worker evicted it, or never cached it): between polls the router
sees what it just placed, at any request rate.

A worker that publishes KV events (router/kv_events.py) is kept by them instead (`apply_events`: each batch's net
change, as a delta; its reports then only move the cursor on, apart from the snapshot a resync takes). Both say
which tier holds a block: the device pool, or the host tier behind it (`host_blocks`, `host_match`).

A worker that does not report gets an approximate entry: the blocks the router sent it, least recently routed
dropped first beyond its capacity. Prompts the router could only hash as text chunks (no tokenizer, text
prompts) never match a report: their hashes get approximate entries of their own, for every worker, reporting or
not (`exact=False`). Capacities come from the worker's pool (`set_pool`, from its report), else
`approx_capacity`.

Confirmed blocks the router has routed are kept in recency order (each with the index's clock when it was last
routed), apart from those it never routed (generated tokens, another router's requests, what a worker held when
this router started): `eviction_cost` counts the latter as free room and tells how fresh the blocks are that a new
prefix would push out of a pool.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from hetero_infer.contracts.block_hashes import BlockReport
from hetero_infer.router.kv_events import TierChanges


@dataclass(eq=False)
class Route:
    """One request's blocks sent to one worker at `tick`; `ended`: the index's clock when the request ended."""

    worker: str
    tick: int
    ended: int | None = None


class PrefixIndex:
    def __init__(self, approx_capacity: int = 4096, text_chunks_per_block: float = 1.0) -> None:
        self.approx_capacity = approx_capacity
        self.text_chunks_per_block = text_chunks_per_block  # text chunks one KV block stands for
        self._blocks: dict[str, OrderedDict[int, int]] = {}  # worker -> hash -> clock routed, least recent first
        self._unrouted: dict[str, set[int]] = {}  # reporting worker -> reported blocks it was never routed
        self._pending: dict[str, OrderedDict[int, Route]] = {}  # reporting worker -> routed, not yet reported
        self._cursor: dict[str, tuple[str, int]] = {}  # reporting worker -> (epoch, seq) of its last report
        self._text: dict[str, OrderedDict[int, int]] = {}  # text-chunk hashes routed to each worker
        self._pool: dict[str, int] = {}  # worker -> KV blocks in its pool (from its report)
        self._host: dict[str, set[int]] = {}  # reporting worker -> blocks its host tier holds
        self._clock = itertools.count(1)

    def now(self) -> int:
        """A new tick of the index's clock (routes, request ends and polls are ordered by it)."""
        return next(self._clock)

    # -- exact: the workers' reports ----------------------------------------------------------
    def cursor(self, worker: str) -> tuple[str, int] | None:
        """(epoch, seq) to ask a reporting worker for a delta from; None: ask for a snapshot."""
        return self._cursor.get(worker)

    def set_pool(self, worker: str, num_blocks: int) -> None:
        self._pool[worker] = num_blocks

    def capacity(self, worker: str) -> int:
        """Blocks the worker's pool holds (its report's), else the approximate entries' capacity."""
        return self._pool.get(worker, self.approx_capacity)

    def apply(self, worker: str, report: BlockReport, asked: int | None = None, cursor_only: bool = False) -> bool:
        """Take a report in; False (nothing changed) when it does not continue the last one. `asked`: the clock
        (`now()`) when the report was asked for: pending blocks of requests that had ended before then and that
        the report does not hold are dropped. `cursor_only`: the worker's blocks come from its KV events, the
        report only moves the cursor on."""
        if not report.is_snapshot and self._cursor.get(worker) != (report.epoch, report.since):
            return False
        if not cursor_only:
            self._take(worker, report.added, report.removed, report.host_added, report.host_removed,
                       report.is_snapshot, asked)
        self._cursor[worker] = (report.epoch, report.seq)
        return True

    def resync(self, worker: str) -> None:
        """Take no more deltas from the worker: its next report must be a snapshot (its events, which kept the
        entry while its reports only moved the cursor on, have stopped)."""
        self._cursor.pop(worker, None)

    def apply_events(self, worker: str, changes: TierChanges, asked: int | None = None) -> None:
        """Take in the net change of one batch of the worker's KV events (router/kv_events.py); `asked` as for
        `apply` (the clock when the batch before it arrived)."""
        if changes.cleared:
            self._take(worker, (), (), (), (), True, None)
        self._take(worker, changes.added, changes.removed, changes.host_added, changes.host_removed, False, asked)

    def _take(self, worker: str, added: Sequence[int], removed: Sequence[int], host_added: Sequence[int],
              host_removed: Sequence[int], snapshot: bool, asked: int | None) -> None:
        blocks = self._blocks.setdefault(worker, OrderedDict())
        unrouted = self._unrouted.setdefault(worker, set())
        pending = self._pending.setdefault(worker, OrderedDict())
        host = self._host.setdefault(worker, set())
        if snapshot:
            held = set(added)
            for h in [h for h in blocks if h not in held]:
                del blocks[h]
            unrouted.intersection_update(held)
            added = [h for h in added if h not in blocks]
            host.clear()
        else:
            for h in removed:
                blocks.pop(h, None)
                unrouted.discard(h)
            host.difference_update(host_removed)
        host.update(host_added)
        for h in added:
            route = pending.pop(h, None)
            if h in blocks:
                continue
            if route is None:
                unrouted.add(h)
            else:  # routed recently: among the freshest (near enough to recency order)
                unrouted.discard(h)
                blocks[h] = route.tick
        for h, route in list(pending.items()):
            if h in blocks or h in unrouted or (asked is not None and route.ended is not None and route.ended < asked):
                del pending[h]

    # -- what was routed where ----------------------------------------------------------------
    def record_route(self, worker: str, hashes: Sequence[int], exact: bool = True) -> Route:
        """The router sent `hashes` to `worker`: pending for a reporting worker, remembered for one that does not
        report, and for every worker when they are text-chunk hashes (`exact` False). Call `ended` with the
        route when the request ends."""
        route = Route(worker, self.now())
        if not exact:
            self._touch(self._text.setdefault(worker, OrderedDict()), hashes, route.tick,
                        int(self.capacity(worker) * self.text_chunks_per_block))
        elif worker in self._unrouted:  # a reporting worker (block reports or KV events)
            blocks, unrouted = self._blocks[worker], self._unrouted[worker]
            pending = self._pending.setdefault(worker, OrderedDict())
            for h in hashes:
                if h in blocks or h in unrouted:
                    unrouted.discard(h)
                    blocks[h] = route.tick
                    blocks.move_to_end(h)
                else:
                    pending[h] = route
                    pending.move_to_end(h)
            while len(pending) > self.capacity(worker):
                pending.popitem(last=False)
        else:
            self._touch(self._blocks.setdefault(worker, OrderedDict()), hashes, route.tick, self.capacity(worker))
        return route

    def ended(self, route: Route) -> None:
        """The request of `route` ended: a report asked for from now on holds its blocks if the worker kept them."""
        route.ended = self.now()

    @staticmethod
    def _touch(entry: OrderedDict[int, int], hashes: Sequence[int], t: int, capacity: int) -> None:
        for h in hashes:
            entry[h] = t
            entry.move_to_end(h)
        while len(entry) > capacity:
            entry.popitem(last=False)

    # -- both ---------------------------------------------------------------------------------
    def drop(self, worker: str) -> None:
        """Forget a worker (it died or left): its cache is gone, and a restart reports a new epoch."""
        for entries in (self._blocks, self._unrouted, self._pending, self._cursor, self._text, self._pool, self._host):
            entries.pop(worker, None)

    def blocks(self, worker: str) -> frozenset[int]:
        """Its confirmed blocks (reported; routed, for a worker that does not report)."""
        return frozenset(self._blocks.get(worker, ())) | self._unrouted.get(worker, set())

    def host_blocks(self, worker: str) -> frozenset[int]:
        """The blocks its host tier holds (reported, or from its KV events)."""
        return frozenset(self._host.get(worker, ()))

    def pending(self, worker: str) -> frozenset[int]:
        return frozenset(self._pending.get(worker, ()))

    def count(self, worker: str) -> int:
        return len(self._blocks.get(worker, ())) + len(self._unrouted.get(worker, ()))

    def workers(self) -> list[str]:
        return sorted(w for w in self._blocks if self.count(w))

    def match(self, hashes: Sequence[int], workers: Iterable[str], exact: bool = True) -> dict[str, int]:
        """For each of `workers`, how many leading blocks of `hashes` (text-chunk hashes: `exact` False) it
        holds or has pending."""
        out = {}
        for w in workers:
            entries = [e for e in ((self._blocks.get(w), self._unrouted.get(w), self._pending.get(w)) if exact
                                   else (self._text.get(w),)) if e]
            n = 0
            if entries:
                for h in hashes:
                    if not any(h in e for e in entries):
                        break
                    n += 1
            out[w] = n
        return out

    def host_match(self, hashes: Sequence[int], matched: Mapping[str, int]) -> dict[str, int]:
        """For each worker of `matched` (its `match`: leading blocks on the device), how many blocks of `hashes` its
        host tier holds from there on: what the worker restores instead of computing (its prefix lookup continues
        in the tier where the pool's run ends)."""
        out = {}
        for w, n in matched.items():
            host, m = self._host.get(w), 0
            if host:
                for h in hashes[n:]:
                    if h not in host:
                        break
                    m += 1
            out[w] = m
        return out

    def eviction_cost(self, worker: str, n: int, exact: bool = True) -> int:
        """What placing `n` new blocks on the worker costs its cache, smaller is better: when they fit in its free
        room (blocks it never routed count as free), minus how many times they fit (free room fills evenly); else
        the clock at which the freshest of the routed blocks they displace (least recent first) was last routed
        (staler is cheaper to evict)."""
        if exact:
            entry = self._blocks.get(worker, OrderedDict())
            held = len(entry) + len(self._pending.get(worker, ()))
            capacity = self.capacity(worker)
        else:
            entry = self._text.get(worker, OrderedDict())
            held = len(entry)
            capacity = int(self.capacity(worker) * self.text_chunks_per_block)
        free = capacity - held
        if n <= free:
            return -(free // max(n, 1))
        evict = n - free
        if evict > len(entry):  # it would displace blocks in flight
            return self.now()
        return next(itertools.islice(entry.values(), evict - 1, None))
