"""Packed weights side by side in memory backed by transparent huge pages.

A decode step streams every weight from memory once. With 4 KiB pages the hardware prefetchers stop at
every page boundary and each page is another TLB miss; on 2 MiB pages the bfloat16 GEMM read a weight
from memory up to twice as fast at one row (the LM head 3.7x; docs/benchmarks.md, "The bfloat16 GEMM, weights
from memory").
A huge page per weight would round each up to 2 MiB (the default model's 121 linears: +90 MB), so
weights share chunks instead, in the order they are packed (a layer's projections next to each other).
Without transparent huge pages (or with THP off) the chunks are plain memory and nothing else changes.
"""

from __future__ import annotations

import math
import threading

import torch

from hetero_infer.kernels.cpu import native

CHUNK_BYTES = 32 << 20
MIN_BYTES = 64 << 10  # smaller weights take an ordinary allocation (tests make thousands of tiny ones)
_ALIGN = 64  # a cache line: panels start on a line, as an ordinary torch allocation does


class HugePageArena:
    """Bump allocation of tensors out of huge-page chunks. A chunk lives as long as any tensor in it."""

    def __init__(self, chunk_bytes: int = CHUNK_BYTES) -> None:
        self.chunk_bytes = chunk_bytes
        self._chunk: torch.Tensor | None = None
        self._used = 0
        self._lock = threading.Lock()

    def zeros(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        if nbytes < MIN_BYTES:
            return torch.zeros(shape, dtype=dtype)
        if nbytes > self.chunk_bytes // 2:  # a big weight (the LM head) gets pages of its own
            return native.empty_huge_pages(shape, dtype)
        with self._lock:
            if self._chunk is None or self._used + nbytes > self.chunk_bytes:
                self._chunk = native.empty_huge_pages((self.chunk_bytes,), torch.uint8)
                self._used = 0
            start = self._used
            self._used += -(-nbytes // _ALIGN) * _ALIGN
            return self._chunk[start : start + nbytes].view(dtype).view(shape)


ARENA = HugePageArena()
