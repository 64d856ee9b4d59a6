"""The host tier's KV memory (`--kv-offloading-size`): the copies the block manager asks for (worker/core/
host_tier.py), made at the start of a step, before its forward: saves (device block -> host slot) first, then
restores (host slot -> device block). On the CPU they are memory copies, in that order. On CUDA the host memory
is pinned and the copies run on their own streams (`CudaCopies`, ordered by runner/tier_copies.py): a save is
gathered into a device staging ring on the step's stream and copied to the host behind it, so the step that
evicts never waits for the transfer; a restore runs on its own stream and the forward waits only on it; the host
thread never waits on either."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch

from hetero_infer.worker.runner.tier_copies import COMPUTE, RESTORE, SAVE, CopyPlanner

log = logging.getLogger(__name__)


def host_memory_available() -> int | None:
    """Bytes this process may still take: the cgroup's limit less its usage where there is one (a pod's memory
    limit), else the kernel's MemAvailable; None where neither can be read."""
    limits = []
    cgroup = Path("/sys/fs/cgroup")
    try:
        limit = (cgroup / "memory.max").read_text().strip()
        if limit != "max":
            limits.append(int(limit) - int((cgroup / "memory.current").read_text()))
    except (OSError, ValueError):
        pass
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                limits.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    return min(limits) if limits else None


def host_tier_blocks(size_gib: float, block_bytes: int, available: int | None = None) -> int:
    """Blocks of `block_bytes` in a tier of `size_gib`; ValueError if it cannot hold one, or is larger than the
    host memory this process may still take (`available`, measured when None)."""
    if size_gib <= 0:
        return 0
    want = int(size_gib * 2**30)
    blocks = want // block_bytes
    if blocks < 1:
        raise ValueError(f"kv_offloading_size={size_gib} GiB holds no KV block (one takes {block_bytes} bytes)")
    available = host_memory_available() if available is None else available
    if available is not None and want > available:
        raise ValueError(f"kv_offloading_size={size_gib} GiB is more than the host memory left to this process "
                         f"({available / 2**30:.2f} GiB, the pod's memory limit or the machine's available memory): "
                         "lower it or give the worker more memory")
    return blocks


class HostKV:
    """`num_blocks` KV blocks in host memory, block-major: each slot is one contiguous run of what a device block
    holds (layers, K/V, tokens, heads, head size), so a copy to or from the pinned memory is one transfer."""

    def __init__(self, device_cache: torch.Tensor, num_blocks: int) -> None:
        shape = (num_blocks, *device_cache.shape[:2], *device_cache.shape[3:])
        pin = device_cache.device.type == "cuda"
        self.cache = torch.empty(shape, dtype=device_cache.dtype, pin_memory=pin)
        self.num_blocks = num_blocks
        self.block_bytes = self.cache[0].numel() * self.cache.element_size()
        self.bytes_saved = 0
        self.bytes_restored = 0
        self.cuda = CudaCopies(self, device_cache) if pin and torch.cuda.is_available() else None
        log.info("host KV tier: %d blocks, %.2f GiB%s (pid %d)", num_blocks, self.cache.numel() *
                 self.cache.element_size() / 2**30, ", pinned" if pin else "", os.getpid())

    def move(self, device_cache: torch.Tensor, saves: list[tuple[int, int]],
             restores: list[tuple[int, int]], deferred: bool = False) -> None:
        """Saves (device block, host slot) first, then restores (host slot, device block). `deferred`: no
        sequence of this step reads the restored blocks (CUDA: the next step waits on them instead)."""
        if self.cuda is not None:
            self.cuda.move(device_cache, saves, restores, deferred)
        else:
            for block, slot in saves:
                self.cache[slot].copy_(device_cache[:, :, block])
            for slot, block in restores:
                device_cache[:, :, block].copy_(self.cache[slot])
        self.bytes_saved += len(saves) * self.block_bytes
        self.bytes_restored += len(restores) * self.block_bytes


# The device staging ring for saves: at most this many bytes, and an eighth of the pool (a step that evicts more
# than the ring holds waits for the transfer of its first chunks before gathering the next).
STAGING_BYTES = 256 * 2**20


class CudaCopies:
    """The tier's copies on their own CUDA streams, in the order `CopyPlanner` gives (runner/tier_copies.py)."""

    def __init__(self, host: HostKV, device_cache: torch.Tensor) -> None:
        device = device_cache.device
        self.host = host
        blocks = max(1, min(device_cache.shape[2] // 8, STAGING_BYTES // host.block_bytes))
        self.staging = torch.empty((blocks, *host.cache.shape[1:]), dtype=device_cache.dtype, device=device)
        self.streams = {SAVE: torch.cuda.Stream(device), RESTORE: torch.cuda.Stream(device)}
        self.planner = CopyPlanner(blocks, torch.cuda.Event)
        self.device = device

    def move(self, device_cache: torch.Tensor, saves: list[tuple[int, int]],
             restores: list[tuple[int, int]], deferred: bool = False) -> None:
        streams = {COMPUTE: torch.cuda.current_stream(self.device), **self.streams}
        host, staging = self.host.cache, self.staging
        if not (saves or restores or self.planner.pending):
            return
        for op in self.planner.plan(saves, restores, deferred):
            stream = streams[op.stream]
            if op.kind == "wait":
                stream.wait_event(op.args[0])
            elif op.kind == "record":
                op.args[0].record(stream)
            else:
                with torch.cuda.stream(stream):
                    if op.kind == "gather":
                        for block, i in zip(*op.args):
                            staging[i].copy_(device_cache[:, :, block])
                    elif op.kind == "d2h":
                        for i, slot in zip(*op.args):
                            host[slot].copy_(staging[i], non_blocking=True)
                    else:  # h2d
                        for slot, block in zip(*op.args):
                            device_cache[:, :, block].copy_(host[slot], non_blocking=True)
