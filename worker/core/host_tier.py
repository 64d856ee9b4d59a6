"""The host-memory tier behind the device's KV pool: which prefix blocks it holds, in which of its slots.

A block evicted from the device pool with a prefix hash is saved to a slot here (the executor copies it out
before the step that reuses the device block writes into it); a prefix lookup that misses on the device and hits
here restores the block into a fresh device block (copied in before the step reads it) instead of computing it
again. The tier keeps its own LRU and budget (`num_slots`): saving into a full tier drops its least recently
used block. It is inclusive: a restored block stays here too, so evicting it from the device again costs no copy.

Slots read by a restore of the current step are pinned until the step's copies are taken
(`BlockManager.take_block_moves`): a save in the same step never reuses them, so saves can be copied before
restores (a device block may be both the source of a save and the target of a restore in one step). Pure
bookkeeping: no tensors, no torch."""

from __future__ import annotations

from collections import OrderedDict


class HostTier:
    def __init__(self, num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError("the host tier needs at least one block slot")
        self.num_slots = num_slots
        self._slots: OrderedDict[int, int] = OrderedDict()  # hash -> slot, least recently used first
        self._free: list[int] = list(range(num_slots - 1, -1, -1))
        self._pinned: set[int] = set()
        self.queries = 0  # blocks looked up here after a device miss
        self.hits = 0  # blocks found here
        self.dropped: list[int] = []  # hashes dropped by the LRU since the last `take_dropped` (for KV events)

    def __contains__(self, h: int) -> bool:
        return h in self._slots

    def __len__(self) -> int:
        return len(self._slots)

    @property
    def usage(self) -> float:
        return len(self._slots) / self.num_slots

    def lookup(self, h: int) -> int | None:
        """The slot holding block hash `h` (now most recently used), or None."""
        slot = self._slots.get(h)
        if slot is not None:
            self._slots.move_to_end(h)
        return slot

    def pin(self, slot: int) -> None:
        """Keep `slot` from being reused until `unpin_all` (a restore of this step reads it)."""
        self._pinned.add(slot)

    def unpin_all(self) -> None:
        self._pinned.clear()

    def save(self, h: int) -> int | None:
        """A slot for block hash `h`, taken from the free slots or from the least recently used unpinned block;
        None if `h` is here already or every slot is pinned (the block is then simply not saved)."""
        if h in self._slots:
            self._slots.move_to_end(h)
            return None
        if self._free:
            slot = self._free.pop()
        else:
            victim = next((v for v, s in self._slots.items() if s not in self._pinned), None)
            if victim is None:
                return None
            slot = self._slots.pop(victim)
            self.dropped.append(victim)
        self._slots[h] = slot
        return slot

    def forget_slots(self, slots: set[int]) -> list[int]:
        """Free `slots` (their contents were never written); returns the hashes they held."""
        gone = [h for h, s in self._slots.items() if s in slots]
        for h in gone:
            self._free.append(self._slots.pop(h))
        return gone

    def take_dropped(self) -> list[int]:
        dropped, self.dropped = self.dropped, []
        return dropped

    def clear(self) -> list[int]:
        """Forget every block (all slots free again); returns the hashes it held."""
        held = list(self._slots)
        self._slots.clear()
        self._free = list(range(self.num_slots - 1, -1, -1))
        self._pinned.clear()
        return held
