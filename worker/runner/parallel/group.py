"""A rank's view of its tensor-parallel group: rank, world size, and the two collectives the model needs (the
all-reduce after a row-parallel layer, the all-gather of the vocabulary-parallel logits), over a process group of
its own (gloo on the CPU, NCCL on CUDA) rather than torch.distributed's global default one: several engines may
live in one process (tests), each with its group.

The model reads the group it is built for from `building(tp)` (a context, as vLLM's parallel state, but scoped to
one construction): layers keep it, and with one rank (`SINGLE`) every collective is a no-op."""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class TensorParallel:
    rank: int = 0
    world_size: int = 1
    group: Any = None  # a torch ProcessGroup (ProcessGroupGloo / ProcessGroupNCCL); None with one rank
    # the start-up rendezvous before collectives that a slow rank's load would keep waiting (rank 0 watches the
    # other ranks' processes meanwhile: a rank that fails to load is an error at once, not a collective's timeout)
    arrive: Callable[[str], None] | None = None

    def rendezvous(self, stage: str) -> None:
        if self.arrive is not None:
            self.arrive(stage)

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum over the ranks of their partial `x`, in place (a row-parallel layer's output)."""
        if self.group is not None:
            self.group.allreduce([x]).wait()
        return x

    def all_gather_last(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's `x` concatenated along the last dimension in rank order (the logits' vocabulary slices)."""
        if self.group is None:
            return x
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        self.group.allgather([parts], [x]).wait()
        return torch.cat(parts, dim=-1)

    def min_int(self, value: int, device: torch.device | str = "cpu") -> int:
        """The smallest of the ranks' `value`s (what every rank's KV pool can hold)."""
        if self.group is None:
            return value
        t = torch.tensor([value], dtype=torch.long, device=device)
        opts = torch.distributed.AllreduceOptions()
        opts.reduceOp = torch.distributed.ReduceOp.MIN
        self.group.allreduce([t], opts).wait()
        return int(t.item())

    def part(self, size: int) -> int:
        """This rank's share of a dimension split evenly (heads, intermediate size); the checks refused the rest."""
        return size // self.world_size


SINGLE = TensorParallel()
_building: TensorParallel = SINGLE


def current() -> TensorParallel:
    """The group of the model being built (SINGLE outside `building`)."""
    return _building


@contextlib.contextmanager
def building(tp: TensorParallel) -> Iterator[None]:
    global _building
    previous, _building = _building, tp
    try:
        yield
    finally:
        _building = previous


def process_group(backend: str, store: Any, rank: int, world_size: int, timeout: datetime.timedelta,
                  device: torch.device | None = None) -> Any:
    import torch.distributed as dist

    if backend == "gloo":
        return dist.ProcessGroupGloo(store, rank, world_size, timeout)
    if backend == "nccl":
        if device is not None:  # the rank's GPU before its communicator: NCCL binds to the current device
            torch.cuda.set_device(device)
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        pg = dist.ProcessGroupNCCL(store, rank, world_size, options)
        if device is not None:  # the communicator on this rank's GPU, made now rather than inside a graph capture
            t = torch.zeros(1, device=device)
            pg.allreduce([t]).wait()
        return pg
    raise ValueError(f"unknown tensor-parallel backend {backend!r} (gloo or nccl)")
