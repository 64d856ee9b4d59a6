"""LoRA adapters from the Hub and from S3, through the same code and caches as models (`fetch_model(...,
adapter=True)`; the server's --lora-modules and load endpoint and the operator's adapter download use it): only
the adapter's files, a clear refusal for a folder that holds no adapter or a model given as an adapter, and a
worker loading adapters by hf:// and s3:// paths."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hub_server import Repo
from s3_store import put_objects

from hetero_infer.model_source import ModelSourceError, fetch_model, main

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "lora"))  # lora_testing: PEFT adapters

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


async def test_the_server_loads_adapters_from_the_hub_and_s3(hub_env, s3_env, tiny_folder, tmp_path):
    """`POST /v1/load_lora_adapter` with an hf:// and an s3:// lora_path: fetched into the caches and served (a mock
    engine over the tiny llama, which checks the adapters' shapes against its config)."""
    import aiohttp
    from inproc_server import inproc_server
    from lora_testing import save_adapter
    from transformers import AutoModelForCausalLM

    from hetero_infer.contracts.engine_options import EngineConfig
    from hetero_infer.worker.core.engine import LLMEngine

    adapter = save_adapter(AutoModelForCausalLM.from_pretrained(tiny_folder), tmp_path / "sql", r=4,
                           targets=["q_proj"])
    files = {p.name: p.read_bytes() for p in adapter.iterdir() if p.is_file()}
    repo = Repo()
    repo.add_commit(files)
    hub_env.repos["org/sql-lora"] = repo
    put_objects(s3_env, "adapters", "team/sql", files)
    engine = LLMEngine(EngineConfig(model=str(tiny_folder), served_model_name="tiny", executor="mock",
                                    enable_lora=True, max_model_len=128))
    async with inproc_server(engine, allow_runtime_lora_updating=True) as url, aiohttp.ClientSession() as s:
        for name, path in (("hub", "hf://org/sql-lora"), ("s3", "s3://adapters/team/sql")):
            async with s.post(url + "/v1/load_lora_adapter", json={"lora_name": name, "lora_path": path}) as r:
                assert r.status == 200, await r.text()
        async with s.post(url + "/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "hf://org/none"}) as r:
            assert r.status == 400 and "hf://org/none: repository not found" in (await r.json())["error"]["message"]
        async with s.get(url + "/v1/models") as r:
            cards = {c["id"]: c for c in (await r.json())["data"]}
        async with s.post(url + "/v1/completions", json={"model": "s3", "prompt": [1, 2, 3], "max_tokens": 2}) as r:
            assert r.status == 200 and (await r.json())["model"] == "s3"
    assert {k: (c.get("root"), c.get("parent")) for k, c in cards.items()} == {
        "tiny": (str(tiny_folder), None), "hub": ("hf://org/sql-lora", "tiny"), "s3": ("s3://adapters/team/sql", "tiny")}
