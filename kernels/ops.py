"""Element-wise and row-wise layer primitives: RMSNorm (+ residual), rotary, SiLU-and-mul."""

from __future__ import annotations

import torch

from . import reference
from ._backend import FLOAT_DTYPES, check_out, check_same_device, check_tensor, use_triton

__all__ = ["rms_norm", "silu_and_mul", "rotary_embedding", "compute_cos_sin_cache", "compute_inv_freq"]

#: Widest row the Triton RMSNorm kernel keeps in registers.
MAX_RMS_NORM_DIM = 65536

compute_cos_sin_cache = reference.compute_cos_sin_cache
compute_inv_freq = reference.compute_inv_freq


def _rows(t: torch.Tensor) -> torch.Tensor:
    """A [rows, N] view of ``t`` (copying only if the leading dims cannot be merged)."""
    return t.reshape(-1, t.shape[-1])


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
    residual_out: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm over the last dimension, with an optional fused residual add.

    Args:
        x: ``[..., N]`` (usually ``[T, N]``); float32, float16 or bfloat16.
        weight: ``[N]`` (any float dtype).
        eps: added to the mean square.
        residual: optional, x's shape and dtype. Then the function returns
            ``(rms_norm(x + residual), x + residual)``, like vLLM's fused_add_rms_norm
            (but out of place).
        out / residual_out: optional outputs (x's shape and dtype).

    Computed in float32; the rounding matches Hugging Face's LlamaRMSNorm (see
    :func:`hetero_infer.kernels.reference.rms_norm`).
    """
    check_tensor("x", x, ndim=range(1, 9), dtypes=FLOAT_DTYPES, last_contiguous=True)
    check_tensor("weight", weight, ndim=1, dtypes=FLOAT_DTYPES)
    if weight.shape[0] != x.shape[-1]:
        raise ValueError(f"weight has {weight.shape[0]} elements for rows of {x.shape[-1]}")
    if residual is not None:
        check_tensor("residual", residual, dtypes=FLOAT_DTYPES, last_contiguous=True)
        if residual.shape != x.shape or residual.dtype != x.dtype:
            raise ValueError(
                f"residual must match x ({tuple(x.shape)}, {x.dtype}); got {tuple(residual.shape)}, {residual.dtype}"
            )
    elif residual_out is not None:
        raise ValueError("residual_out is only meaningful together with residual")
    device = check_same_device(x=x, weight=weight, residual=residual)
    check_out(out, x.shape, x.dtype, device)
    check_out(residual_out, x.shape, x.dtype, device, name="residual_out")
    if not use_triton(x, weight, residual):
        return reference.rms_norm(x, weight, eps, residual, out=out, residual_out=residual_out)
    if x.shape[-1] > MAX_RMS_NORM_DIM:
        raise ValueError(f"rows of {x.shape[-1]} > {MAX_RMS_NORM_DIM} are not supported by the Triton RMSNorm")
    from . import _triton_ops

    y = out if out is not None else torch.empty(x.shape, dtype=x.dtype, device=x.device)
    r = None
    if residual is not None:
        r = residual_out if residual_out is not None else torch.empty(x.shape, dtype=x.dtype, device=x.device)
    y2, r2 = _rows(y), (_rows(r) if r is not None else None)
    if (y2.numel() and y2.data_ptr() != y.data_ptr()) or (r is not None and r2.data_ptr() != r.data_ptr()):
        raise ValueError("out / residual_out must be viewable as [rows, N]")
    _triton_ops.rms_norm(_rows(x), weight, eps, _rows(residual) if residual is not None else None, y2, r2)
    return (y, r) if residual is not None else y


def silu_and_mul(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``silu(x[..., :I]) * x[..., I:]`` for ``x`` of shape ``[..., 2*I]`` -> ``[..., I]``.

    The gated MLP activation of Llama-family models (gate and up projections fused).
    Computed in float32, rounded once.
    """
    check_tensor("x", x, ndim=range(1, 9), dtypes=FLOAT_DTYPES, last_contiguous=True)
    if x.shape[-1] % 2:
        raise ValueError(f"the last dimension of x must be even (gate | up), got {x.shape[-1]}")
    shape = (*x.shape[:-1], x.shape[-1] // 2)
    check_out(out, shape, x.dtype, x.device)
    if not use_triton(x):
        return reference.silu_and_mul(x, out=out)
    from . import _triton_ops

    y = out if out is not None else torch.empty(shape, dtype=x.dtype, device=x.device)
    y2 = _rows(y)
    if y2.numel() and y2.data_ptr() != y.data_ptr():
        raise ValueError("out must be viewable as [rows, I]")
    _triton_ops.silu_and_mul(_rows(x), y2)
    return y


def rotary_embedding(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor | None,
    cos_sin_cache: torch.Tensor,
    inplace: bool = False,
    *,
    q_out: torch.Tensor | None = None,
    k_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Neox-style rotary position embedding (Llama, Mistral, Qwen).

    Args:
        positions: int32/int64 ``[T]`` (each < ``cos_sin_cache.shape[0]``).
        q: ``[T, H, D]``; k: ``[T, KVH, D]`` or None. Views with a contiguous last
            dimension are fine (e.g. slices of a fused QKV output).
        cos_sin_cache: ``[max_position, rot]`` with ``rot <= D`` even: cos of the
            ``rot/2`` frequencies, then their sin (see :func:`compute_cos_sin_cache`).
            Dimensions past ``rot`` pass through unchanged (partial rotary).
        inplace: rotate q and k in place and return them; otherwise return new tensors
            (or write into ``q_out`` / ``k_out``).

    The pair (x[i], x[i + rot/2]) is rotated by angle ``pos * inv_freq[i]``; computed in
    float32 and rounded once.
    """
    check_tensor("positions", positions, ndim=1, dtypes=(torch.int32, torch.int64))
    check_tensor("q", q, ndim=3, dtypes=FLOAT_DTYPES, last_contiguous=True)
    if k is not None:
        check_tensor("k", k, ndim=3, dtypes=FLOAT_DTYPES, last_contiguous=True)
        if k.shape[0] != q.shape[0] or k.shape[2] != q.shape[2]:
            raise ValueError(f"k {tuple(k.shape)} must be [T, KVH, D] with q's T and D ({tuple(q.shape)})")
    check_tensor("cos_sin_cache", cos_sin_cache, ndim=2, dtypes=FLOAT_DTYPES, last_contiguous=True)
    device = check_same_device(positions=positions, q=q, k=k, cos_sin_cache=cos_sin_cache)
    rot = cos_sin_cache.shape[1]
    if rot % 2 or rot == 0 or rot > q.shape[2]:
        raise ValueError(f"cos_sin_cache width {rot} must be even and <= head_dim {q.shape[2]}")
    if positions.shape[0] != q.shape[0]:
        raise ValueError(f"positions has {positions.shape[0]} entries for {q.shape[0]} tokens")
    if inplace and (q_out is not None or k_out is not None):
        raise ValueError("q_out / k_out cannot be combined with inplace=True")
    check_out(q_out, q.shape, q.dtype, device, name="q_out")
    if k is not None:
        check_out(k_out, k.shape, k.dtype, device, name="k_out")
    elif k_out is not None:
        raise ValueError("k_out given without k")
    if not use_triton(positions, q, k, cos_sin_cache):
        return reference.rotary_embedding(positions, q, k, cos_sin_cache, inplace, q_out=q_out, k_out=k_out)
    from . import _triton_ops

    if inplace:
        qo, ko = q, k
    else:
        partial = rot < q.shape[2]
        qo = q_out if q_out is not None else torch.empty(q.shape, dtype=q.dtype, device=device)
        ko = None
        if k is not None:
            ko = k_out if k_out is not None else torch.empty(k.shape, dtype=k.dtype, device=device)
        if partial:  # pass-through dims
            qo[..., rot:] = q[..., rot:]
            if k is not None:
                ko[..., rot:] = k[..., rot:]
    _triton_ops.rotary_embedding(positions, q, k, cos_sin_cache, qo, ko)
    return qo, ko
