"""Qwen2-MoE (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): Qwen2's attention (q/k/v biases from `qkv_bias`, none on o);
the MLP of layer i sparse where i is not in `mlp_only_layers` and (i + 1) is a multiple of `decoder_sparse_step`:
`num_experts` routed experts of `moe_intermediate_size` (top `num_experts_per_tok`, renormalised when
`norm_topk_prob`) plus a shared expert of `shared_expert_intermediate_size` every token goes through, gated by
sigmoid(`shared_expert_gate`); dense layers of `intermediate_size` elsewhere."""

from __future__ import annotations

from torch import nn

from hetero_infer.worker.runner.models.decoder import AttentionLayout, DecoderForCausalLM
from hetero_infer.worker.runner.models.qwen3_moe import qwen_moe_mlp
from hetero_infer.worker.runner.models.registry import ModelFamily, SlidingWindow, Supports


class Qwen2MoeForCausalLM(DecoderForCausalLM):
    decode_layout = "moe"

    @classmethod
    def attention_layout(cls, config) -> AttentionLayout:
        return AttentionLayout(qkv_bias=bool(getattr(config, "qkv_bias", True)), o_bias=False)

    @classmethod
    def layer_mlp(cls, config, layer_idx: int) -> nn.Module:
        return qwen_moe_mlp(config, layer_idx, config.shared_expert_intermediate_size)


FAMILY = ModelFamily("qwen2_moe", ("Qwen2MoeForCausalLM",), ("qwen2_moe",), Qwen2MoeForCausalLM,
                     Supports(moe=True, tensor_parallel=True), "Qwen2-MoE: Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B",
                     SlidingWindow(switch="use_sliding_window"))
