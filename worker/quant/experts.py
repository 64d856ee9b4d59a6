"""Weight-only INT8 / INT4 experts of MoE layers: every expert's gate|up and down projection in the per-expert
formats of `hetero_infer.kernels` (INT8 per output channel; INT4 in groups along K, clip-searched), stacked
[E, N, ...], run by `kernels.fused_moe` (the Triton grouped GEMM dequantizes inside the kernel; the CPU path
dequantizes the experts a step hits). Round to nearest: GPTQ's statistics would have to come per expert from the
tokens routed to it."""

from __future__ import annotations

import torch
from torch import nn

from hetero_infer import kernels


def _quantized(w: torch.Tensor, method: str, group_size: int) -> kernels.ExpertWeights:
    """[E, N, K] float weights as ExpertWeights of `method` (each expert's rows quantized as a Linear's are)."""
    from hetero_infer.worker.quant.quantize import int4_group_size

    e, n, k = w.shape
    rows = w.detach().reshape(e * n, k)
    if method == "int8":
        q, s = kernels.quantize_int8(rows)
        return kernels.ExpertWeights(q.reshape(e, n, k), s.reshape(e, n))
    g = int4_group_size(k, group_size)
    q, s, z = kernels.quantize_int4(rows, g, clip_search=True)
    return kernels.ExpertWeights(q.reshape(e, n, k // 2), s.reshape(e, n, -1), z.reshape(e, n, -1), g)


class QuantizedExperts(nn.Module):
    """An `Experts` module (worker/runner/models/moe.py) with INT8 or INT4 weights; the same forward."""

    def __init__(self, gate_up: kernels.ExpertWeights, down: kernels.ExpertWeights, method: str) -> None:
        super().__init__()
        self.method = method
        self.num_experts = gate_up.shape[0]
        for name, ew in (("gate_up", gate_up), ("down", down)):
            self.register_buffer(f"{name}_qweight", ew.weight)
            self.register_buffer(f"{name}_scales", ew.scales)
            self.register_buffer(f"{name}_zeros", ew.zeros)  # None for INT8 (buffers() skips it)
        self.group_sizes = (gate_up.group_size, down.group_size)

    @classmethod
    def from_experts(cls, experts: nn.Module, method: str, group_size: int) -> QuantizedExperts:
        return cls(_quantized(experts.gate_up_proj, method, group_size),
                   _quantized(experts.down_proj, method, group_size), method)

    def weights(self) -> tuple[kernels.ExpertWeights, kernels.ExpertWeights]:
        return (kernels.ExpertWeights(self.gate_up_qweight, self.gate_up_scales, self.gate_up_zeros, self.group_sizes[0]),
                kernels.ExpertWeights(self.down_qweight, self.down_scales, self.down_zeros, self.group_sizes[1]))

    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return kernels.fused_moe(x, *self.weights(), weights, ids)

    def extra_repr(self) -> str:
        return f"num_experts={self.num_experts}, method={self.method}, group_sizes={self.group_sizes}"


@torch.no_grad()
def quantize_experts(model: nn.Module, method: str, group_size: int) -> int:
    """Replace every `Experts` module of `model` by QuantizedExperts, in place; return the stacks quantized (two
    per MoE layer)."""
    from hetero_infer.worker.runner.models.moe import Experts

    targets = [(parent, name) for parent in model.modules() for name, child in parent.named_children()
               if isinstance(child, Experts)]
    for parent, name in targets:
        setattr(parent, name, QuantizedExperts.from_experts(getattr(parent, name), method, group_size))
    return 2 * len(targets)
