"""The device slots of LoRA adapters (`max_loras`): which adapter each slot holds, least recently used first.

An executor asks `assign` for a step's adapters: those already in a slot stay there, the others take a free slot
or the least recently used one that this step does not need (the executor then copies their weights in). The
engine's scheduler never runs more distinct adapters in a step than there are slots, so a step always fits.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable


class SlotTable:
    def __init__(self, num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError("num_slots must be >= 1")
        self.num_slots = num_slots
        self._slots: OrderedDict[str, int] = OrderedDict()  # adapter -> slot, least recently used first
        self._free = list(range(num_slots - 1, -1, -1))

    def __contains__(self, name: str) -> bool:
        return name in self._slots

    @property
    def resident(self) -> list[str]:
        return list(self._slots)

    def assign(self, names: Iterable[str]) -> tuple[dict[str, int], list[tuple[str, int]]]:
        """(adapter -> slot for every adapter of the step, [(adapter, slot) to load]): a ValueError, and no change,
        where the step has more distinct adapters than slots."""
        wanted = list(dict.fromkeys(names))
        if len(wanted) > self.num_slots:
            raise ValueError(f"a step runs {len(wanted)} LoRA adapters; the device has {self.num_slots} slots "
                             "(max_loras)")
        slots = self._slots
        loads: list[tuple[str, int]] = []
        keep = set(wanted)
        for name in wanted:
            slot = slots.get(name)
            if slot is None:
                if self._free:
                    slot = self._free.pop()
                else:
                    victim = next(n for n in slots if n not in keep)
                    slot = slots.pop(victim)
                slots[name] = slot
                loads.append((name, slot))
            else:
                slots.move_to_end(name)
        return {name: slots[name] for name in wanted}, loads

    def drop(self, name: str) -> int | None:
        """Free the slot of `name` (its weights removed); the slot, or None where it held none."""
        slot = self._slots.pop(name, None)
        if slot is not None:
            self._free.append(slot)
        return slot
