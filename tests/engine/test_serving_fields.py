"""What the mock executor's engine reads of a model's config.json without the config class
(`loader.serving_fields`): the same context length, vocabulary and EOS ids as transformers' config class gives
the engine, or nothing (the class is loaded then), for each supported architecture and the ways a checkpoint
states or leaves out its sliding window."""

from __future__ import annotations

import json

import pytest

from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.worker.core.engine import _max_model_len
from hetero_infer.worker.runner.loader import load_hf_config, resolve_model, serving_fields

BASE = {"max_position_embeddings": 4096, "vocab_size": 1000, "eos_token_id": 2, "hidden_size": 64,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "intermediate_size": 128}
CASES = [
    ("llama", {}), ("llama", {"sliding_window": 512}), ("llama", {"eos_token_id": [2, 7]}),
    ("mistral", {"sliding_window": 512}), ("mistral", {"sliding_window": None}), ("mistral", {}),
    ("qwen2", {"sliding_window": 512, "use_sliding_window": False}),
    ("qwen2", {"sliding_window": 512, "use_sliding_window": True}), ("qwen2", {"sliding_window": 512}),
    ("qwen2", {}), ("qwen3", {"sliding_window": 512, "use_sliding_window": True}), ("qwen3", {"sliding_window": 512}),
    ("llama", {"max_position_embeddings": None}), ("qwen3", {"vocab_size": None}),
]


@pytest.mark.parametrize("model_type, changes", CASES)
def test_the_fields_are_the_config_class_s_or_none(tmp_path, model_type, changes):
    raw = {**BASE, "model_type": model_type, **changes}
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in raw.items() if v is not None}))
    fields, whole = serving_fields(tmp_path), load_hf_config(tmp_path)
    if fields is None:  # only where the checkpoint leaves something to the class
        assert (any(v is None for v in changes.values()) or (model_type == "mistral" and not changes)
                or (model_type.startswith("qwen") and "sliding_window" in changes and "use_sliding_window" not in changes))
        return
    for max_model_len in (None, 256):
        config = EngineConfig(executor="mock", max_model_len=max_model_len)
        assert _max_model_len(config, fields) == _max_model_len(config, whole)
    assert (fields.vocab_size, fields.eos_token_id) == (whole.vocab_size, whole.eos_token_id)


def test_an_unsupported_model_is_refused_as_before(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**BASE, "model_type": "gpt2"}))
    with pytest.raises(ValueError, match=r"unsupported architecture .*\(model_type 'gpt2'\).*supported: LlamaForCausalLM"):
        serving_fields(tmp_path)


def test_the_mock_engine_loads_no_model_config_class(model_config_imports):
    """The default model's config states every field: a mock engine imports no Llama config class (none beyond
    those transformers imports for any tokenizer: none, with transformers 5.24)."""
    assert serving_fields(resolve_model(None)[0]) is not None
    extra, printed = model_config_imports("from hetero_infer.contracts.engine_options import EngineConfig\n"
                                          "from hetero_infer.worker.core.engine import LLMEngine\n"
                                          "print(LLMEngine(EngineConfig(executor='mock')).max_model_len)")
    assert extra == set()
    assert int(printed.splitlines()[-1]) == load_hf_config(resolve_model(None)[0]).max_position_embeddings
