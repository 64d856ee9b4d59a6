"""Linear layers with weights pre-packed once at load time, for the CPU path.

PyTorch's `F.linear` on CPU goes to MKL; on the AMD EPYC machines this project runs on,
oneDNN's packed-weight GEMM is 2-4x faster in float32 for decode-sized batches (measured:
32x576x3072 0.90 -> 0.35 ms; the 49152-row LM head 32 -> 7.3 ms). It is the same packing
torch.compile's CPU backend applies ("weight prepacking"). In bfloat16, on CPUs with
AVX512_BF16, the project's own GEMM (kernels/cpu/csrc/gemm.c) replaces oneDNN: it overlaps weight
streaming with compute, which oneDNN does not at decode batch sizes (one decode step's linears
of the default model, one thread: 27.5 -> 23.8 ms at 32 rows, 10.8 -> 8.0 ms at one row; equal
or faster at prefill sizes). HETERO_INFER_ONEDNN=0 keeps plain `F.linear` everywhere.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from dataclasses import dataclass

import torch
from torch import nn

from hetero_infer.kernels.cpu import native

log = logging.getLogger(__name__)

_BATCH_HINT = 32  # the oneDNN packed layout is valid for any batch; the hint only tunes it
_PANEL = 64  # output columns per panel of the bfloat16 GEMM's layout (NR * 16 in gemm.c)
_P, _I = ctypes.c_void_p, ctypes.c_int


def available() -> bool:
    if os.environ.get("HETERO_INFER_ONEDNN", "1") == "0":
        return False
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


@functools.cache
def _gemm_bf16():
    """The C bfloat16 GEMM, or None where the library or AVX512_BF16 is missing."""
    if native.library() is None:
        return None
    if not native.function("gemm_bf16_available", [], ctypes.c_int)():
        return None
    return native.function("gemm_bf16", [_P, _I, _I, _P, _I, _P, _P], ctypes.c_int)


@functools.cache
def _gemm_quantized(bits: int):
    """The C W8A16 / W4A16 GEMM (bfloat16 activations), or None where the bfloat16 GEMM is missing."""
    if _gemm_bf16() is None:
        return None
    if bits == 8:
        return native.function("gemm_w8a16", [_P, _I, _I, _P, _P, _I, _P, _P], ctypes.c_int)
    return native.function("gemm_w4a16", [_P, _I, _I, _P, _P, _P, _I, _I, _P, _P], ctypes.c_int)


def quantized_gemm_available() -> bool:
    return _gemm_quantized(8) is not None


@dataclass
class PackedWeight:
    """A weight [N, K] in the layout of the GEMM that will use it: "onednn", "gemm_bf16", or the weight-only
    quantized "gemm_w8a16" / "gemm_w4a16" (with their scales, and zero points for INT4)."""

    kind: str
    data: torch.Tensor
    out_features: int
    in_features: int
    scales: torch.Tensor | None = None
    zeros: torch.Tensor | None = None
    group_size: int = 0


def _panels(t: torch.Tensor, n: int) -> torch.Tensor:
    """`t` [n, ...] zero-padded to a whole number of panels: [panels, _PANEL, ...]."""
    padded = t.new_zeros((-(-n // _PANEL) * _PANEL, *t.shape[1:]))
    padded[:n] = t
    return padded.view(-1, _PANEL, *t.shape[1:])


def pack_int8(qweight: torch.Tensor, scales: torch.Tensor) -> PackedWeight:
    """INT8 weights [N, K] with per-output-channel scales [N], for `gemm_w8a16`: panels of 64 columns whose
    row kp holds each column's pair (q[n, 2kp], q[n, 2kp + 1]), as the bfloat16 layout does."""
    n, k = qweight.shape
    data = _panels(qweight.detach().to(torch.int8), n).view(-1, _PANEL, k // 2, 2).permute(0, 2, 1, 3).contiguous()
    return PackedWeight("gemm_w8a16", data, n, k, scales=_panels(scales.detach().float(), n).reshape(-1))


def pack_int4(levels: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int) -> PackedWeight:
    """INT4 levels [N, K] (values 0..15) with scales and zero points [N, K / group_size], for `gemm_w4a16`:
    one byte per column and K pair in panels of 64 columns (low nibble k = 2kp, high nibble 2kp + 1); scales
    and zeros as float32 [panels, K / group_size, 64]."""
    n, k = levels.shape
    lv = _panels(levels.detach().to(torch.uint8), n).view(-1, _PANEL, k // 2, 2)
    data = (lv[..., 0] | (lv[..., 1] << 4)).permute(0, 2, 1).contiguous()

    def per_group(t: torch.Tensor) -> torch.Tensor:
        return _panels(t.detach().float(), n).permute(0, 2, 1).contiguous()

    return PackedWeight("gemm_w4a16", data, n, k, scales=per_group(scales), zeros=per_group(zeros),
                        group_size=group_size)


def pack_weight(weight: torch.Tensor) -> PackedWeight:
    n, k = weight.shape
    weight = weight.detach()
    if weight.dtype == torch.bfloat16 and k % 2 == 0 and _gemm_bf16() is not None:
        # panels of 64 columns; row kp of a panel holds each column's pair (W[n, 2kp], W[n, 2kp + 1])
        padded = -(-n // _PANEL) * _PANEL
        w = torch.zeros(padded, k, dtype=torch.bfloat16)
        w[:n] = weight
        data = w.view(padded // _PANEL, _PANEL, k // 2, 2).permute(0, 2, 1, 3).contiguous()
        return PackedWeight("gemm_bf16", data, n, k)
    return PackedWeight("onednn", torch.ops.mkldnn._reorder_linear_weight(weight, _BATCH_HINT), n, k)


def packed_linear(x: torch.Tensor, packed: PackedWeight, bias: torch.Tensor | None) -> torch.Tensor:
    if packed.kind == "onednn":
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed.data, bias, "none", [], "")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, packed.in_features).to(torch.bfloat16).contiguous()
    m, k, n = x2.shape[0], packed.in_features, packed.out_features
    out = torch.empty(m, n, dtype=torch.bfloat16)
    b = None if bias is None else bias.float().contiguous()
    b_ptr = None if b is None else b.data_ptr()
    if packed.kind == "gemm_bf16":
        rc = _gemm_bf16()(x2.data_ptr(), m, k, packed.data.data_ptr(), n, b_ptr, out.data_ptr())
    elif packed.kind == "gemm_w8a16":
        rc = _gemm_quantized(8)(x2.data_ptr(), m, k, packed.data.data_ptr(), packed.scales.data_ptr(), n, b_ptr,
                                out.data_ptr())
    else:
        rc = _gemm_quantized(4)(x2.data_ptr(), m, k, packed.data.data_ptr(), packed.scales.data_ptr(),
                                packed.zeros.data_ptr(), packed.group_size, n, b_ptr, out.data_ptr())
    if rc != 0:
        raise RuntimeError(f"{packed.kind} failed ({rc})")
    return out.view(*lead, n)


class PackedLinear(nn.Module):
    """Drop-in replacement of an `nn.Linear` (same output) over a packed weight."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = pack_weight(linear.weight)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return packed_linear(x, self.packed, self.bias)


def pack_linears(model: nn.Module) -> int:
    """Replace every plain `nn.Linear` in `model` (CPU, float weights) by a PackedLinear; return how many."""
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and child.weight.device.type == "cpu":
                setattr(parent, name, PackedLinear(child))
                count += 1
    return count
