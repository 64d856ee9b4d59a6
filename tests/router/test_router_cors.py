"""CORS at the router (its --allowed-origins, --allowed-methods, --allowed-headers, --allow-credentials, the
workers' options and code, worker/server/cors.py), over real HTTP: a real worker (mock executor) that allows no
origin of its own behind the router. The router answers preflights, refuses foreign origins with 403 before
routing anything, and lets the allowed ones through to the worker, whose answers (streams too) carry the CORS
headers."""

from __future__ import annotations

import aiohttp
import pytest
from worker_thread import one_routed_worker

from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.contracts.options import InvalidOption
from hetero_infer.contracts.router_options import RouterOptions
from hetero_infer.contracts.server_options import ServerOptions
from hetero_infer.router.cli import resolve_options
from hetero_infer.worker.core.engine import LLMEngine

APP = "https://app.example"
EVIL = "http://evil.example"
COMPLETION = {"prompt": "hello", "max_tokens": 2}


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    return LLMEngine(EngineConfig(executor="mock", max_model_len=128, max_num_seqs=2))


def prompts(engine: LLMEngine) -> int:
    return engine.stats().prompt_tokens_total


async def test_foreign_origins_are_refused_at_the_router_by_default(engine: LLMEngine) -> None:
    async with one_routed_worker(engine) as url, aiohttp.ClientSession() as s:
        before = prompts(engine)
        for origin in (APP, EVIL, "null"):
            async with s.post(url + "/v1/completions", json=COMPLETION, headers={"Origin": origin}) as r:
                assert r.status == 403
                body = await r.json()
                assert body["error"]["code"] == "origin_not_allowed" and "--allowed-origins" in body["error"]["message"]
                assert "Access-Control-Allow-Origin" not in r.headers
        async with s.options(url + "/v1/completions", headers={"Origin": APP,
                                                               "Access-Control-Request-Method": "POST"}) as r:
            assert r.status == 403 and "Access-Control-Allow-Origin" not in r.headers
        assert prompts(engine) == before  # nothing was routed
        async with s.get(url + "/v1/models", headers={"Origin": EVIL}) as r:  # reads pass, without CORS headers
            assert r.status == 200 and "Access-Control-Allow-Origin" not in r.headers
        async with s.post(url + "/v1/completions", json=COMPLETION) as r:  # no Origin: not a browser
            assert r.status == 200


async def test_allowed_origins_get_preflights_and_readable_answers(engine: LLMEngine) -> None:
    async with one_routed_worker(engine, allowed_origins=[APP], allowed_methods=["GET", "POST"],
                      allowed_headers=["Content-Type", "Authorization"], allow_credentials=True) as url, \
            aiohttp.ClientSession() as s:
        async with s.options(url + "/v1/chat/completions", headers={
                "Origin": APP, "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "content-type, authorization"}) as r:
            assert r.status == 204
            assert r.headers["Access-Control-Allow-Origin"] == APP
            assert "POST" in r.headers["Access-Control-Allow-Methods"]
            assert r.headers["Access-Control-Allow-Credentials"] == "true"
        for method, wanted in (("DELETE", ""), ("POST", "x-custom")):
            async with s.options(url + "/v1/completions", headers={
                    "Origin": APP, "Access-Control-Request-Method": method,
                    "Access-Control-Request-Headers": wanted}) as r:
                assert r.status == 403
        before = prompts(engine)
        # The worker allows no origin: the router answers CORS and does not pass the browser's Origin on.
        async with s.post(url + "/v1/completions", json={**COMPLETION, "stream": True},
                          headers={"Origin": APP}) as r:
            assert r.status == 200, await r.text()
            assert r.headers["Access-Control-Allow-Origin"] == APP
            assert r.headers["Access-Control-Allow-Credentials"] == "true"
            assert "X-Request-Id" in r.headers["Access-Control-Expose-Headers"]
            assert (await r.text()).rstrip().endswith("data: [DONE]")
        assert prompts(engine) > before
        async with s.post(url + "/v1/completions", json={"prompt": 5}, headers={"Origin": APP}) as r:
            assert r.status == 400 and r.headers["Access-Control-Allow-Origin"] == APP  # the worker's error, readable
        async with s.post(url + "/v1/completions", json=COMPLETION, headers={"Origin": EVIL}) as r:
            assert r.status == 403
        async with s.post(url + "/v1/completions", data=b"{}", headers={"Origin": APP,
                                                                         "Content-Type": "text/plain"}) as r:
            assert r.status == 415  # JSON bodies only, as the workers


async def test_any_origin(engine: LLMEngine) -> None:
    async with one_routed_worker(engine, allowed_origins=["*"]) as url, aiohttp.ClientSession() as s:
        async with s.post(url + "/v1/completions", json=COMPLETION, headers={"Origin": EVIL}) as r:
            assert r.status == 200 and r.headers["Access-Control-Allow-Origin"] == "*"


def test_the_options_are_the_workers() -> None:
    options = resolve_options(["--allowed-origins", APP, "--allowed-origins", "https://b.example",
                               "--allowed-methods", "POST", "--allow-credentials"], {})
    assert (options.allowed_origins, options.allowed_methods, options.allowed_headers, options.allow_credentials) == (
        [APP, "https://b.example"], ["POST"], ["*"], True)
    defaults = RouterOptions()
    worker = ServerOptions()
    assert [getattr(defaults, n) for n in ("allowed_origins", "allowed_methods", "allowed_headers",
                                           "allow_credentials")] == \
        [getattr(worker, n) for n in ("allowed_origins", "allowed_methods", "allowed_headers", "allow_credentials")]
    with pytest.raises(InvalidOption, match="allow_credentials"):
        RouterOptions(allowed_origins=["*"], allow_credentials=True)
    with pytest.raises(InvalidOption, match="allowed_origins"):
        RouterOptions(allowed_origins=["app.example"])
    with pytest.raises(InvalidOption, match="allowed_methods"):
        RouterOptions(allowed_methods=[" "])
