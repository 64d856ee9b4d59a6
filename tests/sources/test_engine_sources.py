"""The engine serves a tiny real model fetched from the local Hub and from S3 exactly as it serves the same folder
loaded locally (greedy, float32), through LLM(...) and through `hetero-infer serve` (which fetches the model
once, before its engine process and its tokenizer load it)."""

from __future__ import annotations

import json
import os

import pytest
from hub_server import Repo
from s3_store import put_objects
from server_proc import ServerProcess, http

from hetero_infer import LLM, SamplingParams

PROMPTS = [[1, 17, 256, 4000, 12], [9, 8, 7]]
ENGINE = dict(device="cpu", dtype="float32", max_num_blocks=64, block_size=8)


def _greedy(model: str) -> tuple[str, list[list[int]], list[str]]:
    llm = LLM(model, **ENGINE)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    outs = [o.outputs[0] for o in llm.generate(prompt_token_ids=PROMPTS, sampling_params=params)]
    return llm.engine.model_name, [o.token_ids for o in outs], [o.text for o in outs]


@pytest.fixture(scope="module")
def local_greedy(tiny_folder) -> tuple[list[list[int]], list[str]]:
    return _greedy(str(tiny_folder))[1:]


def test_llm_from_the_hub_and_s3_equals_the_local_folder(hub_env, s3_env, tiny_files, local_greedy):
    hub_env.repos["org/tiny"] = Repo()
    hub_env.repos["org/tiny"].add_commit(tiny_files)
    put_objects(s3_env, "models", "tiny-llama", tiny_files)
    assert _greedy("hf://org/tiny") == ("org/tiny", *local_greedy)
    assert _greedy("s3://models/tiny-llama") == ("tiny-llama", *local_greedy)


@pytest.mark.slow  # a server start with a real engine (about a minute on 2 loaded cores)
def test_serve_a_hub_model(hub_env, tiny_files, local_greedy):
    hub_env.repos["org/tiny"] = Repo()
    hub_env.repos["org/tiny"].add_commit(tiny_files)
    server = ServerProcess("--model", "hf://org/tiny", "--device", "cpu", "--dtype", "float32",
                           "--max-num-blocks", "64", executor="torch", start_timeout=240)
    try:
        assert [m["id"] for m in http("GET", server.base_url + "/models").json()["data"]] == ["org/tiny"]
        got = http("POST", server.base_url + "/completions", {
            "model": "org/tiny", "prompt": PROMPTS[0], "max_tokens": 8, "temperature": 0, "ignore_eos": True}).json()
        assert got["choices"][0]["text"] == local_greedy[1][0]
        downloads = [r for r in server.records() if r.get("msg", "").startswith("downloading hf://org/tiny")]
        asked = [path for _, path in hub_env.requests if path == "/api/models/org/tiny/revision/main"]
        assert len(downloads) == 1 and len(asked) == 2  # fetched once (model_source, then snapshot_download),
        # not again by the engine process nor for the server's tokenizer
    finally:
        server.stop()


def test_serve_a_missing_model_exits_with_one_line(hub_env):
    from cli_process import CliProcess

    proc = CliProcess("serve", "--port", "0", "--log-format", "json", "--model", "hf://org/missing")
    assert proc.proc.wait(120) == 1
    errors = [json.loads(line) for line in proc.lines if line.startswith("{") and '"error"' in line]
    assert [e["msg"] for e in errors] == [
        "could not load the engine: ModelSourceError: hf://org/missing: repository not found or not authorized "
        "(HTTP 401): check the name, and set HF_TOKEN for a private repository"]
    assert "Traceback" not in proc.log() and os.environ["HF_ENDPOINT"]


def test_llm_with_dummy_weights_from_the_hub_downloads_no_weights(hub_env, tiny_files):
    hub_env.repos["org/tiny"] = Repo()
    hub_env.repos["org/tiny"].add_commit(tiny_files)
    llm = LLM("hf://org/tiny", load_format="dummy", **ENGINE)
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    out = llm.generate(prompt_token_ids=PROMPTS[:1], sampling_params=params)[0].outputs[0]
    assert len(out.token_ids) == 4 and out.text  # the tokenizer came from the Hub
    fetched = [path for method, path in hub_env.requests if "/resolve/" in path]
    assert fetched and not any(path.endswith(".safetensors") for path in fetched)
