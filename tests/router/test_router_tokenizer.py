"""The router's tokenizer from the workers (`--tokenizer workers`, the default): the tokens it computes for chat
messages and text prompts are the worker's own (its `POST /tokenize`, which renders exactly what
/v1/chat/completions renders), for any message shape; it loads without torch (the operator image); it falls back
to text hashes while workers answer 404 and picks the tokenizer up from a worker that serves it; and end to end,
two real workers behind a router with default options give exact prefix predictions for chat prompts."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from router_fakes import start_router, wait_for
from worker_thread import ThreadedWorker, real_workers

from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.contracts.router_options import RouterOptions
from hetero_infer.router.discovery import Membership
from hetero_infer.router.prompt import prompt_token_ids, request_hashes
from hetero_infer.router.tokenizer_source import FILES_PATH, fetch_and_load
from hetero_infer.worker.core.engine import LLMEngine

BLOCK = 16


@pytest.fixture(scope="module")
def worker() -> Iterator[ThreadedWorker]:
    w = ThreadedWorker(LLMEngine(EngineConfig(executor="mock", max_model_len=4096)))
    try:
        yield w
    finally:
        w.stop()


@pytest.fixture(scope="module")
def router_tokenizer(worker: ThreadedWorker) -> Any:
    status, body = worker.request("GET", FILES_PATH)
    assert status == 200, body[:200]
    tokenizer, files = fetch_and_load(body)
    return tokenizer


@pytest.fixture(scope="module")
def model(worker: ThreadedWorker) -> str:
    return json.loads(worker.request("GET", "/v1/models")[1])["data"][0]["id"]


# -- message shapes ---------------------------------------------------------------------------------------------
TEXT = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=30),
    st.sampled_from(["<|im_start|>", "<|im_end|>", "\n\n", " Hello, world!", "日本語のテキスト", "🙂👍", "{{ x }}",
                     "<tool_call>[]</tool_call>", "  spaced  ", "assistant\n"]),
)
CONTENT = st.one_of(TEXT, st.lists(TEXT.map(lambda t: {"type": "text", "text": t}), min_size=1, max_size=3))
NAMES = st.sampled_from(["get_weather", "search", "lookup.user", "add"])
TOOL = st.builds(lambda name, desc: {"type": "function", "function": {
    "name": name, "description": desc,
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}, NAMES, TEXT)


@st.composite
def turns(draw: st.DrawFn) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if draw(st.booleans()):
        out.append({"role": draw(st.sampled_from(["system", "developer"])), "content": draw(CONTENT)})
    for i in range(draw(st.integers(1, 3))):
        out.append({"role": "user", "content": draw(CONTENT)})
        kind = draw(st.sampled_from(["none", "text", "call"]))
        if kind == "text":
            out.append({"role": "assistant", "content": draw(CONTENT)})
        elif kind == "call":
            name = draw(NAMES)
            args = json.dumps({"q": draw(TEXT)}, ensure_ascii=False)
            out.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": args}}]})
            out.append({"role": "tool", "tool_call_id": f"call_{i}", "content": draw(TEXT)})
            out.append({"role": "user", "content": draw(CONTENT)})
    return out


@st.composite
def chat_requests(draw: st.DrawFn) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": draw(turns()), "max_tokens": 4}
    tools = draw(st.lists(TOOL, max_size=2, unique_by=lambda t: t["function"]["name"]))
    if tools:
        body["tools"] = tools
        choice = draw(st.sampled_from([None, "none", "auto", "required", "named"]))
        if choice == "named":
            body["tool_choice"] = {"type": "function", "function": {"name": tools[0]["function"]["name"]}}
        elif choice is not None:
            body["tool_choice"] = choice
    if draw(st.booleans()):
        body["add_generation_prompt"] = draw(st.booleans())
    return body


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(request=chat_requests())
def test_chat_tokens_are_the_workers(worker: ThreadedWorker, router_tokenizer: Any, model: str,
                                     request: dict[str, Any]) -> None:
    payload = {"model": model, **request}
    body = json.dumps(payload).encode()
    status, answer = worker.request("POST", "/tokenize", payload)
    assert status == 200, answer
    expected = json.loads(answer)["tokens"]
    assert prompt_token_ids(payload, router_tokenizer, body) == expected
    assert prompt_token_ids(payload, router_tokenizer) == expected  # the parsed payload alone, serialized again
    hashes, exact = request_hashes(payload, router_tokenizer, BLOCK, 64, body)
    assert exact and len(hashes) == len(expected) // BLOCK


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.one_of(TEXT, st.lists(TEXT, min_size=1, max_size=6).map("".join)).filter(bool))
def test_text_prompt_tokens_are_the_workers(worker: ThreadedWorker, router_tokenizer: Any, model: str,
                                            text: str) -> None:
    status, answer = worker.request("POST", "/tokenize", {"model": model, "prompt": text})
    assert status == 200, answer
    assert prompt_token_ids({"model": model, "prompt": text}, router_tokenizer) == json.loads(answer)["tokens"]


def test_a_request_the_worker_refuses_is_hashed_as_text(worker: ThreadedWorker, router_tokenizer: Any,
                                                        model: str) -> None:
    """The router parses chat requests with the workers' own model of them: one the worker answers with a 400
    (here tool_choice naming a function not in tools) gets text hashes, routed like a cold prefix."""
    payload = {"model": model, "messages": [{"role": "user", "content": "hi " * 100}],
               "tools": [{"type": "function", "function": {"name": "a"}}],
               "tool_choice": {"type": "function", "function": {"name": "b"}}}
    assert worker.request("POST", "/tokenize", payload)[0] == 400
    assert request_hashes(payload, router_tokenizer, BLOCK, 64)[1] is False


def test_the_workers_tokenizer_loads_without_torch(worker: ThreadedWorker, model: str, tmp_path) -> None:
    """The router in the operator image has transformers but no torch: loading the workers' files and rendering a
    chat prompt must not need it."""
    status, body = worker.request("GET", FILES_PATH)
    assert status == 200
    (tmp_path / "files.json").write_bytes(body)
    payload = {"model": model, "messages": [{"role": "system", "content": "Be brief."},
                                            {"role": "user", "content": "Hello"}]}
    code = (
        "import json, sys\n"
        "sys.modules.update(torch=None, triton=None, xgrammar=None)  # absent: find_spec None, import fails\n"
        "from hetero_infer.router.tokenizer_source import fetch_and_load\n"
        "from hetero_infer.router.prompt import prompt_token_ids\n"
        f"tok, _ = fetch_and_load(open({str(tmp_path / 'files.json')!r}, 'rb').read())\n"
        f"print(json.dumps(prompt_token_ids({payload!r}, tok)))\n"
        "assert sys.modules['torch'] is None\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    status, answer = worker.request("POST", "/tokenize", payload)
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == json.loads(answer)["tokens"]


# -- through the router -----------------------------------------------------------------------------------------
def mode(router: Any) -> dict[str, float]:
    return {m: router.metrics.registry.get_sample_value("hetero_infer_router_tokenizer_mode", {"mode": m})
            for m in ("workers", "folder", "text")}


class OtherServer:
    """An OpenAI-compatible server that is not ours: no tokenizer files (404), counts the asks."""

    def __init__(self) -> None:
        self.asked = 0
        self.bodies: list[dict[str, Any]] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", self.readyz)
        app.router.add_get(FILES_PATH, self.files)
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    async def readyz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ready"})

    async def files(self, request: web.Request) -> web.Response:
        self.asked += 1
        raise web.HTTPNotFound()

    async def chat(self, request: web.Request) -> web.Response:
        self.bodies.append(await request.json())
        return web.json_response({"choices": []})


async def test_workers_that_do_not_serve_it_leave_text_hashes_until_one_does() -> None:
    other = OtherServer()
    other_server = TestServer(other.app())
    await other_server.start_server()
    other_url = str(other_server.make_url("")).rstrip("/")
    engine = LLMEngine(EngineConfig(executor="mock", max_model_len=256, max_num_seqs=2))
    router, runner, url = await start_router(RouterOptions(worker=[other_url], health_interval_s=0.02))
    try:
        await wait_for(lambda: other.asked >= 1, what="the router asked for the tokenizer")
        assert not router.tokenizers and mode(router) == {"workers": 0, "folder": 0, "text": 1}
        payload = {"model": "m", "messages": [{"role": "user", "content": "same system prompt " * 20}]}
        async with aiohttp.ClientSession() as s, s.post(url + "/v1/chat/completions", json=payload) as r:
            assert r.status == 200
        assert other.bodies == [payload]
        assert router.metrics.registry.get_sample_value("hetero_infer_router_prefix_query_tokens_total") > 0
        # A worker of ours joins: the router loads its tokenizer (the other server is not asked again meanwhile).
        async with real_workers([engine]) as (ours,):
            membership = Membership(router.pool)  # as discovery adds a worker
            membership.apply({ours})
            try:
                await wait_for(lambda: router.tokenizers, 120, "the tokenizer from the worker serving it")
                assert mode(router) == {"workers": 1, "folder": 0, "text": 0}
                assert other.asked == 1
            finally:
                await membership.stop()
    finally:
        await runner.cleanup()
        await other_server.close()


async def test_chat_prompts_through_the_router_are_exact_hits_with_default_options() -> None:
    """Two real workers (mock executor, pools small enough to evict) behind a router with default options: once
    it has the workers' tokenizer, what it predicts a worker holds of each chat prompt is what that worker then
    serves from its prefix cache."""
    engines = [LLMEngine(EngineConfig(executor="mock", max_model_len=512, max_num_blocks=24, max_num_seqs=2))
               for _ in range(2)]
    systems = [f"You are assistant number {k}. Answer in one short sentence and never guess. " * 5
               for k in range(3)]
    async with real_workers(engines) as urls:
        router, runner, url = await start_router(RouterOptions(worker=urls, health_interval_s=0.02,
                                                               block_size=BLOCK))
        try:
            assert RouterOptions().tokenizer == "workers"
            await wait_for(lambda: router.tokenizers, 120, "the workers' tokenizer")
            assert mode(router) == {"workers": 1, "folder": 0, "text": 0}
            workers = dict(zip(urls, engines))
            total = 0
            async with aiohttp.ClientSession() as s:
                for i in range(12):
                    before = {u: (e.block_manager.prefix_hits, matched(router, u)) for u, e in workers.items()}
                    messages = [{"role": "system", "content": systems[i % 3]},
                                {"role": "user", "content": f"Question {i}?"}]
                    if i % 2:
                        messages += [{"role": "assistant", "content": "An answer."},
                                     {"role": "user", "content": [{"type": "text", "text": "And then?"}]}]
                    async with s.post(url + "/v1/chat/completions",
                                      json={"model": engines[0].model_name, "messages": messages,
                                            "max_tokens": 2}) as r:
                        assert r.status == 200, await r.text()
                    await wait_for(lambda: all(router.index.blocks(u) == frozenset(e.block_manager.hash_to_block)
                                               for u, e in workers.items()), what="the index to equal the caches")
                    for u, e in workers.items():
                        hits = e.block_manager.prefix_hits - before[u][0]
                        assert hits == matched(router, u) - before[u][1], (i, u)
                        total += hits
            assert total >= 6 * 5 * BLOCK  # most requests found their system prompt cached
        finally:
            await runner.cleanup()


def matched(router: Any, url: str) -> float:
    value = router.metrics.registry.get_sample_value("hetero_infer_router_prefix_matched_tokens_total",
                                                     {"worker": url})
    return value or 0.0


@pytest.mark.parametrize("key, loads", [("sk-worker", True), (None, False)])
async def test_workers_with_an_api_key_give_it_for_the_routers_key(key: str | None, loads: bool,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    """GET /v1/tokenizer/files is behind the workers' --api-key: the router sends its --worker-api-key; without
    it the worker answers 401, the router says so once and keeps hashing text."""
    engine = LLMEngine(EngineConfig(executor="mock", max_model_len=128, max_num_seqs=2))
    async with real_workers([engine], api_key=["sk-worker"]) as (worker,):
        router, runner, _ = await start_router(RouterOptions(worker=[worker], health_interval_s=0.02,
                                                             worker_api_key=key))
        try:
            if loads:
                await wait_for(lambda: router.tokenizers, 120, "the tokenizer with the key")
                assert mode(router)["workers"] == 1
            else:
                await wait_for(lambda: any(r.getMessage().startswith("tokenizer:") and "--worker-api-key" in
                                           r.getMessage() for r in caplog.records), what="the warning about the key")
                assert not router.tokenizers and mode(router)["text"] == 1
        finally:
            await runner.cleanup()
