"""Helpers of the LoRA tests: tiny random-weight HF models saved with the default tokenizer, and random, non-zero
PEFT adapters made by peft itself (`get_peft_model`, lora_B drawn at random, `save_pretrained`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from hetero_infer.worker.runner.loader import resolve_model

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
VOCAB = 49152  # the default tokenizer's

ALL_LINEAR = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def tiny_config(arch: str):
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config, Qwen3MoeConfig

    if arch == "llama":
        return LlamaConfig(vocab_size=VOCAB, tie_word_embeddings=False, **TINY)
    if arch == "llama-wide":  # another base: a hidden size the adapters of "llama" do not fit
        return LlamaConfig(vocab_size=VOCAB, tie_word_embeddings=False, **{**TINY, "hidden_size": 96})
    if arch == "qwen2":  # q/k/v biases
        return Qwen2Config(vocab_size=VOCAB, tie_word_embeddings=True, use_sliding_window=False, **TINY)
    if arch == "qwen3":  # per-head q/k RMSNorm, a head dim of its own
        return Qwen3Config(vocab_size=VOCAB, tie_word_embeddings=False, head_dim=24, use_sliding_window=False, **TINY)
    if arch == "qwen3-moe":
        return Qwen3MoeConfig(vocab_size=VOCAB, tie_word_embeddings=False, head_dim=16, use_sliding_window=False,
                              num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, **TINY)
    raise KeyError(arch)


def save_tiny_model(arch: str, folder: Path, seed: int = 1234):
    """The float32 HF model, saved to `folder` with the default model's tokenizer."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch), dtype=torch.float32).eval()
    model.save_pretrained(folder, safe_serialization=True)
    default_folder, _ = resolve_model(None)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(default_folder / name, folder / name)
    return model


def save_adapter(base, folder: Path, *, r: int, targets: list[str], alpha: float = 16.0, rslora: bool = False,
                 seed: int = 0, std: float = 0.2) -> Path:
    """A PEFT LoRA adapter of `base` with random A and B (peft leaves B zero: an adapter that changes nothing),
    saved by peft to `folder`."""
    import copy

    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    config = LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0, use_rslora=rslora,
                        task_type="CAUSAL_LM")
    peft_model = get_peft_model(copy.deepcopy(base), config)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                p.normal_(0.0, std)
    peft_model.save_pretrained(folder)
    return folder


def edit_adapter_config(folder: Path, **changes) -> None:
    path = folder / "adapter_config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def peft_reference(base, adapter: Path):
    """transformers + peft: the reference model of `adapter` on `base` (float32, eval)."""
    import copy

    from peft import PeftModel

    return PeftModel.from_pretrained(copy.deepcopy(base), str(adapter)).eval()


def hf_greedy(model, prompt: list[int], max_new: int) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new,
                             min_new_tokens=max_new, do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()
