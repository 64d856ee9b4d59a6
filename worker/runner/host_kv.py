"""The host tier's KV memory (`--kv-offloading-size`): the copies the block manager asks for (worker/core/
host_tier.py), made at the start of a step, before its forward: saves (device block -> host slot) first, then
restores (host slot -> device block). On CUDA the host memory is pinned and the copies are asynchronous on the
step's stream, so the step that evicts never waits for them, and the forward that reads a restored block runs
after its copy; on the CPU they are memory copies."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch

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
        log.info("host KV tier: %d blocks, %.2f GiB%s (pid %d)", num_blocks, self.cache.numel() *
                 self.cache.element_size() / 2**30, ", pinned" if pin else "", os.getpid())

    def move(self, device_cache: torch.Tensor, saves: list[tuple[int, int]],
             restores: list[tuple[int, int]]) -> None:
        """Saves (device block, host slot) first, then restores (host slot, device block)."""
        blocking = device_cache.device.type != "cuda"
        for block, slot in saves:
            self.cache[slot].copy_(device_cache[:, :, block], non_blocking=not blocking)
        for slot, block in restores:
            device_cache[:, :, block].copy_(self.cache[slot], non_blocking=not blocking)
        self.bytes_saved += len(saves) * self.block_bytes
        self.bytes_restored += len(restores) * self.block_bytes
