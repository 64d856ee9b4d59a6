"""Fused decoder-layer ops on the CPU (kernels/cpu/csrc/ops.c): one C call and one pass over the data where the
PyTorch expressions they replace take several ops (and as many Python dispatches) each.

Each function computes exactly what its PyTorch expression in the reference backend
(`attention/torch_backend.py`) computes, in the same dtype (float32 or bfloat16), with float32 arithmetic
and the same rounding points; the tests compare them. `available(dtype)` says whether they can run (the library built, a supported dtype).
"""

from __future__ import annotations

import ctypes

import torch

from hetero_infer.kernels.cpu import native

_P, _I, _L, _F = ctypes.c_void_p, ctypes.c_int, ctypes.c_long, ctypes.c_float
_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}
_SIGNATURES = {
    "add_rms_norm": [_P, _P, _P, _P, _I, _I, _F],
    "rope_and_cache": [_P, _L, _P, _L, _P, _L, _P, _P, _P, _P, _P, _P, _I, _I, _I, _I],
    "silu_and_mul": [_P, _P, _I, _I],
}


def available(dtype: torch.dtype) -> bool:
    return dtype in _SUFFIX and native.library() is not None


def _fn(name: str, dtype: torch.dtype):
    fn = native.function(f"{name}_{_SUFFIX[dtype]}", _SIGNATURES[name])
    assert fn is not None, "the CPU kernel library is not available"
    return fn


def add_rms_norm(x: torch.Tensor | None, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`residual += x` (in place, when x is given), then RMSNorm(residual) as transformers computes it.

    x, residual: [T, N] contiguous, same dtype as weight [N]. Returns a new [T, N] tensor.
    """
    assert residual.is_contiguous() and (x is None or (x.is_contiguous() and x.shape == residual.shape))
    rows, n = residual.shape
    out = torch.empty_like(residual)
    _fn("add_rms_norm", residual.dtype)(None if x is None else x.data_ptr(), residual.data_ptr(),
                                        weight.data_ptr(), out.data_ptr(), rows, n, eps)
    return out


def rope_and_cache(
    q: torch.Tensor,  # [T, H, D], rows may be strided (a view into the fused qkv output)
    k: torch.Tensor,  # [T, KVH, D]
    v: torch.Tensor,  # [T, KVH, D]
    positions: torch.Tensor,  # [T] int64
    cos: torch.Tensor,  # [max_positions, D], same dtype as q
    sin: torch.Tensor,
    k_cache: torch.Tensor,  # [num_blocks, block_size, KVH, D]
    v_cache: torch.Tensor,
    slots: torch.Tensor,  # [T] int64; negative = do not write
) -> None:
    """Neox rotary embedding of q and k in place, then k and v written to their cache slots."""
    t, h, d = q.shape
    kvh = k.shape[1]
    for x in (q, k, v):
        assert x.stride(2) == 1 and x.stride(1) == d and x.dtype == q.dtype, "heads must be contiguous rows of D"
    assert d % 2 == 0 and d <= 512 and cos.dtype == q.dtype and cos.is_contiguous() and sin.is_contiguous()
    assert positions.dtype == torch.int64 and slots.dtype == torch.int64
    _fn("rope_and_cache", q.dtype)(
        q.data_ptr(), q.stride(0), k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0),
        positions.contiguous().data_ptr(), cos.data_ptr(), sin.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
        slots.contiguous().data_ptr(), t, h, kvh, d,
    )


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for gate_up = [gate | up] of shape [T, 2N]; returns [T, N]."""
    assert gate_up.is_contiguous() and gate_up.shape[-1] % 2 == 0
    rows, n = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(rows, n, dtype=gate_up.dtype)
    _fn("silu_and_mul", gate_up.dtype)(gate_up.data_ptr(), out.data_ptr(), rows, n)
    return out
