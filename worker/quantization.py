"""Weight-only quantization of a loaded model: INT8 per output channel (W8A16) or INT4 in
groups along K (W4A16), through `hetero_infer.kernels` (Triton on CUDA, PyTorch elsewhere).

Only the decoder's projections are quantized (qkv_proj, o_proj, gate_up_proj, down_proj);
embeddings, lm_head and norms stay in the model dtype, as in most weight-only schemes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from hetero_infer import kernels

METHODS = ("int8", "int4")
PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
INT4_GROUP_SIZE = 128


@dataclass(frozen=True)
class QuantReport:
    method: str
    bytes_before: int  # parameters and buffers of the whole model, before
    bytes_after: int
    num_quantized: int  # Linear layers replaced

    @property
    def ratio(self) -> float:
        return self.bytes_after / self.bytes_before


def int4_group_size(in_features: int, preferred: int = INT4_GROUP_SIZE) -> int:
    """`preferred`, or the largest smaller supported group dividing K (SmolLM2's K = 576 is not a multiple of 128)."""
    for g in sorted((g for g in kernels.INT4_GROUP_SIZES if g <= preferred), reverse=True):
        if in_features % g == 0:
            return g
    raise ValueError(f"INT4 needs in_features divisible by one of {kernels.INT4_GROUP_SIZES}; got {in_features}")


class QuantizedLinear(nn.Module):
    """A Linear layer with INT8 (per output channel) or INT4 (asymmetric, per group) weights.

    The activations and output keep their dtype (float32 accumulation); scales are float32.
    """

    def __init__(self, in_features: int, out_features: int, method: str, group_size: int = INT4_GROUP_SIZE,
                 bias: torch.Tensor | None = None, device: torch.device | str | None = None) -> None:
        super().__init__()
        if method not in METHODS:
            raise ValueError(f"unknown quantization method {method!r}; expected one of {METHODS}")
        self.in_features, self.out_features, self.method = in_features, out_features, method
        n, k = out_features, in_features
        if method == "int8":
            self.group_size = k
            self.register_buffer("qweight", torch.zeros(n, k, dtype=torch.int8, device=device))
            self.register_buffer("scales", torch.ones(n, dtype=torch.float32, device=device))
            self.zeros: torch.Tensor | None = None
        else:
            if group_size not in kernels.INT4_GROUP_SIZES or k % group_size:
                raise ValueError(f"group_size {group_size} must be one of {kernels.INT4_GROUP_SIZES} and divide K={k}")
            self.group_size = group_size
            self.register_buffer("qweight", torch.zeros(n, k // 2, dtype=torch.uint8, device=device))
            self.register_buffer("scales", torch.ones(n, k // group_size, dtype=torch.float32, device=device))
            self.register_buffer("zeros", torch.zeros(n, k // group_size, dtype=torch.uint8, device=device))
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)

    @classmethod
    def from_linear(cls, linear: nn.Linear, method: str, group_size: int = INT4_GROUP_SIZE) -> QuantizedLinear:
        w = linear.weight.detach()
        if method == "int4":
            group_size = int4_group_size(linear.in_features, group_size)
        layer = cls(linear.in_features, linear.out_features, method, group_size, linear.bias, device=w.device)
        if method == "int8":
            q, s = kernels.quantize_int8(w)
            layer.qweight.copy_(q)
            layer.scales.copy_(s)
        else:
            q, s, z = kernels.quantize_int4(w, layer.group_size)
            layer.qweight.copy_(q)
            layer.scales.copy_(s)
            layer.zeros.copy_(z)
        return layer

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        if self.method == "int8":
            return kernels.dequantize_int8(self.qweight, self.scales, dtype)
        return kernels.dequantize_int4(self.qweight, self.scales, self.zeros, self.group_size, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.method == "int8":
            return kernels.int8_matmul(x, self.qweight, self.scales, self.bias)
        return kernels.int4_matmul(x, self.qweight, self.scales, self.zeros, self.group_size, self.bias)

    def extra_repr(self) -> str:
        group = f", group_size={self.group_size}" if self.method == "int4" else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, method={self.method}{group}, "
                f"bias={self.bias is not None}")


def weight_bytes(model: nn.Module) -> int:
    """Bytes of all parameters and buffers (tied tensors once)."""
    tensors = {id(t): t for t in (*model.parameters(), *model.buffers())}
    return sum(t.numel() * t.element_size() for t in tensors.values())


@torch.no_grad()
def quantize_model(model: nn.Module, method: str, group_size: int = INT4_GROUP_SIZE) -> QuantReport:
    """Replace the projection Linears of a loaded model by QuantizedLinear, in place."""
    if method not in METHODS:
        raise ValueError(f"unknown quantization method {method!r}; expected one of {METHODS}")
    before = weight_bytes(model)
    # (parent, name) only: holding no reference to the float Linear frees it as soon as it is replaced
    targets = [(parent, name) for parent in model.modules() for name, child in parent.named_children()
               if name in PROJECTIONS and isinstance(child, nn.Linear)]
    for parent, name in targets:
        setattr(parent, name, QuantizedLinear.from_linear(getattr(parent, name), method, group_size))
    return QuantReport(method, before, weight_bytes(model), len(targets))
