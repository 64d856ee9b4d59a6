"""The model registry: families found by their HF architecture names, one clear error otherwise, capability
flags that agree with the kernels, no `model_type` branches in shared code; and each family's parameter count on
its published config (benchmarks/shapes/) equal to transformers' on the meta device."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from hetero_infer.kernels.cpu import decode_step
from hetero_infer.worker.runner.loader import load_model, model_family
from hetero_infer.worker.runner.models.registry import families, family_of

ROOT = Path(__file__).resolve().parents[2]
SHAPES = ROOT / "benchmarks" / "shapes"


def test_every_family_is_found_by_its_architectures_and_model_types():
    names = [f.name for f in families()]
    assert names == ["llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "mixtral"]
    for family in families():
        for arch in family.architectures:
            assert family_of({"architectures": [arch], "model_type": "whatever"}) is family
            assert family.model_class.__name__ == arch
        for model_type in family.model_types:
            assert family_of({"model_type": model_type}) is family  # a config.json without `architectures`
    # an unknown architecture is not rescued by a known model_type
    with pytest.raises(ValueError, match=r"unsupported architecture LlamaForSequenceClassification .*supported: "
                                         r"LlamaForCausalLM \(Llama 2/3, SmolLM\), MistralForCausalLM"):
        family_of({"architectures": ["LlamaForSequenceClassification"], "model_type": "llama"})


def test_capabilities_agree_with_the_code():
    for family in families():
        cls, supports = family.model_class, family.supports
        assert supports.cpu_fused_decode == (cls.decode_layout in decode_step.LAYOUTS), family.name
        assert supports.moe == (cls.decode_layout == "moe"), family.name
        assert set(supports.quantization) <= {"int8", "int4"}
        assert supports.lora  # attention, and the MLPs of dense families (tests/lora)
        assert supports.tensor_parallel  # every family's layers are the shared decoder's (tests/tp)


def test_shared_code_has_no_model_type_branches():
    shared = ["worker/runner/models/decoder.py", "worker/runner/models/moe.py", "worker/runner/loader.py",
              "worker/quant/quantize.py", "worker/quant/experts.py", "kernels/cpu/decode_step.py"]
    for path in shared:
        text = (ROOT / path).read_text()
        assert not re.search(r"model_type\s*(==|!=|in\b|not in\b)", text), path
        assert "self_attn" not in text or path.endswith("decoder.py"), path  # only the decoder walks its modules


def _count(params) -> int:
    return sum(p.numel() for p in params)


@pytest.mark.parametrize("shape, total, active", [
    ("qwen3-30b-a3b", 30.5e9, 3.3e9),  # Qwen's model card: 30.5B parameters, 3.3B activated
    ("mixtral-8x7b", 46.7e9, 12.9e9),  # Mistral's announcement: 46.7B total, 12.9B per token
    ("qwen1.5-moe-a2.7b", 14.3e9, 2.7e9),  # Qwen's model card: 14.3B, 2.7B activated (with a shared expert)
    ("qwen3-moe-1b-a0.2b", None, None),
    ("qwen3-0.6b", 0.6e9, None), ("llama-3-8b", 8.0e9, None),
])
def test_parameter_count_equals_transformers_on_the_published_config(shape, total, active):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(SHAPES / shape)
    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(config)
        ours = model_family(config).model_class(config, max_positions=64)
    count = _count(ours.parameters())
    assert count == _count(hf.parameters())
    if total:
        assert abs(count - total) / total < 0.03, count
    if active:  # the experts a token does not use
        raw = json.loads((SHAPES / shape / "config.json").read_text())
        experts = raw.get("num_experts") or raw["num_local_experts"]
        per_expert = 3 * raw["hidden_size"] * (raw.get("moe_intermediate_size") or raw["intermediate_size"])
        idle = raw["num_hidden_layers"] * (experts - raw["num_experts_per_tok"]) * per_expert
        assert abs(count - idle - active) / active < 0.03, count - idle  # (both publishers count the embeddings)


@pytest.mark.parametrize("shape", ["qwen3-moe-1b-a0.2b"])
def test_dummy_weights_load_the_stacked_experts(shape):
    """`load_format="dummy"` names the experts as transformers holds them (stacked): they load, all of them."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(SHAPES / shape)
    config.num_hidden_layers, config.vocab_size = 2, 512
    model = load_model(config, SHAPES / shape, load_format="dummy", device=torch.device("cpu"), dtype=torch.float32,
                       max_positions=64)
    experts = model.layers[1].mlp.experts
    assert experts.gate_up_proj.shape == (64, 768, 1024)
    assert bool((experts.gate_up_proj.abs().amax(dim=(1, 2)) > 0).all())  # every expert filled
    assert model.family.supports.moe


def test_decode_cost_counts_only_the_experts_a_step_reads():
    """The bench's roofline and weight-bandwidth figures: a one-token decode step of Qwen3-30B-A3B reads its active
    parameters (3.3B, norms aside), a large batch all of them; the model's own idle-expert bytes agree."""
    from transformers import AutoConfig

    from hetero_infer.bench.throughput import decode_step_cost
    from hetero_infer.worker.runner.models.moe import idle_expert_bytes

    config = AutoConfig.from_pretrained(SHAPES / "qwen3-30b-a3b")
    with torch.device("meta"):
        model = model_family(config).model_class(config, max_positions=64).to(torch.bfloat16)
    total = _count(model.parameters())
    norms = _count(p for name, p in model.named_parameters() if "norm" in name)
    embedding = model.embed_tokens.weight.numel()  # a step reads a row per token of it (the LM head: all)
    for tokens in (1, 4, 64):
        _, weight_bytes, _ = decode_step_cost(config, torch.bfloat16, [100] * tokens)
        read = 2 * (total - norms - embedding) - idle_expert_bytes(model, tokens)
        assert weight_bytes == pytest.approx(read, rel=1e-6), tokens
    per_expert = 3 * config.hidden_size * config.moe_intermediate_size
    assert idle_expert_bytes(model, 1) == pytest.approx(2 * 48 * 120 * per_expert)
    assert idle_expert_bytes(model, 10_000) < 1e-6 * total  # a large batch reads every expert
