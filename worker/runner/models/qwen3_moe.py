"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention; the MLP of layer i is sparse where i is not in
`mlp_only_layers` and (i + 1) is a multiple of `decoder_sparse_step` (`num_experts` experts of
`moe_intermediate_size`, `num_experts_per_tok` of them per token, renormalised when `norm_topk_prob`), else dense
(`intermediate_size`). No shared experts."""

from __future__ import annotations

from torch import nn

from hetero_infer.worker.runner.models.decoder import MLP, AttentionLayout, DecoderForCausalLM
from hetero_infer.worker.runner.models.moe import Routing, SparseMoeBlock
from hetero_infer.worker.runner.models.qwen3 import qwen3_attention
from hetero_infer.worker.runner.models.registry import ModelFamily, SlidingWindow, Supports


def is_sparse(config, layer_idx: int) -> bool:
    return (layer_idx not in (getattr(config, "mlp_only_layers", None) or []) and config.num_experts > 0
            and (layer_idx + 1) % config.decoder_sparse_step == 0)


def qwen_moe_mlp(config, layer_idx: int, shared_intermediate_size: int = 0) -> nn.Module:
    """Layer `layer_idx`'s MLP in Qwen's MoE configs (Qwen2-MoE adds a shared expert)."""
    if not is_sparse(config, layer_idx):
        return MLP(config.hidden_size, config.intermediate_size)
    routing = Routing(config.num_experts, config.num_experts_per_tok, bool(config.norm_topk_prob),
                      weights_in_model_dtype=True)
    return SparseMoeBlock(config.hidden_size, config.moe_intermediate_size, routing, shared_intermediate_size)


class Qwen3MoeForCausalLM(DecoderForCausalLM):
    decode_layout = "moe"

    @classmethod
    def attention_layout(cls, config) -> AttentionLayout:
        return qwen3_attention(config)

    @classmethod
    def layer_mlp(cls, config, layer_idx: int) -> nn.Module:
        return qwen_moe_mlp(config, layer_idx)


FAMILY = ModelFamily("qwen3_moe", ("Qwen3MoeForCausalLM",), ("qwen3_moe",), Qwen3MoeForCausalLM,
                     Supports(moe=True, tensor_parallel=True), "Qwen3-MoE: Qwen3-30B-A3B, Qwen3-235B-A22B",
                     SlidingWindow(switch="use_sliding_window"))
