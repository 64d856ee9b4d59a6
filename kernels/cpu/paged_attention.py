"""Paged decode attention for the CPU, in C: reads K/V straight from the block pool.

The PyTorch reference path must gather every sequence's blocks into a padded copy before
attention, which triples the KV bytes moved per step; on a CPU that copy costs as much as
the matmuls. This kernel (kernels/cpu/csrc/paged_attention.c, built by `native`) walks the
block table instead. Without a compiler, or with HETERO_INFER_CPU_KERNEL=0, the engine keeps
the PyTorch path.
"""

from __future__ import annotations

import ctypes

import torch

from hetero_infer.kernels.cpu import native

_P, _I, _F = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
_DECODE_ARGS = [_P] * 6 + [_I] * 6 + [_F]


def available() -> bool:
    return native.library() is not None


def variant() -> str:
    """Which implementation serves head dims 64 and 128 here: "avx512+bf16", "avx512" or "portable"."""
    fn = native.function("paged_decode_variant", [], ctypes.c_char_p)
    assert fn is not None, "call available() first"
    return fn().decode()


def paged_decode(
    q: torch.Tensor,  # [B, H, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, KVH, D]
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    context_lens: torch.Tensor,  # [B] int32
    scale: float,
) -> torch.Tensor:
    b, h, d = q.shape
    _, bs, kvh, _ = k_cache.shape
    qc = q.to(k_cache.dtype).contiguous()
    out = torch.empty_like(qc)
    tables = block_tables.contiguous()
    lens = context_lens.contiguous()
    fn = native.function("paged_decode_f32" if k_cache.dtype == torch.float32 else "paged_decode_bf16",
                             _DECODE_ARGS)
    assert fn is not None, "call available() first"
    fn(qc.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(), lens.data_ptr(), out.data_ptr(),
       b, h, kvh, d, bs, tables.shape[1], float(scale))
    return out.to(q.dtype)
