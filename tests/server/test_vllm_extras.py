"""vLLM's extra endpoints: /tokenize, /detokenize (checked against transformers' tokenizer and against the usage
the generation endpoints report), /health (503 once the engine is dead) and /version."""

from __future__ import annotations

import asyncio
import importlib.metadata
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from server_proc import ServerProcess, http
from transformers import AutoTokenizer

from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.contracts.server_options import ServerOptions
from hetero_infer.worker.core.engine import LLMEngine
from hetero_infer.worker.runner.loader import resolve_model
from hetero_infer.worker.server.app import create_app
from hetero_infer.worker.server.state import ServerState

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour, ça va?"}]


@pytest.fixture(scope="module")
def hf() -> Any:
    """transformers' tokenizer of the default model: the reference."""
    return AutoTokenizer.from_pretrained(resolve_model(None)[0])


def test_tokenize_prompt_matches_transformers(server: ServerProcess, hf: Any) -> None:
    text = "Héllo wörld 🌍, tokens\tand  spaces"
    for special in (True, False):
        r = http("POST", server.url + "/tokenize", {"prompt": text, "add_special_tokens": special})
        assert r.status == 200, r.text
        body = r.json()
        assert body["tokens"] == hf.encode(text, add_special_tokens=special)
        assert body["count"] == len(body["tokens"])
        assert body["max_model_len"] == 512
        assert "token_strs" not in body
    r = http("POST", server.url + "/tokenize", {"prompt": text, "return_token_strs": True})
    assert r.json()["token_strs"] == hf.convert_ids_to_tokens(hf.encode(text))


def test_tokenize_messages_match_the_template_and_usage(server: ServerProcess, hf: Any) -> None:
    for gen in (True, False):
        r = http("POST", server.url + "/tokenize", {"messages": MESSAGES, "add_generation_prompt": gen})
        assert r.status == 200, r.text
        rendered = hf.apply_chat_template(MESSAGES, add_generation_prompt=gen, tokenize=False)
        assert r.json()["tokens"] == hf.encode(rendered, add_special_tokens=False)
    count = http("POST", server.url + "/tokenize", {"messages": MESSAGES}).json()["count"]
    chat = http("POST", server.base_url + "/chat/completions", {"messages": MESSAGES, "max_tokens": 1}).json()
    assert chat["usage"]["prompt_tokens"] == count
    completion = http("POST", server.base_url + "/completions", {"prompt": "a few words", "max_tokens": 1}).json()
    assert completion["usage"]["prompt_tokens"] == http(
        "POST", server.url + "/tokenize", {"prompt": "a few words"}).json()["count"]


def test_detokenize_matches_transformers(server: ServerProcess, hf: Any) -> None:
    ids = hf.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    ids = hf.encode(ids, add_special_tokens=False)
    r = http("POST", server.url + "/detokenize", {"tokens": ids})
    assert r.status == 200, r.text
    assert r.json() == {"prompt": hf.decode(ids, skip_special_tokens=False)}
    assert "<|im_start|>" in r.json()["prompt"]  # special tokens are kept, as vLLM does
    assert http("POST", server.url + "/detokenize", {"tokens": []}).json() == {"prompt": ""}


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/tokenize", {}, "prompt"),
    ("/tokenize", {"prompt": 5}, "prompt"),
    ("/tokenize", {"prompt": "x", "add_special_tokens": "yes"}, "add_special_tokens"),
    ("/tokenize", {"messages": []}, "messages"),
    ("/tokenize", {"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
    ("/tokenize", {"messages": MESSAGES, "continue_final_message": True}, "continue_final_message"),
    ("/tokenize", "not json", None),
    ("/tokenize", [1, 2], None),
    ("/detokenize", {}, "tokens"),
    ("/detokenize", {"tokens": "abc"}, "tokens"),
    ("/detokenize", {"tokens": [1, -1]}, "tokens.1"),
    ("/detokenize", {"tokens": [1, 49152]}, "tokens.1"),
    ("/detokenize", {"tokens": [1.5]}, "tokens.0"),
])
def test_bad_input_is_a_clear_400(server: ServerProcess, path: str, body: Any, param: str | None) -> None:
    r = http("POST", server.url + path, body if not isinstance(body, list) else str(body))
    assert r.status == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"]
    assert err["param"] == param


def test_unknown_model_is_404_and_get_is_405(server: ServerProcess) -> None:
    r = http("POST", server.url + "/tokenize", {"prompt": "x", "model": "no-such-model"})
    assert r.status == 404 and r.json()["error"]["code"] == "model_not_found"
    assert http("GET", server.url + "/tokenize").status == 405
    assert http("POST", server.url + "/health").status == 405


def test_health_and_version(server: ServerProcess) -> None:
    r = http("GET", server.url + "/health")
    assert r.status == 200 and r.body == b""
    r = http("GET", server.url + "/version")
    assert r.status == 200 and r.json() == {"version": importlib.metadata.version("hetero-infer")}


# ------------------------------------------------------------------ in-process: API keys, a dead engine
@pytest.fixture(scope="module")
def engine() -> Iterator[LLMEngine]:
    yield LLMEngine(EngineConfig(executor="mock", max_model_len=256, mock_step_latency_s=0.01))


@pytest.fixture
async def served(engine: LLMEngine, request: pytest.FixtureRequest) -> AsyncIterator[tuple[str, ServerState]]:
    keys = getattr(request, "param", [])
    state = ServerState(ServerOptions(access_log=False, api_key=keys))
    server = TestServer(create_app(state))
    await server.start_server()
    url = str(server.make_url("")).rstrip("/")
    async with aiohttp.ClientSession() as session, session.get(url + "/health") as r:
        assert r.status == 503  # still loading
    client = state.start_engine(engine, max_num_seqs=engine.config.max_num_seqs)
    try:
        yield url, state
    finally:
        client.shutdown()
        await server.close()
        for request_id in list(engine.requests):
            engine.abort_request(request_id)


async def test_health_is_503_once_the_engine_is_dead(served: tuple[str, ServerState], engine: LLMEngine,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    url, state = served
    async with aiohttp.ClientSession() as session:
        async with session.get(url + "/health") as r:
            assert r.status == 200

        def broken() -> Any:
            raise RuntimeError("scheduler invariant violated")

        monkeypatch.setattr(engine, "step_deltas", broken)
        async with session.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 3}) as r:
            assert r.status >= 500
        deadline = time.monotonic() + 30
        while True:
            async with session.get(url + "/health") as r:
                if r.status == 503:
                    assert await r.read() == b""
                    break
            assert time.monotonic() < deadline, "the dead engine still reports healthy"
            await asyncio.sleep(0.05)


@pytest.mark.parametrize("served", [["sesame"]], indirect=True)
async def test_api_key_guards_tokenize(served: tuple[str, ServerState]) -> None:
    url, _ = served
    async with aiohttp.ClientSession() as session:
        for path, body in (("/tokenize", {"prompt": "x"}), ("/detokenize", {"tokens": [1]})):
            async with session.post(url + path, json=body) as r:
                assert r.status == 401
            async with session.post(url + path, json=body, headers={"Authorization": "Bearer sesame"}) as r:
                assert r.status == 200
        async with session.get(url + "/health") as r:
            assert r.status == 200  # probes need no key


def test_responses_match_the_published_schemas(server: ServerProcess) -> None:
    from jsonschema import Draft202012Validator

    spec = http("GET", server.url + "/openapi.json").json()
    assert {"/tokenize", "/detokenize", "/health", "/version"} <= set(spec["paths"])

    def check(component: str, instance: Any) -> None:
        schema = {"$ref": f"#/components/schemas/{component}", "components": spec["components"]}
        assert not list(Draft202012Validator(schema).iter_errors(instance)), (component, instance)

    check("TokenizeResponse", http("POST", server.url + "/tokenize", {"prompt": "x"}).json())
    check("TokenizeResponse", http("POST", server.url + "/tokenize", {"messages": MESSAGES,
                                                                      "return_token_strs": True}).json())
    check("DetokenizeResponse", http("POST", server.url + "/detokenize", {"tokens": [1, 2]}).json())
    check("VersionResponse", http("GET", server.url + "/version").json())
    check("ErrorResponse", http("POST", server.url + "/detokenize", {"tokens": [-1]}).json())
