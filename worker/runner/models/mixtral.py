"""Mixtral (8x7B, 8x22B): Llama's attention; every layer sparse, `num_local_experts` experts of
`intermediate_size`, `num_experts_per_tok` per token, always renormalised. Its checkpoints name the MoE block
`block_sparse_moe` and an expert's projections w1 (gate), w3 (up), w2 (down)."""

from __future__ import annotations

import re

from torch import nn

from hetero_infer.worker.runner.models.decoder import DecoderForCausalLM
from hetero_infer.worker.runner.models.moe import Routing, SparseMoeBlock
from hetero_infer.worker.runner.models.registry import ModelFamily, Supports

_EXPERT_NAMES = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}


class MixtralForCausalLM(DecoderForCausalLM):
    decode_layout = "moe"

    @classmethod
    def layer_mlp(cls, config, layer_idx: int) -> nn.Module:
        routing = Routing(config.num_local_experts, config.num_experts_per_tok, renormalize=True)
        return SparseMoeBlock(config.hidden_size, config.intermediate_size, routing)

    @classmethod
    def checkpoint_name(cls, name: str) -> str:
        name = name.replace(".block_sparse_moe.", ".mlp.")
        return re.sub(r"(\.experts\.\d+\.)(w[123])\.", lambda m: m[1] + _EXPERT_NAMES[m[2]] + ".", name)


FAMILY = ModelFamily("mixtral", ("MixtralForCausalLM",), ("mixtral",), MixtralForCausalLM,
                     Supports(moe=True, gguf=False, tensor_parallel=True), "Mixtral-8x7B, Mixtral-8x22B")  # transformers maps no Mixtral GGUF
