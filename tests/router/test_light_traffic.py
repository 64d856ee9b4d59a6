"""Issue 26 over real HTTP: 4 mock workers whose KV pools hold 3-4 of 12 shared prefixes, the prefix router
with its default options (block reports polled once a second, far slower than the requests come), requests
shuffled with 4 in flight. The cluster's hit rate (the workers' own counters) must reach 90% of one replica that
never evicts (and 0.8 with the issue's 20 requests per prefix, in the process test), with each prefix cached on one worker; round-robin on the same workers shows what is
at stake. In-process workers by default (seconds); the same with `hetero-infer` processes is marked slow."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import aiohttp
import pytest
from router_fakes import start_router, wait_for
from router_proc import samples, start_workers
from router_proc import start_router as start_router_process
from test_placement_replay import ideal, workload
from worker_thread import real_workers

from hetero_infer.contracts.block_hashes import block_hashes
from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.contracts.router_options import RouterOptions
from hetero_infer.worker.core.engine import LLMEngine

BLOCK = 16
POOL = 112
COSTS = {"mock_step_latency_s": 0.001, "mock_token_latency_s": 0.00005}


async def drive(url: str, model: str, prompts: list[list[int]], in_flight: int = 4) -> None:
    queue = list(reversed(prompts))
    async with aiohttp.ClientSession() as s:
        async def client() -> None:
            while queue:
                body = {"model": model, "prompt": queue.pop(), "max_tokens": 4, "ignore_eos": True}
                async with s.post(url + "/v1/completions", json=body) as r:
                    assert r.status == 200, await r.text()

        await asyncio.gather(*(client() for _ in range(in_flight)))


def engine_counters(engines: list[LLMEngine]) -> tuple[int, int]:
    return (sum(e.block_manager.prefix_hits for e in engines), sum(e.block_manager.prefix_queries for e in engines))


async def test_light_traffic_on_small_pools_keeps_each_prefix_on_one_worker():
    engines = [LLMEngine(EngineConfig(executor="mock", max_model_len=512, max_num_blocks=POOL, block_size=BLOCK,
                                      **COSTS)) for _ in range(4)]
    async with real_workers(engines) as urls:
        rates = {}
        for salt, policy in enumerate(("round-robin", "prefix")):
            router, runner, url = await start_router(RouterOptions(worker=urls, policy=policy, tokenizer="none"))
            try:
                await wait_for(lambda r=router: all(w.reports_blocks for w in r.pool.workers.values()),
                               what="every worker's first block report")
                prompts = workload(salt, repeats=8)
                h0, q0 = engine_counters(engines)
                await drive(url, engines[0].model_name, prompts)
                h1, q1 = engine_counters(engines)
                rates[policy] = (h1 - h0) / (q1 - q0)
                predicted = sum(router.metrics.registry.get_sample_value(
                    "hetero_infer_router_prefix_matched_tokens_total", {"worker": u}) or 0.0 for u in urls)
            finally:
                await runner.cleanup()
        best = ideal(prompts)
        assert rates["prefix"] >= 0.9 * best, (rates, best)  # 8 requests per prefix: the ideal is 0.82
        assert rates["round-robin"] < 0.6, rates
        homes = [sum(block_hashes(p, BLOCK)[20] in e.block_manager.hash_to_block for e in engines)
                 for p in {tuple(p[:BLOCK]): p for p in prompts}.values()]
        assert homes.count(1) >= 11, homes  # each prefix cached on one worker (at most one evicted at the end)
        # Its view was the caches': off only where a request came while its prefix's first prefill was running
        # (predicted from the pending blocks, not yet in the worker's cache), a few of 96.
        assert abs(predicted - (h1 - h0)) <= 0.05 * (h1 - h0), (predicted, h1 - h0)


@pytest.mark.slow  # five processes start (about a minute on two loaded cores)
def test_light_traffic_on_small_pools_with_processes():
    workers = start_workers(4, "--max-num-blocks", str(POOL), "--block-size", str(BLOCK),
                            "--mock-step-latency-s", "0.001", "--mock-token-latency-s", "0.00005")
    try:
        router = start_router_process(workers, "--health-interval-s", "1")  # the default: polls far apart
        try:
            model = json.loads(urllib.request.urlopen(router.url + "/v1/models").read())["data"][0]["id"]

            def counters() -> tuple[float, float]:
                return (sum(sum(samples(w.url, "hetero_infer_prefix_cache_hits_total").values()) for w in workers),
                        sum(sum(samples(w.url, "hetero_infer_prefix_cache_queries_total").values()) for w in workers))

            prompts = workload(7)
            h0, q0 = counters()
            asyncio.run(drive(router.url, model, prompts))
            h1, q1 = counters()
            rate = (h1 - h0) / (q1 - q0)
            predicted = sum(samples(router.url, "hetero_infer_router_prefix_matched_tokens_total").values())
        finally:
            router.stop()
    finally:
        for w in workers:
            w.stop()
    assert rate >= 0.8 and rate >= 0.9 * ideal(prompts), rate
    assert abs(predicted - (h1 - h0)) <= 0.05 * (h1 - h0), (predicted, h1 - h0)  # its view was the workers' caches
