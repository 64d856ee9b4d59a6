"""Prefix-cache block hashes and the log of a worker's cached blocks: shared by the worker and the router.

A block is `block_size` consecutive token ids; only full blocks are hashed. Each hash covers its parent's hash
and its own tokens, so equal hashes mean equal prefixes. The hash is BLAKE2b-64 over fixed-width bytes, the same
in every process and Python version (Python's `hash()` of a tuple holding None is not: it changes per process on
3.11, so it cannot cross a process boundary). The worker's block manager keys its prefix cache by these hashes
and reports them; the router hashes prompts the same way and compares.

Blocks computed under a LoRA adapter hold other K/V than the base model's for the same tokens: their chain starts
from a root of the adapter's name (`chain_root`) instead of `ROOT`, so equal tokens under two adapters (or an
adapter and the base) never share a block, and under one adapter they do. The base model's hashes are unchanged.

`BlockLog` is the worker side of the block report (`GET /v1/cache/blocks?epoch=E&since=N`, docs/router.md): the
hashes the prefix cache gains and loses, answered as a delta since the router's last report when it can, else a
snapshot. `BlockReport` is one such answer, what the router's index takes in.

Torch-free and dependency-free: the router imports it without the engine.
"""

from __future__ import annotations

import hashlib
import struct
import uuid
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

HASH_NAME = "blake2b64-v1"  # named in the workers' block reports; a different name is not comparable
ROOT = b"\x00" * 8  # the parent of the first block
_blake2b = hashlib.blake2b
_packers: dict[int, struct.Struct] = {}


def blake2b64(parent: bytes, payload: bytes) -> bytes:
    """The 8-byte digest every chain here is built from."""
    return _blake2b(parent + payload, digest_size=8).digest()


def chain_root(adapter: str | None = None) -> bytes:
    """The parent of a chain's first block: `ROOT` for the base model, a hash of the LoRA adapter's name else."""
    return ROOT if adapter is None else blake2b64(ROOT, b"lora:" + adapter.encode())


def _pack(token_ids: Sequence[int]) -> bytes:
    n = len(token_ids)
    packer = _packers.get(n)
    if packer is None:
        packer = _packers[n] = struct.Struct(f"<{n}q")
    return packer.pack(*token_ids)


def chain_hash(parent: int | None, token_ids: Sequence[int], adapter: str | None = None) -> int:
    """The hash of one block of `token_ids` whose preceding block hashed to `parent` (None: the first block, of
    the base model or of LoRA adapter `adapter`)."""
    prefix = chain_root(adapter) if parent is None else parent.to_bytes(8, "little")
    return int.from_bytes(_blake2b(prefix + _pack(token_ids), digest_size=8).digest(), "little")


def extend_chain(hashes: list[int], token_ids: Sequence[int], block_size: int, num_blocks: int,
                 adapter: str | None = None) -> None:
    """Append to `hashes` (the chain of the leading blocks of `token_ids`, under LoRA adapter `adapter` or the
    base model) the hashes of its blocks up to `num_blocks`: `chain_hash` block by block, with the tokens packed
    once (hashing is on the engine's step)."""
    first = len(hashes)
    if num_blocks <= first:
        return
    data = _pack(token_ids[first * block_size : num_blocks * block_size])
    parent = chain_root(adapter) if not first else hashes[-1].to_bytes(8, "little")
    width = block_size * 8
    for off in range(0, len(data), width):
        parent = _blake2b(parent + data[off : off + width], digest_size=8).digest()
        hashes.append(int.from_bytes(parent, "little"))


def block_hashes(token_ids: Sequence[int], block_size: int, adapter: str | None = None) -> list[int]:
    """The chain hashes of every full block of `token_ids` (under LoRA adapter `adapter`, None: the base model)."""
    out: list[int] = []
    extend_chain(out, token_ids, block_size, len(token_ids) // block_size, adapter)
    return out


@dataclass(frozen=True)
class BlockReport:
    """One answer of a worker's `GET /v1/cache/blocks?epoch=E&since=N` (see docs/router.md).

    `epoch` changes whenever the worker's cache starts over (a restart). `since` None: a snapshot, `added` is
    every block held at `seq`. Otherwise a delta from `since` to `seq`: the net change, `added` and `removed`
    disjoint. `host_added` and `host_removed`: the same for the host tier behind the pool (--kv-offloading-size).
    """

    epoch: str
    seq: int
    since: int | None
    added: tuple[int, ...] = ()
    removed: tuple[int, ...] = ()
    host_added: tuple[int, ...] = ()
    host_removed: tuple[int, ...] = ()

    @property
    def is_snapshot(self) -> bool:
        return self.since is None


class BlockLog:
    """The hashes a worker's prefix cache holds (`present`) and its host tier holds (`host`), and the numbered
    events that changed them (the last `max_events`). `epoch` is new for every log (a worker's start), so a router
    never mixes two lives."""

    def __init__(self, max_events: int = 65536, epoch: str | None = None) -> None:
        self.epoch = epoch or uuid.uuid4().hex
        self.seq = 0
        self.present: set[int] = set()
        self.host: set[int] = set()
        self._events: deque[tuple[int, int, bool, bool]] = deque(maxlen=max_events)  # (seq, hash, added, host)

    def added(self, h: int, host: bool = False) -> None:
        held = self.host if host else self.present
        if h not in held:
            held.add(h)
            self._record(h, True, host)

    def removed(self, h: int, host: bool = False) -> None:
        held = self.host if host else self.present
        if h in held:
            held.discard(h)
            self._record(h, False, host)

    def apply(self, added: Iterable[int], removed: Iterable[int], host_added: Iterable[int] = (),
              host_removed: Iterable[int] = ()) -> None:
        """Take in a net change of the cache and of the host tier (disjoint sets: their order does not matter)."""
        for h in removed:
            self.removed(h)
        for h in added:
            self.added(h)
        for h in host_removed:
            self.removed(h, True)
        for h in host_added:
            self.added(h, True)

    def _record(self, h: int, added: bool, host: bool) -> None:
        self.seq += 1
        self._events.append((self.seq, h, added, host))

    def report(self, epoch: str | None = None, since: int | None = None) -> BlockReport:
        """The change since `since` in `epoch`, or a snapshot when that is not this epoch or the log no longer
        reaches back that far."""
        oldest = self._events[0][0] if self._events else self.seq + 1
        if epoch != self.epoch or since is None or since > self.seq or since < oldest - 1:
            return BlockReport(self.epoch, self.seq, None, tuple(sorted(self.present)),
                               host_added=tuple(sorted(self.host)))
        first: dict[tuple[int, bool], bool] = {}  # (hash, host) -> its first event after `since` was an add
        for seq, h, added, host in reversed(self._events):
            if seq <= since:
                break
            first[h, host] = added  # walking backwards: the last write is the first event
        changes = []
        for tier, held in ((False, self.present), (True, self.host)):
            changes.append(tuple(sorted(h for (h, t), was_add in first.items() if t == tier and was_add and h in held)))
            changes.append(tuple(sorted(h for (h, t), was_add in first.items()
                                        if t == tier and not was_add and h not in held)))
        return BlockReport(self.epoch, self.seq, since, *changes)

    def to_json(self, epoch: str | None, since: int | None, block_size: int) -> dict:
        r = self.report(epoch, since)
        return {"epoch": r.epoch, "seq": r.seq, "since": r.since, "added": list(r.added),
                "removed": list(r.removed), "host_added": list(r.host_added), "host_removed": list(r.host_removed),
                "block_size": block_size, "hash": HASH_NAME}
