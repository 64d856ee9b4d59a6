"""The Llama family (Llama 2/3, SmolLM): the shared decoder as it is, q/k/v/o biases from `attention_bias`."""

from __future__ import annotations

from hetero_infer.worker.runner.models.decoder import DecoderForCausalLM
from hetero_infer.worker.runner.models.registry import ModelFamily, Supports


class LlamaForCausalLM(DecoderForCausalLM):
    pass


FAMILY = ModelFamily("llama", ("LlamaForCausalLM",), ("llama",), LlamaForCausalLM,
                     Supports(cpu_fused_decode=True, tensor_parallel=True), "Llama 2/3, SmolLM")
