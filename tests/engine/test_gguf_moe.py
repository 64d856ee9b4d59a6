"""A Qwen3-MoE GGUF (the tensors as llama.cpp names them: stacked ffn_{gate,up,down}_exps, ffn_gate_inp) loads
through the gguf package and transformers' mapping into our engine: greedy float32 tokens equal transformers' on
the model the GGUF was written from, and on transformers' own load of the GGUF."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hetero_infer import LLM, SamplingParams
from hetero_infer.default_model import default_model_gguf
from tests.engine.test_hf_equivalence import MAX_NEW, hf_greedy, random_prompts

# transformers maps no `expert_feed_forward_length`: a Qwen3-MoE GGUF gets the config class's default
# moe_intermediate_size (768, Qwen3-30B-A3B's), so the tiny model has experts of that size
EXPERT_I = 768


def _config():
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, moe_intermediate_size=EXPERT_I,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                          num_experts=4, num_experts_per_tok=2, norm_topk_prob=True, max_position_embeddings=512,
                          rms_norm_eps=1e-6, initializer_range=0.15, tie_word_embeddings=False,
                          use_sliding_window=False)


def _copy_tokenizer(src, writer) -> None:
    """The default model's tokenizer fields (a GGUF conversion needs one)."""
    import gguf

    for name, field in src.fields.items():
        if not name.startswith("tokenizer."):
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            strings = field.types[-1] == gguf.GGUFValueType.STRING
            writer.add_array(name, [field.parts[i].tobytes().decode() if strings else field.parts[i].tolist()[0]
                                    for i in field.data])
        elif kind == gguf.GGUFValueType.STRING:
            writer.add_string(name, field.parts[field.data[0]].tobytes().decode())
        else:
            writer.add_key_value(name, field.parts[field.data[0]].tolist()[0], kind)


def write_qwen3moe_gguf(model, path) -> None:
    import gguf

    cfg, a = model.config, "qwen3moe"
    w = gguf.GGUFWriter(str(path), a)
    for key, value in {"context_length": cfg.max_position_embeddings, "embedding_length": cfg.hidden_size,
                       "block_count": cfg.num_hidden_layers, "feed_forward_length": cfg.intermediate_size,
                       "expert_feed_forward_length": EXPERT_I, "attention.head_count": cfg.num_attention_heads,
                       "attention.head_count_kv": cfg.num_key_value_heads, "attention.key_length": cfg.head_dim,
                       "attention.value_length": cfg.head_dim, "expert_count": cfg.num_experts,
                       "expert_used_count": cfg.num_experts_per_tok}.items():
        w.add_uint32(f"{a}.{key}", value)
    w.add_float32(f"{a}.rope.freq_base", float(cfg.rope_parameters["rope_theta"]))
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", cfg.rms_norm_eps)
    _copy_tokenizer(gguf.GGUFReader(str(default_model_gguf())), w)
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    w.add_tensor("output.weight", sd["lm_head.weight"])
    names = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "attn_q": "self_attn.q_proj",
             "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
             "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm", "ffn_gate_inp": "mlp.gate"}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        for ours, theirs in names.items():
            w.add_tensor(f"blk.{i}.{ours}.weight", sd[p + theirs + ".weight"])
        gate_up = sd[p + "mlp.experts.gate_up_proj"]  # [E, 2I, H]: llama.cpp keeps gate and up apart
        w.add_tensor(f"blk.{i}.ffn_gate_exps.weight", np.ascontiguousarray(gate_up[:, :EXPERT_I]))
        w.add_tensor(f"blk.{i}.ffn_up_exps.weight", np.ascontiguousarray(gate_up[:, EXPERT_I:]))
        w.add_tensor(f"blk.{i}.ffn_down_exps.weight", sd[p + "mlp.experts.down_proj"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.slow  # ~3.5 min on 2 loaded cores (the GGUF's tokenizer conversion); the default suite converts the
# default model's GGUF (tests/engine/test_load_format.py), the same path but for transformers' expert mapping
def test_qwen3_moe_gguf_matches_transformers(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("HETERO_INFER_MODEL_CACHE", str(tmp_path / "cache"))
    torch.manual_seed(1234)
    hf = AutoModelForCausalLM.from_config(_config(), dtype=torch.float32).eval()
    path = tmp_path / "tiny-qwen3moe.gguf"
    write_qwen3moe_gguf(hf, path)
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, dtype=torch.float32).eval()
    ids = torch.tensor([random_prompts([12], seed=3)[0]])
    assert torch.equal(theirs(ids).logits, hf(ids).logits)  # the GGUF holds the model, as transformers reads it
    prompts = random_prompts([3, 17, 30], seed=4)
    llm = LLM(str(path), device="cpu", dtype="float32", block_size=8)
    assert llm.engine.executor.model.family.name == "qwen3_moe"
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    ours = [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=prompts, sampling_params=params)]
    assert ours == [hf_greedy(hf, p) for p in prompts]


def test_families_without_a_gguf_mapping_say_so():
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    from hetero_infer.worker.runner.models.registry import families

    assert {f.name for f in families() if not f.supports.gguf} == {"mixtral"}
    assert "mixtral" not in GGUF_CONFIG_MAPPING and {"qwen3_moe", "qwen2_moe"} <= set(GGUF_CONFIG_MAPPING)
