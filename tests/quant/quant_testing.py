"""Helpers shared by tests/quant and tests/gpu: tiny random-weight HF models and greedy agreement."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from hetero_infer.worker.runner.loader import resolve_model

TINY = dict(
    hidden_size=128,  # K = 128 and 256: INT4 group 128
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    initializer_range=0.15,  # well-separated logits: no near-ties in greedy decoding
)

# Fixed prompt set of the agreement measurements (chat-templated, default model).
PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain gravity to a child.",
    "List three prime numbers.",
    "How do I make a cup of tea?",
    "What is machine learning?",
    "Give me a tip for learning to code.",
    "Why is the sky blue?",
]

# A second, larger prompt set (16 x 32 tokens) for the printed measurements (`test_agreement.py --more`).
MORE_PROMPTS = [
    "What are the benefits of regular exercise?", "Describe a sunset in two sentences.",
    "How does a computer store numbers?", "Name three famous painters.",
    "What should I pack for a beach trip?", "Explain photosynthesis briefly.",
    "Write a short poem about autumn.", "What is the difference between a virus and a bacterium?",
    "How can I improve my sleep?", "Summarize the plot of Romeo and Juliet.",
    "What is an API?", "Give me three ideas for a birthday party.",
    "Why do cats purr?", "How do airplanes fly?", "What is the Pythagorean theorem?",
    "Suggest a name for a pet goldfish.",
]


def tiny_config(arch: str):
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    vocab = 49152  # the default tokenizer's vocabulary
    if arch == "llama":
        return LlamaConfig(vocab_size=vocab, tie_word_embeddings=False, **TINY)
    if arch == "qwen2":  # qkv bias, tied embeddings
        return Qwen2Config(vocab_size=vocab, tie_word_embeddings=True, use_sliding_window=False, **TINY)
    if arch == "qwen3":  # per-head q/k RMSNorm (the fused rotary/KV-write kernel's norm path)
        return Qwen3Config(vocab_size=vocab, tie_word_embeddings=True, use_sliding_window=False, head_dim=32, **TINY)
    if arch == "qwen3-moe":  # experts of K = 128 (down) and 128 (gate|up): INT4 group 128
        from transformers import Qwen3MoeConfig

        return Qwen3MoeConfig(vocab_size=vocab, tie_word_embeddings=True, use_sliding_window=False, head_dim=32,
                              num_experts=8, num_experts_per_tok=2, moe_intermediate_size=128, **TINY)
    if arch == "qwen2-moe":  # a shared expert beside the routed ones
        from transformers import Qwen2MoeConfig

        return Qwen2MoeConfig(vocab_size=vocab, tie_word_embeddings=True, use_sliding_window=False, num_experts=4,
                              num_experts_per_tok=2, moe_intermediate_size=128, shared_expert_intermediate_size=256,
                              **TINY)
    if arch == "mixtral":
        from transformers import MixtralConfig

        return MixtralConfig(vocab_size=vocab, tie_word_embeddings=False, num_local_experts=4, **TINY)
    raise KeyError(arch)


def tiny_model_factory(tmp_path_factory, label: str):
    """A session fixture's factory: arch -> (folder, float32 HF model), each arch saved once (`save_tiny_model`)
    into a folder named after `label`."""
    cache: dict = {}

    def make(arch: str):
        if arch not in cache:
            folder = tmp_path_factory.mktemp(f"{label}-model-{arch}")
            cache[arch] = (folder, save_tiny_model(arch, folder))
        return cache[arch]

    return make


def save_tiny_model(arch: str, folder: Path, seed: int = 1234):
    """A random-weight HF model saved with the default model's tokenizer; returns the float32 HF model."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch), dtype=torch.float32).eval()
    model.save_pretrained(folder, safe_serialization=True)
    default_folder, _ = resolve_model(None)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(default_folder / name, folder / name)
    return model


def hf_greedy(model, prompt: list[int], max_new: int) -> list[int]:
    ids = torch.tensor([prompt], device=model.device)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new, min_new_tokens=max_new,
                         do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def prefix_agreement(ref: list[list[int]], got: list[list[int]]) -> float:
    """Fraction of reference tokens matched before each sequence's first mismatch (free-running greedy)."""
    matched = 0
    for a, b in zip(ref, got, strict=True):
        k = 0
        while k < min(len(a), len(b)) and a[k] == b[k]:
            k += 1
        matched += k
    return matched / sum(len(a) for a in ref)


def forced_greedy(llm, prompts: list[list[int]], continuations: list[list[int]]) -> list[list[int]]:
    """Teacher forcing: the model's greedy token at every position of each continuation, given the prompt and
    the continuation's earlier tokens (one prefill step through the engine's executor)."""
    ex = llm.engine.executor
    seqs = [p + c[:-1] for p, c in zip(prompts, continuations, strict=True)]
    out, row = [], 0
    with torch.inference_mode():
        hidden = ex.forward_prompts(seqs)
        for p, c in zip(prompts, continuations):
            rows = hidden[row + len(p) - 1 : row + len(p) - 1 + len(c)]
            out.append(ex.model.compute_logits(rows).argmax(-1).tolist())
            row += len(p) + len(c) - 1
    return out


def position_agreement(ref: list[list[int]], got: list[list[int]]) -> float:
    pairs = [(x, y) for a, b in zip(ref, got, strict=True) for x, y in zip(a, b, strict=True)]
    return sum(x == y for x, y in pairs) / len(pairs)


def dequantized_hf(hf, llm):
    """A copy of the HF model with the engine's quantized projections, dequantized (the fused qkv / gate_up rows
    split back into q, k, v / gate, up)."""
    import copy

    model = copy.deepcopy(hf)
    with torch.no_grad():
        for layer, ours in zip(model.model.layers, llm.engine.executor.model.layers, strict=True):
            attn, mlp = layer.self_attn, layer.mlp
            qkv = ours.self_attn.qkv_proj.dequantized_weight()
            sizes = [attn.q_proj.out_features, attn.k_proj.out_features, attn.v_proj.out_features]
            for linear, w in zip((attn.q_proj, attn.k_proj, attn.v_proj), qkv.split(sizes), strict=True):
                linear.weight.copy_(w)
            attn.o_proj.weight.copy_(ours.self_attn.o_proj.dequantized_weight())
            gate, up = ours.mlp.gate_up_proj.dequantized_weight().chunk(2)
            mlp.gate_proj.weight.copy_(gate)
            mlp.up_proj.weight.copy_(up)
            mlp.down_proj.weight.copy_(ours.mlp.down_proj.dequantized_weight())
    return model
