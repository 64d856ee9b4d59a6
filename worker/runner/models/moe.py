"""The sparse Mixture-of-Experts MLP shared by the MoE families: a router (a Linear to the experts' logits), the
top-k routing and every expert's gated SiLU MLP, stacked ([E, 2I, H] gate|up, [E, H, I] down, the layout
transformers holds them in) and run by `kernels.fused_moe` (Triton on CUDA, grouped GEMMs on the CPU)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from hetero_infer import kernels
from hetero_infer.worker.runner.attention import AttentionBackend
from hetero_infer.worker.runner.models.decoder import MLP
from hetero_infer.worker.runner.parallel import group as tp_group


@dataclass(frozen=True)
class Routing:
    """A MoE layer's routing, as its config states it."""

    num_experts: int
    top_k: int
    renormalize: bool  # the top-k weights rescaled to sum to 1 (Mixtral always; Qwen3-MoE's `norm_topk_prob`)
    # transformers' Qwen3-MoE rounds the routing weights to the model's dtype before weighting the experts' outputs
    # (its Mixtral keeps them float32): the same rounding, for the same bfloat16 outputs
    weights_in_model_dtype: bool = False

    def __post_init__(self) -> None:
        if not 1 <= self.top_k <= self.num_experts:
            raise ValueError(f"num_experts_per_tok={self.top_k} must be in [1, num_experts={self.num_experts}]")


def experts_hit(num_experts: int, top_k: int, tokens: int) -> float:
    """How many distinct experts `tokens` tokens route to, expected under uniform routing: a decode step of that
    many sequences reads those experts' weights and no others."""
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)


def idle_expert_bytes(model: nn.Module, tokens: int) -> float:
    """The expected bytes of expert weights a step of `tokens` rows does not read (uniform routing), over every MoE
    layer of `model`: what a step's weight traffic is short of all the weights."""
    idle = 0.0
    for block in model.modules():
        if isinstance(block, SparseMoeBlock):
            r = block.routing
            nbytes = sum(t.numel() * t.element_size() for t in (*block.experts.parameters(), *block.experts.buffers()))
            idle += nbytes * (1.0 - experts_hit(r.num_experts, r.top_k, tokens) / r.num_experts)
    return idle


class Experts(nn.Module):
    """Every expert's gate|up and down projection, stacked."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        intermediate_size = tp_group.current().part(intermediate_size)  # tensor parallel: a slice of every expert
        self.num_experts, self.hidden_size, self.intermediate_size = num_experts, hidden_size, intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))

    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return kernels.fused_moe(x, self.gate_up_proj, self.down_proj, weights, ids)


class SparseMoeBlock(nn.Module):
    """The routed experts, and where the config has one (Qwen2-MoE) a shared expert every token goes through,
    scaled by sigmoid(shared_expert_gate(x))."""

    def __init__(self, hidden_size: int, intermediate_size: int, routing: Routing,
                 shared_intermediate_size: int = 0) -> None:
        super().__init__()
        self.routing = routing
        self.gate = nn.Linear(hidden_size, routing.num_experts, bias=False)  # the router (HF: mlp.gate.weight)
        self.experts = Experts(routing.num_experts, hidden_size, intermediate_size)
        self.shared_expert: MLP | None = None
        if shared_intermediate_size:
            self.shared_expert = MLP(hidden_size, shared_intermediate_size)
            self.shared_expert_gate = nn.Linear(hidden_size, 1, bias=False)

    def forward(self, x: torch.Tensor, backend: AttentionBackend) -> torch.Tensor:
        weights, ids = kernels.moe_routing(self.gate(x), self.routing.top_k, self.routing.renormalize)
        if self.routing.weights_in_model_dtype:
            weights = weights.to(x.dtype)
        out = self.experts(x, weights, ids)
        if self.shared_expert is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x, backend)
        return out
