"""Weight-only quantization: INT8 per-channel and INT4 group-wise, and the matmuls that
dequantize inside the kernel (W8A16, W4A16).

Formats (weights are ``[N, K]``: N output features, K input features, like
``torch.nn.Linear.weight``):

* INT8: ``qweight`` int8 ``[N, K]`` in [-127, 127], ``scales`` float32 ``[N]``;
  ``w ~= qweight * scales[:, None]`` (symmetric).
* INT4: ``packed`` uint8 ``[N, K/2]``, ``scales`` float32 ``[N, K/G]``, ``zeros`` uint8
  ``[N, K/G]`` in [0, 15]; ``w ~= (q - zero) * scale`` per group of G consecutive
  columns (asymmetric, the range widened to include 0). Within each group, byte ``i``
  holds column ``i`` (low nibble) and column ``i + G/2`` (high nibble).

Quantizing and dequantizing are one-off weight transformations done with PyTorch
operations on whatever device the weight lives on; the matmuls are Triton kernels on the
GPU and the PyTorch reference elsewhere.

How the integers are chosen is free within the format (the kernels only dequantize):

* round to nearest over each group's min/max range (the default);
* ``clip_search=True`` (INT4): each group's range ``[min, max]`` is shrunk at either end
  by the factors, among ``CLIP_SHRINKS``, with the least squared reconstruction error (the
  clip search of AWQ, over both ends as llama.cpp's ``make_qkx`` searches scale and
  minimum); min/max is one of the candidates, so the error never grows;
* ``hessian=H`` (``[K, K]``, the mean of ``x x^T`` over calibration inputs of the layer):
  GPTQ (Frantar et al., 2022) with "act order" and static groups: the columns are rounded
  one at a time, most active input first, and each rounding error is compensated on the
  columns not yet rounded through the inverse Hessian, which minimises the error of the
  layer's outputs ``||x W^T - x Wq^T||`` rather than of the weights. Scales and zeros are
  fixed before that (from the original weights; with ``clip_search``, weighted by
  ``diag(H)``), so the result is an ordinary INT8 / INT4 tensor.
"""

from __future__ import annotations

import torch

from . import reference
from ._backend import FLOAT_DTYPES, check_out, check_same_device, check_tensor, use_triton

__all__ = [
    "CLIP_SHRINKS",
    "quantize_int8",
    "dequantize_int8",
    "quantize_int4",
    "int4_group_params",
    "dequantize_int4",
    "unpack_int4",
    "int8_matmul",
    "int4_matmul",
    "INT4_GROUP_SIZES",
]

#: Group sizes the INT4 format and kernel support.
INT4_GROUP_SIZES = (32, 64, 128, 256)

#: Shrink factors the INT4 clip search tries for each end of a group's range (1.0: the min/max range).
CLIP_SHRINKS = tuple(1.0 - i / 20 for i in range(11))  # 1.0, 0.95, ..., 0.5


def _check_weight(w: torch.Tensor) -> None:
    check_tensor("w", w, ndim=2, dtypes=FLOAT_DTYPES)
    if w.shape[0] == 0 or w.shape[1] == 0:
        raise ValueError(f"w must be non-empty, got shape {tuple(w.shape)}")
    if not bool(torch.isfinite(w).all()):
        raise ValueError("w contains inf or NaN")


def quantize_int8(
    w: torch.Tensor, *, hessian: torch.Tensor | None = None, damp: float = 0.01
) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel INT8 quantization of ``w [N, K]``.

    Returns ``(qweight int8 [N, K], scales float32 [N])``; ``scales = amax / 127`` per row.
    With ``hessian`` (``[K, K]``) the integers come from GPTQ instead of rounding to nearest
    (see the module docstring; ``damp``: diagonal dampening, a fraction of its mean).
    """
    _check_weight(w)
    if hessian is None:
        return reference.quantize_int8(w)
    _check_hessian(hessian, w)
    _, scales = reference.quantize_int8(w)
    q = _gptq(w, hessian, scales[:, None].expand(w.shape), torch.zeros((), device=w.device), -127, 127, damp)
    return q.to(torch.int8), scales


def dequantize_int8(
    qweight: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """``qweight * scales[:, None]`` as ``dtype``."""
    _check_int8(qweight, scales)
    return reference.dequantize_int8(qweight, scales, dtype)


def _check_group(group_size: int) -> None:
    if group_size not in INT4_GROUP_SIZES:
        raise ValueError(f"group_size must be one of {INT4_GROUP_SIZES}, got {group_size}")


def quantize_int4(
    w: torch.Tensor,
    group_size: int = 128,
    *,
    clip_search: bool = False,
    hessian: torch.Tensor | None = None,
    damp: float = 0.01,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric group-wise INT4 quantization of ``w [N, K]`` (K a multiple of ``group_size``).

    Returns ``(packed uint8 [N, K/2], scales float32 [N, K/G], zeros uint8 [N, K/G])``.
    ``clip_search``: choose each group's range by the clip search; ``hessian`` (``[K, K]``):
    choose the integers by GPTQ (see the module docstring; ``damp``: diagonal dampening).
    """
    _check_weight(w)
    _check_group(group_size)
    if w.shape[1] % group_size:
        raise ValueError(f"K={w.shape[1]} must be a multiple of group_size={group_size}")
    if hessian is not None:
        _check_hessian(hessian, w)
    if hessian is None and not clip_search:
        return reference.quantize_int4(w, group_size)
    n, kdim = w.shape
    groups = w.to(torch.float32).reshape(n, kdim // group_size, group_size)
    importance = None
    if hessian is not None:
        importance = hessian.diagonal().to(torch.float32).clamp(min=0).reshape(kdim // group_size, group_size)
    scales, zeros = int4_group_params(groups, importance) if clip_search else reference.int4_range_params(
        groups.amin(dim=2), groups.amax(dim=2))
    if hessian is None:
        q = reference.int4_levels(groups, scales[..., None], zeros[..., None]).reshape(n, kdim)
    else:
        q = _gptq(w, hessian, scales.repeat_interleave(group_size, dim=1),
                  zeros.repeat_interleave(group_size, dim=1), 0, 15, damp)
    return reference.pack_int4(q, group_size), scales, zeros.to(torch.uint8)


def int4_group_params(
    groups: torch.Tensor, importance: torch.Tensor | None = None, shrinks: tuple[float, ...] = CLIP_SHRINKS
) -> tuple[torch.Tensor, torch.Tensor]:
    """INT4 ``(scales, zeros)`` ``[..., K/G]`` (float32) of ``groups [..., K/G, G]`` by clip search.

    Every pair of factors ``(a, b)`` of ``shrinks`` gives a candidate range ``[a * min, b * max]``;
    each group keeps the candidate whose quantization has the least squared error, weighted by
    ``importance`` (``[K/G, G]``, per column, e.g. the mean squared input; None: unweighted).
    Ties keep the earlier candidate, so with 1.0 first the result is never worse than min/max.
    """
    wmin, wmax = groups.amin(dim=-1), groups.amax(dim=-1)
    best_err = best_scales = best_zeros = None
    for a in shrinks:
        for b in shrinks:
            scales, zeros = reference.int4_range_params(wmin * a, wmax * b)
            levels = reference.int4_levels(groups, scales[..., None], zeros[..., None])
            err = ((levels - zeros[..., None]) * scales[..., None] - groups).square_()
            if importance is not None:
                err *= importance
            err = err.sum(dim=-1)
            if best_err is None:
                best_err, best_scales, best_zeros = err, scales, zeros
                continue
            better = err < best_err
            best_err = torch.where(better, err, best_err)
            best_scales = torch.where(better, scales, best_scales)
            best_zeros = torch.where(better, zeros, best_zeros)
    return best_scales, best_zeros


def _check_hessian(hessian: torch.Tensor, w: torch.Tensor) -> None:
    check_tensor("hessian", hessian, ndim=2, dtypes=(torch.float32, torch.float64))
    k = w.shape[1]
    if tuple(hessian.shape) != (k, k):
        raise ValueError(f"hessian must be [K, K] = [{k}, {k}], got {tuple(hessian.shape)}")
    check_same_device(w=w, hessian=hessian)
    if not bool(torch.isfinite(hessian).all()):
        raise ValueError("hessian contains inf or NaN")


def _gptq(
    w: torch.Tensor,
    hessian: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    qmin: int,
    qmax: int,
    damp: float,
    block: int = 128,
) -> torch.Tensor:
    """GPTQ: integer levels ``q [N, K]`` (float32) with ``w ~= (q - zeros) * scales`` (both ``[N, K]``, or
    broadcastable) chosen to minimise ``tr(E H E^T)``, ``E`` the weight error (Frantar et al., 2022, Algorithm 1,
    with "act order": columns in decreasing order of ``diag(H)``)."""
    n, k = w.shape
    W = w.to(torch.float32).clone()
    H = hessian.to(torch.float32).clone()
    dead = H.diagonal() <= 0  # inputs that are always 0: their weights do not matter
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    order = torch.argsort(H.diagonal(), descending=True)
    W, H = W[:, order], H[order][:, order]
    scales, zeros = scales.expand(n, k)[:, order], zeros.expand(n, k)[:, order]
    Hinv = _inverse_cholesky(H, damp)
    Q = torch.empty_like(W)
    for i1 in range(0, k, block):
        i2 = min(i1 + block, k)
        W1, Hinv1 = W[:, i1:i2].clone(), Hinv[i1:i2, i1:i2]
        E1 = torch.empty_like(W1)
        for i in range(i2 - i1):
            c = i1 + i
            q = (torch.round(W1[:, i] / scales[:, c]) + zeros[:, c]).clamp_(qmin, qmax)
            Q[:, c] = q
            err = (W1[:, i] - (q - zeros[:, c]) * scales[:, c]) / Hinv1[i, i]
            W1[:, i:] -= err[:, None] * Hinv1[i, i:][None, :]
            E1[:, i] = err
        W[:, i2:] -= E1 @ Hinv[i1:i2, i2:]  # the block's errors, on the columns after it
    return Q[:, torch.argsort(order)]


def _inverse_cholesky(H: torch.Tensor, damp: float) -> torch.Tensor:
    """Upper Cholesky factor of ``(H + damp * mean(diag(H)) * I)^-1``; the dampening grows until H is definite."""
    eye = torch.eye(H.shape[0], dtype=H.dtype, device=H.device)
    mean_diag = H.diagonal().mean()
    for attempt in range(6):
        L, info = torch.linalg.cholesky_ex(H + damp * 10**attempt * mean_diag * eye)
        if int(info) == 0:
            Hinv = torch.cholesky_inverse(L)
            U, info = torch.linalg.cholesky_ex(Hinv, upper=True)
            if int(info) == 0:
                return U
    raise ValueError("hessian is not positive semi-definite")


def unpack_int4(packed: torch.Tensor, group_size: int = 128) -> torch.Tensor:
    """The 4-bit values of ``packed`` as uint8 ``[N, K]``."""
    check_tensor("packed", packed, ndim=2, dtypes=(torch.uint8,))
    _check_group(group_size)
    if (2 * packed.shape[1]) % group_size:
        raise ValueError(f"packed has K={2 * packed.shape[1]} columns, not a multiple of group_size={group_size}")
    return reference.unpack_int4(packed, group_size)


def dequantize_int4(
    packed: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    group_size: int = 128,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """``(q - zeros) * scales`` per group, as ``dtype`` ``[N, K]``."""
    _check_int4(packed, scales, zeros, group_size)
    return reference.dequantize_int4(packed, scales, zeros, group_size, dtype)


def _check_int8(qweight: torch.Tensor, scales: torch.Tensor) -> None:
    check_tensor("qweight", qweight, ndim=2, dtypes=(torch.int8,))
    check_tensor("scales", scales, ndim=1, dtypes=FLOAT_DTYPES)
    if scales.shape[0] != qweight.shape[0]:
        raise ValueError(f"scales has {scales.shape[0]} entries for {qweight.shape[0]} output channels")


def _check_int4(packed: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int) -> None:
    check_tensor("packed", packed, ndim=2, dtypes=(torch.uint8,))
    check_tensor("scales", scales, ndim=2, dtypes=FLOAT_DTYPES)
    check_tensor("zeros", zeros, ndim=2, dtypes=(torch.uint8,))
    _check_group(group_size)
    n, kdim = packed.shape[0], 2 * packed.shape[1]
    if kdim % group_size:
        raise ValueError(f"packed has K={kdim} columns, not a multiple of group_size={group_size}")
    groups = kdim // group_size
    if tuple(scales.shape) != (n, groups) or tuple(zeros.shape) != (n, groups):
        raise ValueError(
            f"scales and zeros must be [N, K/G] = [{n}, {groups}]; got {tuple(scales.shape)} and {tuple(zeros.shape)}"
        )


def _check_x(x: torch.Tensor, kdim: int) -> None:
    check_tensor("x", x, ndim=range(1, 9), dtypes=FLOAT_DTYPES, last_contiguous=True)
    if x.shape[-1] != kdim:
        raise ValueError(f"x has {x.shape[-1]} features but the weight expects K={kdim}")


def _check_bias(bias: torch.Tensor | None, n: int) -> None:
    if bias is not None:
        check_tensor("bias", bias, ndim=1, dtypes=FLOAT_DTYPES)
        if bias.shape[0] != n:
            raise ValueError(f"bias has {bias.shape[0]} entries for N={n}")


def _rows_out(x: torch.Tensor, n: int, out: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x2 = x.reshape(-1, x.shape[-1])
    y = out if out is not None else torch.empty((*x.shape[:-1], n), dtype=x.dtype, device=x.device)
    y2 = y.reshape(-1, n)
    if y2.numel() and y2.data_ptr() != y.data_ptr():
        raise ValueError("out must be viewable as [M, N]")
    return x2, y, y2


def int8_matmul(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """W8A16 linear layer: ``x @ (qweight * scales[:, None]).T + bias``.

    x: ``[..., K]`` float16/bfloat16/float32; qweight int8 ``[N, K]``; scales ``[N]``;
    bias ``[N]`` or None. Returns ``[..., N]`` in x's dtype (float32 accumulation).
    """
    _check_int8(qweight, scales)
    n, kdim = qweight.shape
    _check_x(x, kdim)
    _check_bias(bias, n)
    device = check_same_device(x=x, qweight=qweight, scales=scales, bias=bias)
    check_out(out, (*x.shape[:-1], n), x.dtype, device)
    if not use_triton(x, qweight, scales, bias):
        return reference.int8_matmul(x, qweight, scales, bias, out=out)
    if qweight.stride(1) != 1:
        raise ValueError("qweight must be contiguous along K")
    from . import _triton_quant

    x2, y, y2 = _rows_out(x, n, out)
    _triton_quant.int8_matmul(x2, qweight, scales, bias, y2)
    return y


def int4_matmul(
    x: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    group_size: int = 128,
    bias: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """W4A16 linear layer: ``x @ dequantize_int4(packed, scales, zeros, group_size).T + bias``.

    x: ``[..., K]`` float16/bfloat16/float32; packed uint8 ``[N, K/2]``; scales/zeros
    ``[N, K/G]``. Returns ``[..., N]`` in x's dtype (float32 accumulation).
    """
    _check_int4(packed, scales, zeros, group_size)
    n, kdim = packed.shape[0], 2 * packed.shape[1]
    _check_x(x, kdim)
    _check_bias(bias, n)
    device = check_same_device(x=x, packed=packed, scales=scales, zeros=zeros, bias=bias)
    check_out(out, (*x.shape[:-1], n), x.dtype, device)
    if not use_triton(x, packed, scales, zeros, bias):
        return reference.int4_matmul(x, packed, scales, zeros, group_size, bias, out=out)
    if packed.stride(1) != 1 or scales.stride(1) != 1 or zeros.stride(1) != 1:
        raise ValueError("packed, scales and zeros must be contiguous along their last dimension")
    from . import _triton_quant

    x2, y, y2 = _rows_out(x, n, out)
    _triton_quant.int4_matmul(x2, packed, scales, zeros, group_size, bias, y2)
    return y
