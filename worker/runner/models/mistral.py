"""Mistral: Llama's layers; its config class gives a sliding window (4096) when config.json states none."""

from __future__ import annotations

from hetero_infer.worker.runner.models.decoder import DecoderForCausalLM
from hetero_infer.worker.runner.models.registry import ModelFamily, SlidingWindow, Supports


class MistralForCausalLM(DecoderForCausalLM):
    pass


FAMILY = ModelFamily("mistral", ("MistralForCausalLM",), ("mistral",), MistralForCausalLM,
                     Supports(cpu_fused_decode=True, tensor_parallel=True), "Mistral", SlidingWindow(default_when_absent=True))
