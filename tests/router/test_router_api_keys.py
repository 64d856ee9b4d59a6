"""API keys through the router, over real HTTP with a real worker (mock executor) that requires its key:

- without the router's own --api-key, the router checks nothing and passes each client's Authorization header
  to the workers (they decide);
- with it, clients must present the router's key (401 otherwise, nothing routed), and their requests reach the
  workers with --worker-api-key instead (never the client's key);
- either way the router's own requests to the workers (block reports) carry --worker-api-key."""

from __future__ import annotations

import contextlib
from typing import Any

import aiohttp
import pytest
from router_fakes import start_router, wait_for
from worker_thread import real_workers

from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.contracts.router_options import RouterOptions
from hetero_infer.router.cli import resolve_options
from hetero_infer.worker.core.engine import LLMEngine

WORKER_KEY = "sk-worker-1"
ROUTER_KEY = "sk-router-1"
COMPLETION = {"prompt": "hello there, a prompt of a few blocks " * 4, "max_tokens": 2}


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    return LLMEngine(EngineConfig(executor="mock", max_model_len=256, max_num_seqs=2, block_size=4))


@contextlib.asynccontextmanager
async def routed(engine: LLMEngine, **options: Any):
    """A worker that requires WORKER_KEY behind a router with these options."""
    async with real_workers([engine], api_key=[WORKER_KEY]) as workers:
        router, runner, url = await start_router(RouterOptions(worker=workers, health_interval_s=0.02,
                                                               tokenizer="none", **options))
        try:
            await wait_for(lambda: len(router.pool.ready()) == 1, what="the worker ready")
            yield router, url
        finally:
            await runner.cleanup()


async def post(url: str, key: str | None) -> tuple[int, dict]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with aiohttp.ClientSession() as s, s.post(f"{url}/v1/completions", json=COMPLETION,
                                                    headers=headers) as r:
        return r.status, await r.json()


def prompts(engine: LLMEngine) -> int:
    return engine.stats().prompt_tokens_total


async def test_without_a_router_key_the_clients_key_goes_to_the_workers(engine: LLMEngine) -> None:
    async with routed(engine, worker_api_key=WORKER_KEY) as (_, url):
        status, body = await post(url, None)
        assert status == 401 and body["error"]["code"] == "invalid_api_key"  # the worker's answer
        assert (await post(url, WORKER_KEY))[0] == 200


async def test_with_a_router_key_clients_present_it_and_the_workers_get_theirs(engine: LLMEngine) -> None:
    async with routed(engine, worker_api_key=WORKER_KEY, api_key=[ROUTER_KEY]) as (router, url):
        before = prompts(engine)
        for key in (None, "wrong", WORKER_KEY):  # the workers' key is not the router's
            status, body = await post(url, key)
            assert status == 401 and body["error"]["code"] == "invalid_api_key", key
        assert prompts(engine) == before, "a refused request was routed"
        status, body = await post(url, ROUTER_KEY)
        assert status == 200 and body["choices"][0]["text"]
        async with aiohttp.ClientSession() as s:  # probes and metrics stay open
            for path in ("/healthz", "/readyz", "/metrics"):
                async with s.get(url + path) as r:
                    assert r.status == 200, path


async def test_the_router_key_alone_cannot_reach_protected_workers(engine: LLMEngine) -> None:
    """With a router key but no worker key the client's key is not passed on: the worker refuses."""
    async with routed(engine, api_key=[ROUTER_KEY]) as (_, url):
        assert (await post(url, ROUTER_KEY))[0] == 401


async def test_block_reports_carry_the_worker_key(engine: LLMEngine) -> None:
    async with routed(engine, worker_api_key=WORKER_KEY, api_key=[ROUTER_KEY], block_size=4) as (router, url):
        assert (await post(url, ROUTER_KEY))[0] == 200
        (worker,) = router.pool.workers.values()
        await wait_for(lambda: worker.reports_blocks is True, what="a block report from the protected worker")


def test_the_router_key_comes_from_the_environment_and_is_never_printed() -> None:
    options = resolve_options([], environ={"HETERO_INFER_ROUTER_API_KEY": ROUTER_KEY,
                                           "HETERO_INFER_ROUTER_WORKER_API_KEY": WORKER_KEY})
    assert options.api_key == [ROUTER_KEY] and options.worker_api_key == WORKER_KEY
    assert ROUTER_KEY not in repr(options) and WORKER_KEY not in repr(options)
    with pytest.raises(ValueError, match=r"api_key=\*\*\*"):
        resolve_options(["--api-key", " "], environ={})
