"""DNS rebinding at the router (its --allowed-hosts, the workers' guard: hetero_infer/contracts/hosts.py): on
loopback without an API key the router answers only to IP addresses, localhost and the names given, and routes
nothing for a rebound name; bound to all interfaces (a pod) or with an API key, it answers any name. Over real
HTTP with a real worker (mock executor) behind it."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from worker_thread import one_routed_worker

from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.contracts.options import InvalidOption
from hetero_infer.contracts.router_options import RouterOptions
from hetero_infer.router.cli import resolve_options
from hetero_infer.worker.core.engine import LLMEngine

COMPLETION = {"prompt": "hello", "max_tokens": 2}


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    return LLMEngine(EngineConfig(executor="mock", max_model_len=128, max_num_seqs=2))


async def _status(url: str, host: str, path: str = "/v1/completions", auth: str | None = None) -> tuple[int, Any]:
    headers = {"Host": host, **({"Authorization": f"Bearer {auth}"} if auth else {})}
    async with aiohttp.ClientSession() as s:
        if path == "/v1/completions":
            async with s.post(url + path, json=COMPLETION, headers=headers) as r:
                return r.status, await r.json(content_type=None)
        async with s.get(url + path, headers=headers) as r:
            return r.status, await r.text()


async def test_a_rebound_name_is_refused_and_routes_nothing(engine: LLMEngine) -> None:
    async with one_routed_worker(engine) as url:
        before = engine.stats().prompt_tokens_total
        status, body = await _status(url, "evil.example:3000")
        assert status == 403 and body["error"]["code"] == "host_not_allowed", body
        assert (await _status(url, "evil.example", "/metrics"))[0] == 403
        assert engine.stats().prompt_tokens_total == before  # nothing was routed
        port = url.rsplit(":", 1)[1]
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"):
            assert (await _status(url, host))[0] == 200, host


async def test_allowed_hosts_and_api_keys_open_names(engine: LLMEngine) -> None:
    async with one_routed_worker(engine, allowed_hosts=[".corp.example"]) as url:
        assert (await _status(url, "llm.corp.example"))[0] == 200
        assert (await _status(url, "evil.example"))[0] == 403
    async with one_routed_worker(engine, api_key=["k-router"]) as url:  # a rebinding page has no key
        assert (await _status(url, "evil.example", auth="k-router"))[0] == 200


def test_bad_allowed_hosts_are_refused_with_the_option_named() -> None:
    with pytest.raises(ValueError, match=r"allowed_hosts.*write a domain and its subdomains as \.example\.com"):
        resolve_options(["--allowed-hosts", "*.corp.example"])
    with pytest.raises(InvalidOption):
        RouterOptions(allowed_hosts=["http://a.example"])
    assert resolve_options(["--allowed-hosts", "a.example", "--allowed-hosts", ".b.example"]).allowed_hosts == [
        "a.example", ".b.example"]
