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
"""

from __future__ import annotations

import torch

from . import reference
from ._backend import FLOAT_DTYPES, check_out, check_same_device, check_tensor, use_triton

__all__ = [
    "quantize_int8",
    "dequantize_int8",
    "quantize_int4",
    "dequantize_int4",
    "unpack_int4",
    "int8_matmul",
    "int4_matmul",
    "INT4_GROUP_SIZES",
]

#: Group sizes the INT4 format and kernel support.
INT4_GROUP_SIZES = (32, 64, 128, 256)


def _check_weight(w: torch.Tensor) -> None:
    check_tensor("w", w, ndim=2, dtypes=FLOAT_DTYPES)
    if w.shape[0] == 0 or w.shape[1] == 0:
        raise ValueError(f"w must be non-empty, got shape {tuple(w.shape)}")
    if not bool(torch.isfinite(w).all()):
        raise ValueError("w contains inf or NaN")


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel INT8 quantization of ``w [N, K]``.

    Returns ``(qweight int8 [N, K], scales float32 [N])``.
    """
    _check_weight(w)
    return reference.quantize_int8(w)


def dequantize_int8(
    qweight: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """``qweight * scales[:, None]`` as ``dtype``."""
    _check_int8(qweight, scales)
    return reference.dequantize_int8(qweight, scales, dtype)


def _check_group(group_size: int) -> None:
    if group_size not in INT4_GROUP_SIZES:
        raise ValueError(f"group_size must be one of {INT4_GROUP_SIZES}, got {group_size}")


def quantize_int4(w: torch.Tensor, group_size: int = 128) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric group-wise INT4 quantization of ``w [N, K]`` (K a multiple of ``group_size``).

    Returns ``(packed uint8 [N, K/2], scales float32 [N, K/G], zeros uint8 [N, K/G])``.
    """
    _check_weight(w)
    _check_group(group_size)
    if w.shape[1] % group_size:
        raise ValueError(f"K={w.shape[1]} must be a multiple of group_size={group_size}")
    return reference.quantize_int4(w, group_size)


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
