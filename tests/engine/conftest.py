"""Fixtures: random-weight Llama-family models saved as HF folders, with the default model's tokenizer."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from hetero_infer.worker.runner.loader import default_model_gguf, gguf_tokenizer

TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    initializer_range=0.15,  # well-separated logits: no float32 near-ties in greedy decoding
)


def tiny_config(arch: str):
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    vocab = 49152  # the default tokenizer's vocabulary
    if arch == "llama":
        return LlamaConfig(vocab_size=vocab, tie_word_embeddings=False, **TINY)
    if arch == "llama3-tied":
        rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64, "rope_theta": 500000.0}
        return LlamaConfig(vocab_size=vocab, tie_word_embeddings=True, rope_parameters=rope, **TINY)
    if arch == "llama-hd64":  # the default model's head dim: the C decode kernel's AVX-512 path
        return LlamaConfig(vocab_size=vocab, tie_word_embeddings=False, head_dim=64, **TINY)
    if arch == "mistral":
        return MistralConfig(vocab_size=vocab, tie_word_embeddings=False, sliding_window=None, **TINY)
    if arch == "qwen2":
        return Qwen2Config(vocab_size=vocab, tie_word_embeddings=True, use_sliding_window=False, **TINY)
    if arch == "qwen3":
        return Qwen3Config(vocab_size=vocab, tie_word_embeddings=False, head_dim=24, use_sliding_window=False, **TINY)
    if arch in MOE:
        return moe_config(*MOE[arch])
    raise KeyError(arch)


# MoE configs: (family, experts, top-k, renormalised, sparse-layer options); every routing option the families'
# configs carry. Two layers (three where a dense layer sits between sparse ones).
MOE = {
    "qwen3-moe": ("qwen3_moe", 8, 2, False, {}),
    "qwen3-moe-norm-top1-e4": ("qwen3_moe", 4, 1, True, {}),
    "qwen3-moe-top4-e16-mixed": ("qwen3_moe", 16, 4, True, {"decoder_sparse_step": 2, "mlp_only_layers": [2]}),
    "qwen3-moe-top3-dense0": ("qwen3_moe", 6, 3, False, {"mlp_only_layers": [0]}),
    "qwen2-moe-shared": ("qwen2_moe", 8, 2, False, {}),  # a shared expert beside the routed ones
    "qwen2-moe-shared-norm-mixed": ("qwen2_moe", 4, 3, True, {"decoder_sparse_step": 2}),
    "mixtral": ("mixtral", 8, 2, True, {}),
    "mixtral-top1-e4": ("mixtral", 4, 1, True, {}),
    "mixtral-top4-e16": ("mixtral", 16, 4, True, {}),
}


def moe_config(family: str, experts: int, top_k: int, renormalize: bool, sparse: dict):
    from transformers import MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig

    vocab = 49152
    base = {**TINY, "num_hidden_layers": 4 if sparse.get("decoder_sparse_step", 1) > 1 else 2}
    if family == "qwen3_moe":
        # moe_intermediate_size 32: H and I multiples of 4 floats, the CPU grouped GEMM's alignment
        return Qwen3MoeConfig(vocab_size=vocab, tie_word_embeddings=False, head_dim=16, use_sliding_window=False,
                              num_experts=experts, num_experts_per_tok=top_k, norm_topk_prob=renormalize,
                              moe_intermediate_size=32, **sparse, **base)
    if family == "qwen2_moe":
        return Qwen2MoeConfig(vocab_size=vocab, tie_word_embeddings=False, use_sliding_window=False,
                              num_experts=experts, num_experts_per_tok=top_k, norm_topk_prob=renormalize,
                              moe_intermediate_size=32, shared_expert_intermediate_size=48, **sparse, **base)
    assert renormalize and not sparse  # Mixtral always renormalises, every layer sparse
    return MixtralConfig(vocab_size=vocab, tie_word_embeddings=False, sliding_window=None,
                         num_local_experts=experts, num_experts_per_tok=top_k, **base)




@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tokenizer")
    gguf_tokenizer(default_model_gguf()).hf.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory, tokenizer_dir):
    """Factory: arch name -> (folder, HF model in float32 eval mode)."""
    from transformers import AutoModelForCausalLM

    cache: dict[str, tuple[Path, torch.nn.Module]] = {}

    def make(arch: str):
        if arch not in cache:
            torch.manual_seed(1234)
            config = tiny_config(arch)
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
            folder = tmp_path_factory.mktemp(f"model-{arch}")
            model.save_pretrained(folder, safe_serialization=True)
            for f in tokenizer_dir.iterdir():
                shutil.copy(f, folder / f.name)
            cache[arch] = (folder, model)
        return cache[arch]

    return make
