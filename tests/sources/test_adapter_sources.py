"""LoRA adapters from the Hub and from S3, through the same code and caches as models (`fetch_model(...,
adapter=True)`; the server's --lora-modules and load endpoint and the operator's adapter download use it): only
the adapter's files, and a clear refusal for a folder that holds no adapter or a model given as an adapter."""

from __future__ import annotations

import os

import pytest
from hub_server import Repo
from s3_store import put_objects

from hetero_infer.model_source import ModelSourceError, fetch_model, main

ADAPTER_FILES = {
    "adapter_config.json": b'{"peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]}',
    "adapter_model.safetensors": b"\1" * 50_000,
    "README.md": b"# an adapter\n",
    "training_args.bin": b"\0" * 1000,
}
FETCHED = {"adapter_config.json", "adapter_model.safetensors"}


def test_an_adapter_from_the_hub(hub_env, capsys):
    repo = Repo()
    repo.add_commit(ADAPTER_FILES)
    hub_env.repos["org/sql-lora"] = repo
    folder, name = fetch_model("hf://org/sql-lora", adapter=True)
    assert name == "org/sql-lora" and set(os.listdir(folder)) == FETCHED
    assert (folder / "adapter_model.safetensors").read_bytes() == ADAPTER_FILES["adapter_model.safetensors"]
    with pytest.raises(ModelSourceError, match=r"^hf://org/sql-lora: no config.json at its top level: not a "
                                               r"Hugging Face model$"):
        fetch_model("hf://org/sql-lora")  # an adapter is not a model
    assert main(["hf://org/sql-lora", "--adapter"]) == 0  # the operator's download Job
    assert capsys.readouterr().out.strip() == str(folder)


def test_an_adapter_from_s3_and_a_model_is_not_an_adapter(s3_env, model_files):
    put_objects(s3_env, "adapters", "team/sql", ADAPTER_FILES)
    folder, name = fetch_model("s3://adapters/team/sql", adapter=True)
    assert name == "sql" and {p for p in os.listdir(folder) if not p.startswith(".")} == FETCHED
    put_objects(s3_env, "models", "tiny", model_files)
    with pytest.raises(ModelSourceError, match=r"^s3://models/tiny: no adapter_config.json at its top level: "
                                               r"not a PEFT adapter$") as info:
        fetch_model("s3://models/tiny", adapter=True)
    assert info.value.permanent
