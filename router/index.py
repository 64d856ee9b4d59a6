"""Which worker holds which prefix blocks: exact from the workers' block reports, else approximate.

A reporting worker's entry is exactly what its reports say: a snapshot replaces it, a delta applies on top only
when it continues the last report seen (same epoch, `since` equal to the last `seq`); anything else is refused
and the caller asks for a snapshot. A worker that does not report gets an approximate entry: the blocks the
router sent it, least recently routed dropped first beyond `approx_capacity` (its KV pool, in blocks).

Prompts the router could only hash as text chunks (no tokenizer, text prompts) never match a report: their
hashes get approximate entries of their own, for every worker, reporting or not (`exact=False`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

from hetero_infer.block_hashes import BlockReport


class PrefixIndex:
    def __init__(self, approx_capacity: int = 4096) -> None:
        self.approx_capacity = approx_capacity
        self._blocks: dict[str, OrderedDict[int, None]] = {}
        self._cursor: dict[str, tuple[str, int]] = {}  # reporting worker -> (epoch, seq) of its last report
        self._text: dict[str, OrderedDict[int, None]] = {}  # text-chunk hashes routed to each worker

    # -- exact: the workers' reports ----------------------------------------------------------
    def cursor(self, worker: str) -> tuple[str, int] | None:
        """(epoch, seq) to ask a reporting worker for a delta from; None: ask for a snapshot."""
        return self._cursor.get(worker)

    def apply(self, worker: str, report: BlockReport) -> bool:
        """Take a report in; False (nothing changed) when it does not continue the last one."""
        if report.is_snapshot:
            self._blocks[worker] = OrderedDict.fromkeys(report.added)
        else:
            if self._cursor.get(worker) != (report.epoch, report.since):
                return False
            blocks = self._blocks[worker]
            for h in report.removed:
                blocks.pop(h, None)
            for h in report.added:
                blocks[h] = None
        self._cursor[worker] = (report.epoch, report.seq)
        return True

    # -- approximate: what was routed where ---------------------------------------------------
    def record_route(self, worker: str, hashes: Sequence[int], exact: bool = True) -> None:
        """The router sent `hashes` to `worker`: remembered for a worker that does not report, and for every
        worker when they are text-chunk hashes (`exact` False)."""
        if (exact and worker in self._cursor) or not hashes:
            return
        blocks = (self._blocks if exact else self._text).setdefault(worker, OrderedDict())
        for h in hashes:
            blocks[h] = None
            blocks.move_to_end(h)
        while len(blocks) > self.approx_capacity:
            blocks.popitem(last=False)

    # -- both ---------------------------------------------------------------------------------
    def drop(self, worker: str) -> None:
        """Forget a worker (it died or left): its cache is gone, and a restart reports a new epoch."""
        self._blocks.pop(worker, None)
        self._cursor.pop(worker, None)
        self._text.pop(worker, None)

    def blocks(self, worker: str) -> frozenset[int]:
        return frozenset(self._blocks.get(worker, ()))

    def count(self, worker: str) -> int:
        return len(self._blocks.get(worker, ()))

    def workers(self) -> list[str]:
        return sorted(w for w, b in self._blocks.items() if b)

    def match(self, hashes: Sequence[int], workers: Iterable[str], exact: bool = True) -> dict[str, int]:
        """For each of `workers`, how many leading blocks of `hashes` (text-chunk hashes: `exact` False) it
        holds."""
        entries = self._blocks if exact else self._text
        out = {}
        for w in workers:
            blocks = entries.get(w)
            n = 0
            if blocks:
                for h in hashes:
                    if h not in blocks:
                        break
                    n += 1
            out[w] = n
        return out
