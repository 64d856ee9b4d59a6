"""Qwen2 / Qwen2.5: biases on q, k and v (never on o), whatever `attention_bias` says."""

from __future__ import annotations

from hetero_infer.worker.runner.models.decoder import AttentionLayout, DecoderForCausalLM
from hetero_infer.worker.runner.models.registry import ModelFamily, SlidingWindow, Supports


class Qwen2ForCausalLM(DecoderForCausalLM):
    @classmethod
    def attention_layout(cls, config) -> AttentionLayout:
        return AttentionLayout(qkv_bias=True, o_bias=False)


FAMILY = ModelFamily("qwen2", ("Qwen2ForCausalLM",), ("qwen2",), Qwen2ForCausalLM,
                     Supports(cpu_fused_decode=True, tensor_parallel=True), "Qwen2, Qwen2.5", SlidingWindow(switch="use_sliding_window"))
