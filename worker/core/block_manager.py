"""KV-cache block pool: reference counts, block tables, prefix caching and copy-on-write.

Blocks hold `block_size` tokens. A full block whose K/V are computed is registered under a
hash chained over its parent's hash and its token ids, so a later prompt with the same
prefix reuses it. Freed blocks keep their hash and sit in an LRU free list until a fresh
allocation evicts them (oldest first).

Hashes are `hetero_infer.contracts.block_hashes.chain_hash` (the same in every process), and the manager keeps the net
change of its cache's hashes since the last `take_cache_changes()`: what a worker reports to the router
(docs/router.md). At most one entry per hash, so it stays bounded (2 x blocks) when nobody takes it; the host
tier's hashes likewise (`take_host_changes()`).

With a host tier (`host_blocks` > 0, `--kv-offloading-size`; worker/core/host_tier.py), a cached block evicted
from the pool is saved there, and a prefix lookup continues there past the pool's last hit: such blocks are
restored into fresh blocks instead of computed. The moves are the executor's to copy at the start of the next
step, before its forward (`take_block_moves`: saves first, then restores).

The executor keeps its own copy of each sequence's block table: the manager notes where a table changed (a
sequence admitted, blocks appended, a block replaced by copy-on-write) and hands the changes over once a step
(`take_table_updates`), so a step carries only tables that changed. Freeing notes nothing: a sequence admitted
again is sent its whole table.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from hetero_infer.contracts import kv_events
from hetero_infer.contracts.block_hashes import extend_chain
from hetero_infer.worker.core.host_tier import HostTier
from hetero_infer.worker.core.sequence import Sequence


def _split(changes: dict[int, bool]) -> tuple[list[int], list[int]]:
    return [h for h, entered in changes.items() if entered], [h for h, entered in changes.items() if not entered]


@dataclass(frozen=True, slots=True)
class HostHit:
    """A prefix block found in the host tier: its slot there and its hash."""

    slot: int
    hash: int


@dataclass(slots=True)
class BlockMoves:
    """Copies between the pool and the host tier, for the executor to make before a step's forward: `saves`
    (device block -> host slot) first, then `restores` (host slot -> device block)."""

    saves: list[tuple[int, int]]
    restores: list[tuple[int, int]]

    def __bool__(self) -> bool:
        return bool(self.saves or self.restores)


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None
    lora_id: int | None = None  # the LoRA adapter its hash is keyed by (lora_int_id), for its KV events


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True,
                 host_blocks: int = 0, record_events: bool = False) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        if host_blocks < 0:
            raise ValueError("host_blocks must be >= 0")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_blocks: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.hash_to_block: dict[int, int] = {}
        self.pending_copies: list[tuple[int, int]] = []  # copy-on-write (src, dst) for the executor
        self._cache_changes: dict[int, bool] = {}  # hash -> entered (True) or left the cache since the last take
        self._host_changes: dict[int, bool] = {}  # the same for the host tier
        self.prefix_queries = 0  # tokens looked up in the prefix cache
        self.prefix_hits = 0  # tokens found there
        # the host tier: only blocks with a prefix hash go there, so none without prefix caching
        self.host = HostTier(host_blocks) if host_blocks and enable_prefix_caching else None
        self.host_queries = 0  # tokens looked up in the host tier after a pool miss
        self.host_hits = 0  # tokens restored from it
        self.blocks_saved = 0
        self.blocks_restored = 0
        self._saves: list[tuple[int, int]] = []
        self._restores: list[tuple[int, int]] = []
        self._table_changes: dict[int, tuple[Sequence, int]] = {}  # seq_id -> (seq, first table index changed)
        # KV events (contracts/kv_events.py) since the last `take_events`; None: not recorded
        self.events: list[kv_events.KVCacheEvent] | None = [kv_events.AllBlocksCleared()] if record_events else None

    # -- pool state -------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    @property
    def usage(self) -> float:
        return 1.0 - len(self.free_blocks) / self.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _take_free(self) -> int:
        block_id, _ = self.free_blocks.popitem(last=False)  # least recently freed first
        block = self.blocks[block_id]
        if block.hash is not None:
            if self.hash_to_block.get(block.hash) == block_id:
                del self.hash_to_block[block.hash]
                self._cache_change(block.hash, False)
                if self.events is not None:
                    self.events.append(kv_events.BlockRemoved([block.hash], kv_events.DEVICE_MEDIUM))
                if self.host is not None:
                    slot = self.host.save(block.hash)
                    dropped = self.host.take_dropped()
                    for h in dropped:
                        self._change(self._host_changes, h, False)
                    if self.events is not None and dropped:
                        self.events.append(kv_events.BlockRemoved(dropped, kv_events.HOST_MEDIUM))
                    if slot is not None:
                        self._saves.append((block_id, slot))
                        self.blocks_saved += 1
                        self._change(self._host_changes, block.hash, True)
                        if self.events is not None:
                            self.events.append(kv_events.BlockStored([block.hash], None, [], self.block_size,
                                                                     block.lora_id, kv_events.HOST_MEDIUM))
            block.hash = block.lora_id = None
        block.ref_count = 1
        return block_id

    def _incref(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self.free_blocks[block_id]
        block.ref_count += 1

    def _decref(self, block_id: int) -> None:
        block = self.blocks[block_id]
        block.ref_count -= 1
        assert block.ref_count >= 0, f"block {block_id} freed twice"
        if block.ref_count == 0:
            self.free_blocks[block_id] = None

    # -- prefix cache -----------------------------------------------------------------
    def _ensure_hashes(self, seq: Sequence, num_full_blocks: int) -> None:
        extend_chain(seq.block_hashes, seq.token_ids, self.block_size, num_full_blocks, seq.lora_name)

    def lookup_prefix(self, seq: Sequence) -> list[int | HostHit]:
        """Cached blocks for the longest prefix of `seq`: pool blocks (their ids), then blocks of the host tier
        (`HostHit`) where the pool's run ends; the newest token is always left to compute."""
        if not self.enable_prefix_caching:
            return []
        max_blocks = (seq.num_tokens - 1) // self.block_size
        self._ensure_hashes(seq, max_blocks)
        hits: list[int | HostHit] = []
        hashes = seq.block_hashes
        for h in hashes[:max_blocks]:
            block_id = self.hash_to_block.get(h)
            if block_id is None:
                break
            hits.append(block_id)
        if self.host is not None:
            for h in hashes[len(hits):max_blocks]:
                slot = self.host.lookup(h)
                if slot is None:
                    break
                hits.append(HostHit(slot, h))
        return hits

    def register_computed_blocks(self, seq: Sequence) -> None:
        """Offer the sequence's newly completed full blocks to the prefix cache."""
        if not self.enable_prefix_caching:
            return
        num_full = min(seq.num_computed_tokens // self.block_size, len(seq.block_table))
        if num_full <= seq.num_registered_blocks:
            return
        self._ensure_hashes(seq, num_full)
        first = seq.num_registered_blocks
        stored: list[int] = []
        for i in range(first, num_full):
            h = seq.block_hashes[i]
            block = self.blocks[seq.block_table[i]]
            if block.hash is None and h not in self.hash_to_block:
                block.hash, block.lora_id = h, seq.lora_id
                self.hash_to_block[h] = block.block_id
                self._cache_change(h, True)
                stored.append(i)
        seq.num_registered_blocks = num_full
        if self.events is not None and stored:
            self._stored_events(seq, stored)

    def _stored_events(self, seq: Sequence, indices: list[int]) -> None:
        """`BlockStored` events (device pool) for blocks `indices` of `seq`, one per run of consecutive blocks."""
        assert self.events is not None
        bs, hashes = self.block_size, seq.block_hashes
        start = prev = indices[0]
        for i in [*indices[1:], None]:
            if i is not None and i == prev + 1:
                prev = i
                continue
            self.events.append(kv_events.BlockStored(
                hashes[start:prev + 1], hashes[start - 1] if start else None,
                list(seq.token_ids[start * bs:(prev + 1) * bs]), bs, seq.lora_id, kv_events.DEVICE_MEDIUM))
            if i is not None:
                start = prev = i

    def _cache_change(self, h: int, entered: bool) -> None:
        self._change(self._cache_changes, h, entered)

    @staticmethod
    def _change(changes: dict[int, bool], h: int, entered: bool) -> None:
        # A hash enters and leaves alternately: a pending opposite change cancels out.
        if changes.pop(h, None) is None:
            changes[h] = entered

    def take_cache_changes(self) -> tuple[list[int], list[int]]:
        """(hashes that entered the prefix cache, hashes that left it) since the last call: a net change, the
        two disjoint."""
        changes, self._cache_changes = self._cache_changes, {}
        return _split(changes)

    def take_host_changes(self) -> tuple[list[int], list[int]]:
        """`take_cache_changes` for the host tier."""
        changes, self._host_changes = self._host_changes, {}
        return _split(changes)

    # -- allocation -------------------------------------------------------------------
    def can_admit(self, seq: Sequence, hits: list[int | HostHit], num_new_tokens: int) -> bool:
        """Whether `seq` (no blocks yet) can take `hits` from the cache plus blocks for its new tokens (a block
        restored from the host tier takes a fresh one)."""
        pool_hits = [b for b in hits if not isinstance(b, HostHit)]
        needed = self.blocks_for(len(hits) * self.block_size + num_new_tokens) - len(pool_hits)
        revived = sum(1 for b in pool_hits if self.blocks[b].ref_count == 0)
        return needed <= len(self.free_blocks) - revived

    def admit(self, seq: Sequence, hits: list[int | HostHit]) -> None:
        """Give a waiting sequence its cached prefix blocks; those of the host tier are restored into fresh blocks
        (copied in by the executor before the step that first reads them)."""
        assert not seq.block_table, "admit() takes a sequence without blocks"
        table: list[int] = []
        restored = [h for h in hits if isinstance(h, HostHit)]
        for block_id in hits[:len(hits) - len(restored)]:
            self._incref(block_id)  # type: ignore[arg-type]
            table.append(block_id)  # type: ignore[arg-type]
        if restored:
            assert self.host is not None
            for hit in restored:  # before any fresh block is taken: a save it causes must not reuse these slots
                self.host.pin(hit.slot)
            for hit in restored:
                block_id = self._take_free()
                self.blocks[block_id].hash, self.blocks[block_id].lora_id = hit.hash, seq.lora_id
                self.hash_to_block[hit.hash] = block_id
                self._cache_change(hit.hash, True)
                self._restores.append((hit.slot, block_id))
                self.blocks_restored += 1
                table.append(block_id)
        seq.block_table = table
        self._table_changed(seq, 0)
        if self.events is not None and restored:
            self._stored_events(seq, list(range(len(hits) - len(restored), len(hits))))
        seq.num_computed_tokens = seq.num_cached_tokens = len(hits) * self.block_size
        seq.num_registered_blocks = len(hits)
        self.prefix_queries += seq.num_tokens
        self.prefix_hits += (len(hits) - len(restored)) * self.block_size
        if self.host is not None:
            self.host_queries += seq.num_tokens - (len(hits) - len(restored)) * self.block_size
            self.host_hits += len(restored) * self.block_size

    def num_blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        """Fresh blocks `allocate_slots` would take, copy-on-write included."""
        needed = self.blocks_for(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        return max(needed, 0) + int(self._needs_cow(seq))

    def _needs_cow(self, seq: Sequence) -> bool:
        partial = seq.num_computed_tokens % self.block_size != 0
        return partial and self.blocks[seq.block_table[seq.num_computed_tokens // self.block_size]].ref_count > 1

    def allocate_slots(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Make room for the next `num_new_tokens` tokens of `seq`; False (and no change) if the pool is short."""
        computed = seq.num_computed_tokens
        if num_new_tokens == 1 and computed % self.block_size:  # the usual decode: its slot is in its last block
            table = seq.block_table
            index = computed // self.block_size
            if index == len(table) - 1 and self.blocks[table[index]].ref_count == 1:
                return True
        if self.num_blocks_needed(seq, num_new_tokens) > len(self.free_blocks):
            return False
        if self._needs_cow(seq):
            index = seq.num_computed_tokens // self.block_size
            src = seq.block_table[index]
            dst = self._take_free()
            self._decref(src)
            seq.block_table[index] = dst
            self.pending_copies.append((src, dst))
            self._table_changed(seq, index)
        table = seq.block_table
        more = self.blocks_for(seq.num_computed_tokens + num_new_tokens) - len(table)
        if more > 0:
            self._table_changed(seq, len(table))
            for _ in range(more):
                table.append(self._take_free())
        return True

    def _table_changed(self, seq: Sequence, index: int) -> None:
        prev = self._table_changes.get(seq.seq_id)
        if prev is None or index < prev[1]:
            self._table_changes[seq.seq_id] = (seq, index)

    def take_table_updates(self) -> dict[int, tuple[int, list[int]]]:
        """The block tables changed since the last call: seq_id -> (index, the table from there on), as the step
        contract's `block_table_updates` (copies)."""
        changes = self._table_changes
        if not changes:  # most decode steps
            return {}
        self._table_changes = {}
        return {seq_id: (index, seq.block_table[index:]) for seq_id, (seq, index) in changes.items()}

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Share all of the parent's blocks with a child sequence (copy-on-write on the first write)."""
        for block_id in parent.block_table:
            self._incref(block_id)
        child.block_table = list(parent.block_table)
        self._table_changed(child, 0)
        child.num_computed_tokens = parent.num_computed_tokens
        child.block_hashes = list(parent.block_hashes)
        child.num_registered_blocks = parent.num_registered_blocks

    def free(self, seq: Sequence) -> None:
        """Release all blocks of a sequence at once (tail first, so tails are evicted first)."""
        for block_id in reversed(seq.block_table):
            self._decref(block_id)
        seq.block_table = []
        seq.num_computed_tokens = 0
        seq.num_registered_blocks = 0

    def take_pending_copies(self) -> list[tuple[int, int]]:
        copies, self.pending_copies = self.pending_copies, []
        return copies

    def discard_moves(self, moves: BlockMoves) -> None:
        """A step whose copies may not have been made (it failed): the host slots it saved into and the blocks it
        restored into hold nothing anyone may find again."""
        if self.host is not None:
            dropped = self.host.forget_slots({slot for _, slot in moves.saves})
            for h in dropped:
                self._change(self._host_changes, h, False)
            if self.events is not None and dropped:
                self.events.append(kv_events.BlockRemoved(dropped, kv_events.HOST_MEDIUM))
        for _, block_id in moves.restores:
            block = self.blocks[block_id]
            if block.hash is not None and self.hash_to_block.get(block.hash) == block_id:
                del self.hash_to_block[block.hash]
                self._cache_change(block.hash, False)
                if self.events is not None:
                    self.events.append(kv_events.BlockRemoved([block.hash], kv_events.DEVICE_MEDIUM))
            block.hash = block.lora_id = None

    def take_events(self) -> list[kv_events.KVCacheEvent]:
        """The KV events since the last call, in order; [] when not recorded."""
        if self.events is None:
            return []
        events, self.events = self.events, []
        return events

    def take_block_moves(self) -> BlockMoves:
        """The saves to the host tier and restores from it since the last call (the next step's to copy)."""
        moves = BlockMoves(self._saves, self._restores)
        self._saves, self._restores = [], []
        if self.host is not None:
            self.host.unpin_all()
        return moves

    def slot_waste(self, seqs: list[Sequence]) -> tuple[int, int]:
        """(allocated slots, slots holding no token) over the given sequences' distinct blocks (a block shared by
        several sequences counts once, with the tokens of the first one that holds it)."""
        bs = self.block_size
        distinct: set[int] = set()
        used = 0
        for seq in seqs:
            n, table = seq.num_tokens, seq.block_table
            full = min(n // bs, len(table))
            fresh = set(table[:full]) - distinct  # a table's block ids are distinct: full blocks in one set operation
            used += bs * len(fresh)
            distinct |= fresh
            for i in range(full, len(table)):  # the partial last block, and blocks allocated ahead
                if table[i] not in distinct:
                    distinct.add(table[i])
                    used += min(bs, max(n - i * bs, 0))
        allocated = len(distinct) * bs
        return allocated, allocated - used
