"""Qwen3: per-head RMSNorm of q and k before rotary; q/k/v/o biases from `attention_bias`."""

from __future__ import annotations

from hetero_infer.worker.runner.models.decoder import AttentionLayout, DecoderForCausalLM
from hetero_infer.worker.runner.models.registry import ModelFamily, SlidingWindow, Supports


def qwen3_attention(config) -> AttentionLayout:
    bias = bool(getattr(config, "attention_bias", False))
    return AttentionLayout(qkv_bias=bias, o_bias=bias, qk_norm=True)


class Qwen3ForCausalLM(DecoderForCausalLM):
    decode_layout = "llama+qk_norm"

    @classmethod
    def attention_layout(cls, config) -> AttentionLayout:
        return qwen3_attention(config)


FAMILY = ModelFamily("qwen3", ("Qwen3ForCausalLM",), ("qwen3",), Qwen3ForCausalLM,
                     Supports(tensor_parallel=True), "Qwen3", SlidingWindow(switch="use_sliding_window"))
