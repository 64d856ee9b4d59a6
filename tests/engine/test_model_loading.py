"""Model folders: sharded safetensors, unsupported architectures, missing weights."""

from __future__ import annotations

import json
import shutil

import pytest

from hetero_infer import LLM, SamplingParams
from hetero_infer.worker.runner.loader import load_hf_config, resolve_model


def test_sharded_checkpoint_loads_like_single_file(tiny_model, tmp_path):
    folder, hf = tiny_model("qwen2")
    sharded = tmp_path / "sharded"
    hf.save_pretrained(sharded, max_shard_size="1MB")
    assert (sharded / "model.safetensors.index.json").is_file()
    for f in folder.glob("tokenizer*"):
        shutil.copy(f, sharded / f.name)
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    prompt = [[101, 2020, 3030, 4040]]
    a = LLM(str(folder), device="cpu", dtype="float32").generate(prompt_token_ids=prompt, sampling_params=params)
    b = LLM(str(sharded), device="cpu", dtype="float32").generate(prompt_token_ids=prompt, sampling_params=params)
    assert a[0].outputs[0].token_ids == b[0].outputs[0].token_ids


def test_unsupported_architecture_names_the_supported_ones(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ValueError, match=r"unsupported architecture GPT2LMHeadModel \(model_type 'gpt2'\).*"
                                         r"Qwen3ForCausalLM.*Qwen3MoeForCausalLM.*MixtralForCausalLM"):
        load_hf_config(tmp_path)


def test_missing_weight_is_reported(tiny_model, tmp_path):
    from safetensors.torch import load_file, save_file

    folder, _ = tiny_model("llama")
    broken = tmp_path / "broken"
    shutil.copytree(folder, broken)
    weights = load_file(broken / "model.safetensors")
    del weights["model.layers.1.mlp.up_proj.weight"]
    save_file(weights, broken / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="missing.*layers.1.mlp.gate_up_proj"):
        LLM(str(broken), device="cpu", dtype="float32")


def test_not_a_model_path_gives_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        resolve_model(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="model not found"):
        resolve_model(str(tmp_path / "nope"))


def test_default_model_folder_from_the_environment(tmp_path, monkeypatch):
    """HETERO_INFER_DEFAULT_MODEL_DIR stands in for the default model (no GGUF conversion); a folder without
    config.json is refused by name."""
    from hetero_infer.worker.runner.loader import DEFAULT_MODEL_ENV, DEFAULT_MODEL_NAME

    (tmp_path / "config.json").write_text("{}")
    monkeypatch.setenv(DEFAULT_MODEL_ENV, str(tmp_path))
    assert resolve_model(None) == (tmp_path, DEFAULT_MODEL_NAME)
    monkeypatch.setenv(DEFAULT_MODEL_ENV, str(tmp_path / "empty"))
    with pytest.raises(FileNotFoundError, match=DEFAULT_MODEL_ENV):
        resolve_model(None)
