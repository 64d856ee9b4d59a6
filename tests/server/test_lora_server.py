"""LoRA adapters through the official `openai` client against real `hetero-infer serve` processes, with a tiny
random-weight llama and real PEFT adapters (peft makes them):

- on the torch executor, where the test claims engine output: an adapter's greedy float32 tokens are transformers
  + peft's (`PeftModel`), alone and with concurrent requests for the base model and another adapter;

on the mock executor (which reads and refuses adapters as the torch executor does, and salts an adapter's tokens so
they differ from the base's):

- `/v1/models` with `parent` and `root`; a request's model naming an adapter reaches the engine as that adapter;
- load and unload at run time, and a 400 that changes nothing for each bad adapter (a name taken or the base's, a
  rank above --max-lora-rank, no adapter files, target modules the model lacks, another base model);
- the endpoints absent without --allow-runtime-lora-updating and behind the API key, `vllm:lora_requests_info` as
  the inference gateway reads it, per-adapter counts, --lora-modules-file followed while the worker runs, and the
  options refused before anything starts."""

from __future__ import annotations

import json
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_proc import ServerProcess, http

_TESTS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(_TESTS / "lora"))
sys.path.insert(0, str(_TESTS / "quant"))
from lora_testing import edit_adapter_config, peft_reference, save_adapter  # noqa: E402
from quant_testing import hf_greedy, save_tiny_model  # noqa: E402

PROMPT = [1, 520, 3451, 314, 4911, 42, 17, 905]
MAX_NEW = 8


@pytest.fixture(scope="module")
def lora_files(tmp_path_factory) -> dict[str, Path]:
    """The tiny llama, its adapters (two ranks; one too large; one with a module the model lacks; an empty folder)
    and an adapter of another base model (a llama of hidden size 96)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    root = tmp_path_factory.mktemp("lora-server")
    base = save_tiny_model("llama", root / "model")
    torch.manual_seed(0)
    wide = AutoModelForCausalLM.from_config(LlamaConfig(vocab_size=512, hidden_size=96, intermediate_size=128,
                                                        num_hidden_layers=2, num_attention_heads=4,
                                                        num_key_value_heads=2))
    files = {"model": root / "model"}
    files["sql"] = save_adapter(base, root / "sql", r=8, targets=["q_proj", "v_proj"], seed=1)
    files["chat"] = save_adapter(base, root / "chat", r=16, targets=["q_proj", "k_proj", "o_proj", "down_proj"],
                                 alpha=8.0, seed=2)
    files["rank32"] = save_adapter(base, root / "rank32", r=32, targets=["q_proj"], seed=3)
    files["other"] = save_adapter(wide, root / "other", r=8, targets=["q_proj"], seed=4)
    files["lacks"] = Path(shutil.copytree(files["sql"], root / "lacks"))
    edit_adapter_config(files["lacks"], target_modules=["q_proj", "v_proj", "lm_head_proj"])
    files["empty"] = root / "empty"
    files["empty"].mkdir()
    files["base"] = base
    return files


@pytest.fixture(scope="module")
def torch_client(lora_files) -> Iterator[openai.OpenAI]:
    s = ServerProcess("--model", str(lora_files["model"]), "--served-model-name", "tiny", "--dtype", "float32",
                      "--device", "cpu", "--enable-lora", "--max-loras", "2", "--max-lora-rank", "16",
                      "--lora-modules", f"sql={lora_files['sql']}", f"chat={lora_files['chat']}",
                      "--skip-tokenizer-init", executor="torch")
    yield openai.OpenAI(base_url=s.base_url, api_key="unused", max_retries=0, timeout=120)
    assert s.stop() == 0, s.log()


def test_an_adapters_greedy_tokens_are_transformers_and_peft(torch_client, lora_files):
    base = lora_files["base"]
    want = {"tiny": hf_greedy(base, PROMPT, MAX_NEW),
            "sql": hf_greedy(peft_reference(base, lora_files["sql"]), PROMPT, MAX_NEW),
            "chat": hf_greedy(peft_reference(base, lora_files["chat"]), PROMPT, MAX_NEW)}
    assert len({tuple(t) for t in want.values()}) == 3  # each adapter changes the tokens (else this proves nothing)
    assert tokens_of(torch_client, "sql") == want["sql"]
    results: list[tuple[str, list[int]]] = []
    threads = [threading.Thread(target=lambda m=m: results.append((m, tokens_of(torch_client, m))))
               for m in ("tiny", "sql", "chat") * 2]  # concurrent: the engine batches them together
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 6 and all(tokens == want[m] for m, tokens in results), results


@pytest.fixture(scope="module")
def lora_server(lora_files) -> Iterator[ServerProcess]:
    s = ServerProcess("--model", str(lora_files["model"]), "--served-model-name", "tiny", "--enable-lora",
                      "--max-loras", "2", "--max-lora-rank", "16", "--lora-modules", f"sql={lora_files['sql']}",
                      "--allow-runtime-lora-updating", "--skip-tokenizer-init")
    yield s
    assert s.stop() == 0, s.log()


@pytest.fixture(scope="module")
def client(lora_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=lora_server.base_url, api_key="unused", max_retries=0, timeout=60)


def served(client: openai.OpenAI) -> dict[str, dict]:
    return {m.id: m.model_dump() for m in client.models.list().data}


def load(client: openai.OpenAI, name: str, path: Path | str) -> str:
    return client.post("/load_lora_adapter", body={"lora_name": name, "lora_path": str(path)}, cast_to=str)


def unload(client: openai.OpenAI, name: str) -> str:
    return client.post("/unload_lora_adapter", body={"lora_name": name}, cast_to=str)


def tokens_of(client: openai.OpenAI, model: str) -> list[int]:
    """The greedy completion's token ids (the server runs without a tokenizer: token ids in, token ids out)."""
    r = client.completions.with_raw_response.create(model=model, prompt=PROMPT, max_tokens=MAX_NEW, temperature=0,
                                                    extra_body={"ignore_eos": True})
    body = json.loads(r.text)
    assert body["model"] == model and body["choices"][0]["finish_reason"] == "length"
    return body["choices"][0]["token_ids"]


def test_models_list_the_adapters_with_their_parent(client, lora_files):
    cards = served(client)
    assert set(cards) == {"tiny", "sql"}
    assert cards["sql"]["parent"] == "tiny" and cards["sql"]["root"] == str(lora_files["sql"])
    assert cards["tiny"].get("parent") is None
    assert client.models.retrieve("sql").id == "sql"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-adapter", prompt="x", max_tokens=1)


def test_a_request_for_an_adapter_runs_with_it(client):
    base, sql = tokens_of(client, "tiny"), tokens_of(client, "sql")
    assert sql != base  # the mock salts an adapter's tokens: the request reached the engine as "sql"
    assert tokens_of(client, "sql") == sql


def test_load_and_unload_at_run_time(client, lora_files):
    sql = tokens_of(client, "sql")
    assert load(client, "chat", lora_files["chat"]) == "Success: LoRA adapter 'chat' added successfully."
    assert served(client)["chat"]["parent"] == "tiny"
    assert tokens_of(client, "chat") not in (sql, tokens_of(client, "tiny"))
    assert unload(client, "chat") == "Success: LoRA adapter 'chat' removed successfully."
    assert "chat" not in served(client)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="chat", prompt="x", max_tokens=1)
    with pytest.raises(openai.NotFoundError, match="cannot be found"):
        unload(client, "chat")
    assert tokens_of(client, "sql") == sql  # the others serve on


@pytest.mark.parametrize(("name", "path_key", "words"), [
    ("sql", "chat", "has already been loaded"),
    ("tiny", "chat", "base model's name"),
    ("big", "rank32", "rank"),
    ("none", "empty", "adapter_config.json"),
    ("lacks", "lacks", "lm_head_proj"),
    ("other", "other", "96"),
])
def test_a_bad_adapter_is_a_400_that_changes_nothing(client, lora_files, name, path_key, words):
    before, sql = served(client), tokens_of(client, "sql")
    with pytest.raises(openai.BadRequestError) as info:
        load(client, name, lora_files[path_key])
    assert words in info.value.message, info.value.message
    assert served(client) == before
    assert tokens_of(client, "sql") == sql


def test_an_adapter_declared_for_another_base_is_a_400(client, lora_files):
    before = served(client)
    with pytest.raises(openai.BadRequestError, match="is for base model 'org/other'"):
        client.post("/load_lora_adapter", cast_to=str, body={
            "lora_name": "chat", "lora_path": str(lora_files["chat"]), "base_model_name": "org/other"})
    assert served(client) == before


# -- more of the HTTP behaviour ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mock_lora(lora_files, tmp_path_factory) -> Iterator[tuple[ServerProcess, Path]]:
    listing = tmp_path_factory.mktemp("listing") / "adapters.json"
    s = ServerProcess("--model", str(lora_files["model"]), "--served-model-name", "tiny", "--enable-lora",
                      "--max-loras", "2", "--lora-modules", f"sql={lora_files['sql']}",
                      "--lora-modules-file", str(listing), "--mock-step-latency-s", "0.02", "--api-key", "k")
    yield s, listing
    assert s.stop() == 0, s.log()


def test_the_endpoints_exist_only_when_allowed_and_behind_the_key(mock_lora, lora_files):
    server, _ = mock_lora
    body = {"lora_name": "chat", "lora_path": str(lora_files["chat"])}
    assert http("POST", server.base_url + "/load_lora_adapter", body).status == 401  # the key first
    refused = http("POST", server.base_url + "/load_lora_adapter", body, headers={"Authorization": "Bearer k"})
    assert refused.status == 404  # not --allow-runtime-lora-updating: no such route, as vLLM
    schema = http("GET", server.url + "/openapi.json").json()
    assert "/v1/load_lora_adapter" not in schema["paths"]


def lora_info(server: ServerProcess) -> dict[str, str]:
    text = http("GET", server.url + "/metrics").text
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == "vllm:lora_requests_info"]
    assert family.type == "gauge"
    (sample,) = family.samples  # one label set: the current one
    assert abs(sample.value - time.time()) < 60  # its value is the time of the state
    return sample.labels


def test_lora_requests_info_names_the_running_adapter(mock_lora):
    server, _ = mock_lora
    client = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0, timeout=60)
    assert lora_info(server) == {"max_lora": "2", "running_lora_adapters": "", "waiting_lora_adapters": ""}
    seen: list[dict[str, str]] = []
    done = threading.Event()

    def scrape() -> None:
        while not done.is_set():
            seen.append(lora_info(server))
            time.sleep(0.05)

    scraper = threading.Thread(target=scrape)
    scraper.start()
    try:
        stream = client.completions.create(model="sql", prompt="hello", max_tokens=40, stream=True,
                                           extra_body={"ignore_eos": True})
        assert sum(1 for _ in stream) > 1
    finally:
        done.set()
        scraper.join()
    assert any(s["running_lora_adapters"] == "sql" for s in seen), seen
    samples = {(f.name, s.name, s.labels.get("lora_name")): s.value
               for f in text_string_to_metric_families(http("GET", server.url + "/metrics").text)
               for s in f.samples}
    assert samples[("hetero_infer_lora_requests", "hetero_infer_lora_requests_total", "sql")] >= 1
    assert samples[("hetero_infer_lora_adapters_loaded", "hetero_infer_lora_adapters_loaded", None)] >= 1


def served_by_metrics(server) -> set[str]:
    """The adapters the worker's /metrics says it serves (no API key needed there)."""
    from hetero_infer.contracts.metric_names import LORA_ADAPTER_SERVED

    return {s.labels["lora_name"] for f in text_string_to_metric_families(http("GET", server.url + "/metrics").text)
            for s in f.samples if s.name == LORA_ADAPTER_SERVED and s.value == 1}


def test_the_modules_file_is_followed(mock_lora, lora_files):
    server, listing = mock_lora
    headers = {"Authorization": "Bearer k"}

    def models() -> set[str]:
        return {c["id"] for c in http("GET", server.base_url + "/models", headers=headers).json()["data"]}

    def wait(what: str, predicate) -> None:
        deadline = time.monotonic() + 30
        while not predicate():
            assert time.monotonic() < deadline, f"timed out: {what}\n{server.log()[-3000:]}"
            time.sleep(0.2)

    listing.write_text(json.dumps([{"name": "chat", "path": str(lora_files["chat"])}, f"big={lora_files['rank32']}"]))
    wait("chat loaded", lambda: "chat" in models())
    assert "big" not in models()  # rank 32 above the default --max-lora-rank 16: logged, not served
    wait("the refusal logged", lambda: "big" in server.log() and "rank" in server.log())
    assert served_by_metrics(server) == models() - {"tiny"}  # /metrics names what /v1/models lists (the operator reads it)
    listing.write_text("[]")
    wait("chat unloaded", lambda: models() == {"tiny", "sql"})  # sql came from --lora-modules: left alone
    assert served_by_metrics(server) == {"sql"}


def test_lora_options_are_checked_before_anything_starts():
    from hetero_infer.worker.server.cli import build_parser, resolve_options

    def resolve(*argv: str, environ: dict[str, str] | None = None):
        return resolve_options(build_parser().parse_args(list(argv)), environ=environ or {})

    with pytest.raises(ValueError, match="--lora-modules serves LoRA adapters: it needs --enable-lora"):
        resolve("--lora-modules", "a=/x")
    with pytest.raises(ValueError, match="neither NAME=PATH nor a JSON object"):
        resolve("--enable-lora", "--lora-modules", "just-a-path")
    with pytest.raises(ValueError, match="given twice"):
        resolve("--enable-lora", "--lora-modules", "a=/x", "a=/y")
    options, _ = resolve("--enable-lora", "--lora-modules", "a=/x", '{"name": "b", "path": "hf://org/b"}',
                         "--lora-modules", "c=s3://bucket/c")
    assert options.lora_modules == ["a=/x", '{"name": "b", "path": "hf://org/b"}', "c=s3://bucket/c"]
    assert not options.allow_runtime_lora_updating
    options, _ = resolve("--enable-lora", environ={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"})
    assert options.allow_runtime_lora_updating  # vLLM's variable
    with pytest.raises(ValueError, match="needs --enable-lora"):
        resolve(environ={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true"})
