"""The exact prefix index end to end in one process: two real worker servers (mock executor, a KV pool small
enough to evict) behind the router. After every request, once the router has polled, its index holds exactly
the hashes in each engine's prefix cache, and what it predicted for a request (the matched tokens of the worker
it chose) is what that worker then served from its cache."""

from __future__ import annotations

import contextlib
import random

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from router_fakes import start_router, wait_for

from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.contracts.router_options import RouterOptions
from hetero_infer.contracts.server_options import ServerOptions
from hetero_infer.worker.core.engine import LLMEngine
from hetero_infer.worker.server.app import create_app
from hetero_infer.worker.server.state import ServerState

BLOCK = 16


@pytest.fixture(scope="module")
def engines() -> list[LLMEngine]:
    # 12 blocks: two prompts (up to 7 blocks each) fill a worker, so the workload below evicts.
    return [LLMEngine(EngineConfig(executor="mock", max_model_len=256, max_num_blocks=12, max_num_seqs=2))
            for _ in range(2)]


@contextlib.asynccontextmanager
async def served(engines: list[LLMEngine]):
    servers, clients = [], []
    try:
        for engine in engines:
            state = ServerState(ServerOptions(access_log=False))
            server = TestServer(create_app(state))
            await server.start_server()
            servers.append(server)
            clients.append(state.start_engine(engine, max_num_seqs=engine.config.max_num_seqs))
        urls = [str(s.make_url("")).rstrip("/") for s in servers]
        router, runner, url = await start_router(RouterOptions(worker=urls, health_interval_s=0.02,
                                                               block_size=BLOCK))
        try:
            await wait_for(lambda: len(router.pool.ready()) == len(urls), what="workers ready")
            yield router, url, dict(zip(urls, engines)), clients
        finally:
            await runner.cleanup()
    finally:
        for c in clients:
            c.shutdown()
        for s in servers:
            await s.close()


def cached(engine: LLMEngine) -> frozenset[int]:
    return frozenset(engine.block_manager.hash_to_block)  # read while the engine is idle


def hits(engine: LLMEngine) -> int:
    return engine.block_manager.prefix_hits


def matched(router, url: str) -> float:
    value = router.metrics.registry.get_sample_value("hetero_infer_router_prefix_matched_tokens_total",
                                                     {"worker": url})
    return value or 0.0


async def test_the_index_is_each_workers_cache_and_its_matches_are_the_workers_hits(engines):
    rng = random.Random(7)
    prefixes = [[rng.randrange(100, 20000) for _ in range(3 * BLOCK)] for _ in range(4)]
    async with served(engines) as (router, url, workers, clients), aiohttp.ClientSession() as s:
        model = engines[0].model_name
        for i in range(24):
            prompt = rng.choice(prefixes) + [rng.randrange(100, 20000) for _ in range(rng.randrange(1, 3 * BLOCK))]
            before = {u: (hits(e), matched(router, u)) for u, e in workers.items()}
            async with s.post(url + "/v1/completions",
                              json={"model": model, "prompt": prompt, "max_tokens": 3}) as r:
                assert r.status == 200, await r.text()
            await wait_for(lambda: all(router.index.blocks(u) == cached(e) for u, e in workers.items()),
                           what="the router's index to equal every worker's cache")
            for u, e in workers.items():
                got_hits, predicted = hits(e) - before[u][0], matched(router, u) - before[u][1]
                assert got_hits == predicted, (i, u, got_hits, predicted)
        assert all(router.pool.workers[u].reports_blocks for u in workers)
        assert any(c.block_log.seq > len(c.block_log.present) for c in clients)  # blocks were evicted
        assert sum(hits(e) for e in engines) > 0
