"""The order of the host tier's copies on CUDA (runner/host_kv.py), as a plan of stream operations: pure, so that a
fake stream model can check it (tests/engine/test_tier_copies.py).

Three streams: the step's own (`COMPUTE`), one for saves (device -> host, `SAVE`) and one for restores (host ->
device, `RESTORE`), so the two directions use the GPU's two copy engines and overlap the forward:

- A save first gathers its device blocks into a device staging ring on the compute stream (a device-to-device
  copy, at HBM speed), after the earlier steps' writes into them; the save stream then copies the staging blocks
  to their pinned host slots. The step's forward may overwrite the evicted blocks right after the gather: it
  never waits for the transfer to the host (the step that evicts is never held by its copy). A staging block
  is reused only after the transfer that read it (the compute stream waits on that event, long past in a
  steady state). A host slot is written only after the restores that read its previous block: the save waits on
  the gather, on the compute stream, which waited on every earlier restore.
- A restore waits on the compute stream's work so far (the block it fills may still be read or written by an
  earlier step's kernels, or be gathered by a save of this step) and on the saves that wrote the host slots it
  reads (only those); the compute stream then waits on the restore before the forward reads the blocks. With
  `deferred` (the scheduler computes a restored request from the step after the one that restores its blocks)
  the wait moves to the start of the next step: this step's forward, which reads none of them, overlaps the
  transfer, and no step waits on a restore it does not need.

Nothing here blocks the host: waits are between streams (`wait_event`), never a synchronize.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

COMPUTE, SAVE, RESTORE = "compute", "save", "restore"


@dataclass(frozen=True)
class Op:
    """One operation on one stream: `wait` (args: an event), `record` (args: an event), `gather` (device blocks ->
    staging indices), `d2h` (staging indices -> host slots), `h2d` (host slots -> device blocks)."""

    stream: str
    kind: str
    args: tuple


class CopyPlanner:
    """Plans each step's copies against what earlier steps left in flight (module docstring). `new_event` makes an
    event object (a `torch.cuda.Event` on CUDA; anything in a test)."""

    def __init__(self, staging_blocks: int, new_event: Callable[[], Any]) -> None:
        if staging_blocks < 1:
            raise ValueError("the staging ring needs at least one block")
        self.staging_blocks = staging_blocks
        self.new_event = new_event
        self._next = 0  # the staging ring's next block
        self._staging_read: dict[int, Any] = {}  # staging block -> event after the transfer that last read it
        self._slot_written: dict[int, Any] = {}  # host slot -> event after the save that last wrote it
        self._restoring: Any = None  # a deferred restore's event: the next step waits on it first

    @property
    def pending(self) -> bool:
        """A deferred restore the next step must wait on (plan it even without copies of its own)."""
        return self._restoring is not None

    def plan(self, saves: list[tuple[int, int]], restores: list[tuple[int, int]], deferred: bool = False) -> list[Op]:
        """The operations for one step's `saves` (device block, host slot) and `restores` (host slot, device
        block), in the order they are issued; `deferred`: no sequence of this step reads the restored blocks (the
        next step waits on them)."""
        ops: list[Op] = []
        if self._restoring is not None:  # first: this step may read, gather or overwrite those blocks
            ops.append(Op(COMPUTE, "wait", (self._restoring,)))
            self._restoring = None
        for start in range(0, len(saves), self.staging_blocks):
            ops += self._save_chunk(saves[start:start + self.staging_blocks])
        if restores:
            ops += self._restore(restores, deferred)
        return ops

    def _save_chunk(self, saves: list[tuple[int, int]]) -> list[Op]:
        ops: list[Op] = []
        staging = [(self._next + i) % self.staging_blocks for i in range(len(saves))]
        self._next = (self._next + len(saves)) % self.staging_blocks
        ops += _waits(COMPUTE, (self._staging_read.get(i) for i in staging))
        ops.append(Op(COMPUTE, "gather", (tuple(b for b, _ in saves), tuple(staging))))
        gathered = self.new_event()
        ops.append(Op(COMPUTE, "record", (gathered,)))
        ops.append(Op(SAVE, "wait", (gathered,)))
        ops.append(Op(SAVE, "d2h", (tuple(staging), tuple(slot for _, slot in saves))))
        saved = self.new_event()
        ops.append(Op(SAVE, "record", (saved,)))
        for i in staging:
            self._staging_read[i] = saved
        for _, slot in saves:
            self._slot_written[slot] = saved
        return ops

    def _restore(self, restores: list[tuple[int, int]], deferred: bool) -> list[Op]:
        ops: list[Op] = []
        before = self.new_event()
        ops.append(Op(COMPUTE, "record", (before,)))
        ops.append(Op(RESTORE, "wait", (before,)))
        ops += _waits(RESTORE, (self._slot_written.get(slot) for slot, _ in restores))
        ops.append(Op(RESTORE, "h2d", (tuple(slot for slot, _ in restores), tuple(b for _, b in restores))))
        restored = self.new_event()
        ops.append(Op(RESTORE, "record", (restored,)))
        if deferred:
            self._restoring = restored
        else:
            ops.append(Op(COMPUTE, "wait", (restored,)))
        return ops


def _waits(stream: str, events: Any) -> list[Op]:
    """A wait per distinct event (None: nothing to wait for), in first-seen order."""
    seen: dict[int, Any] = {}
    for e in events:
        if e is not None and id(e) not in seen:
            seen[id(e)] = e
    return [Op(stream, "wait", (e,)) for e in seen.values()]
