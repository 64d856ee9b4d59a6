"""Linear layers with weights pre-packed for oneDNN, for the CPU path.

PyTorch's `F.linear` on CPU goes to MKL; on the AMD EPYC machines this project runs on,
oneDNN's packed-weight GEMM is 2-4x faster in float32 for decode-sized batches (measured:
32x576x3072 0.90 -> 0.35 ms; the 49152-row LM head 32 -> 7.3 ms) and ~1.3x in bfloat16.
It is the same packing torch.compile's CPU backend applies ("weight prepacking"), done once
at load time here. HETERO_INFER_ONEDNN=0 keeps plain `F.linear`.
"""

from __future__ import annotations

import logging
import os

import torch
from torch import nn

log = logging.getLogger(__name__)

_BATCH_HINT = 32  # the packed layout is valid for any batch; the hint only tunes it


def available() -> bool:
    if os.environ.get("HETERO_INFER_ONEDNN", "1") == "0":
        return False
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), _BATCH_HINT)


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, "none", [], "")


class PackedLinear(nn.Module):
    """Drop-in replacement of an `nn.Linear` (same output) over a packed weight."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("packed_weight", pack_weight(linear.weight), persistent=False)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return packed_linear(x, self.packed_weight, self.bias)


def pack_linears(model: nn.Module) -> int:
    """Replace every plain `nn.Linear` in `model` (CPU, float weights) by a PackedLinear; return how many."""
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and child.weight.device.type == "cpu":
                setattr(parent, name, PackedLinear(child))
                count += 1
    return count
