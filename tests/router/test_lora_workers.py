"""The router over real workers serving a LoRA adapter (mock executor, in this process, real HTTP): the adapter
loaded through the workers' load endpoint appears in the router's /v1/models with its parent; an adapter request's
blocks are keyed by the adapter in the worker's prefix cache exactly as the router hashes them, so the same request
returns to that worker and hits its cache, while the base model's request for the same prompt shares none of them."""

from __future__ import annotations

import sys
from pathlib import Path

import aiohttp
import pytest
from router_fakes import start_router, wait_for
from worker_thread import real_workers

from hetero_infer.contracts.block_hashes import block_hashes
from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.contracts.router_options import RouterOptions
from hetero_infer.worker.core.engine import LLMEngine

_TESTS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(_TESTS / "lora"))
sys.path.insert(0, str(_TESTS / "quant"))
from lora_testing import save_adapter  # noqa: E402
from quant_testing import save_tiny_model  # noqa: E402

BLOCK = 4
PROMPT = list(range(300, 340))  # ten full blocks


@pytest.fixture(scope="module")
def model_and_adapter(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("lora-router")
    base = save_tiny_model("llama", root / "model")
    return root / "model", save_adapter(base, root / "sql", r=8, targets=["q_proj", "v_proj"], seed=1)


def engine(folder: Path) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(folder), served_model_name="tiny", executor="mock", enable_lora=True,
                                  max_loras=2, block_size=BLOCK, max_model_len=256, max_num_blocks=256))


async def hits(s: aiohttp.ClientSession, url: str) -> float:
    async with s.get(url + "/metrics") as r:
        text = await r.text()
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("hetero_infer_prefix_cache_hits_total"))


async def reported(s: aiohttp.ClientSession, url: str) -> set[int]:
    async with s.get(url + "/v1/cache/blocks") as r:
        return set((await r.json())["added"])


async def test_adapter_blocks_are_keyed_alike_by_the_worker_and_the_router(model_and_adapter):
    folder, adapter = model_and_adapter
    async with real_workers([engine(folder), engine(folder)], allow_runtime_lora_updating=True) as urls, \
            aiohttp.ClientSession() as s:
        for url in urls:
            async with s.post(url + "/v1/load_lora_adapter", json={"lora_name": "sql", "lora_path": str(adapter)}) as r:
                assert r.status == 200, await r.text()
        router, runner, router_url = await start_router(RouterOptions(
            worker=urls, health_interval_s=0.05, tokenizer="none", block_size=BLOCK))
        try:
            await wait_for(lambda: len(router.pool.ready()) == 2 and router.adapters == {"sql": "tiny"},
                           what="both workers and their adapter known")
            async with s.get(router_url + "/v1/models") as r:
                cards = {c["id"]: c for c in (await r.json())["data"]}
            assert cards["sql"]["parent"] == "tiny" and cards["sql"]["root"] == str(adapter)

            async def ask(model: str) -> None:
                async with s.post(router_url + "/v1/completions",
                                  json={"model": model, "prompt": PROMPT, "max_tokens": 2}) as r:
                    assert r.status == 200, await r.text()

            adapter_blocks = set(block_hashes(PROMPT, BLOCK, "sql"))
            await ask("sql")
            holders = [u for u in urls if adapter_blocks <= await reported(s, u)]
            assert len(holders) == 1, "the adapter's prompt blocks are not in a worker's report as the router hashes"
            (home,) = holders
            assert not set(block_hashes(PROMPT, BLOCK)) & (await reported(s, home))  # keyed apart from the base

            await wait_for(lambda: router.index.count(home) >= len(adapter_blocks), what="the router read the report")
            before = {u: await hits(s, u) for u in urls}
            await ask("sql")
            after = {u: await hits(s, u) for u in urls}
            assert after[home] - before[home] >= len(PROMPT) - BLOCK  # back to its cache
            await ask("tiny")
            base_hits = {u: await hits(s, u) - after[u] for u in urls}
            assert base_hits == {u: 0 for u in urls}  # the base model shares no block with the adapter
        finally:
            await runner.cleanup()


async def test_kv_events_carry_the_adapter_id_and_the_router_follows_them(model_and_adapter):
    """A worker publishing KV events (real ZMQ, a small pool and a host tier, so blocks are evicted and saved): a
    subscriber decodes `BlockStored.lora_id` = the adapter's lora_int_id for the blocks of its requests, on both
    media, and None for the base model's; and the router, following the same events, holds the adapter-keyed
    hashes it computes for an adapter request, apart from the base's."""
    import asyncio
    import json
    import time

    import zmq

    from hetero_infer.contracts import kv_events

    folder, adapter = model_and_adapter
    config = json.dumps({"enable_kv_cache_events": True, "endpoint": "tcp://127.0.0.1:*", "topic": "kv"})
    # 24 blocks of 4 tokens: two 10-block prompts fill half the pool, so the load evicts into the host tier
    engine = LLMEngine(EngineConfig(model=str(folder), served_model_name="tiny", executor="mock", enable_lora=True,
                                    max_loras=2, block_size=BLOCK, max_model_len=256, max_num_blocks=24,
                                    kv_offloading_size=0.0002, kv_events_config=config))
    assert engine.block_manager.host is not None
    prompts = [list(range(1000 * i, 1000 * i + 40)) for i in range(1, 5)]
    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv")
    sub.connect(engine.kv_events.endpoint)
    try:
        async with real_workers([engine], allow_runtime_lora_updating=True) as (url,), aiohttp.ClientSession() as s:
            async with s.post(url + "/v1/load_lora_adapter", json={"lora_name": "sql", "lora_path": str(adapter)}) as r:
                assert r.status == 200, await r.text()
            (sql,) = engine.list_loras()
            router, runner, router_url = await start_router(RouterOptions(
                worker=[url], health_interval_s=0.05, tokenizer="none", block_size=BLOCK))
            try:
                await wait_for(lambda: router.pool.ready() and url in router.pool.feeds and router.pool.feeds[url].live,
                               what="the worker ready and its events followed")
                await asyncio.sleep(0.3)  # PUB/SUB: batches sent before a subscription reaches the publisher are lost

                async def ask(model: str, prompt: list[int]) -> None:
                    async with s.post(router_url + "/v1/completions",
                                      json={"model": model, "prompt": prompt, "max_tokens": 2}) as r:
                        assert r.status == 200, await r.text()

                for prompt in prompts:
                    await ask("sql", prompt)
                    await ask("tiny", prompt)
                await ask("sql", PROMPT)
                adapter_blocks = set(block_hashes(PROMPT, BLOCK, "sql"))
                await wait_for(lambda: adapter_blocks <= router.index.blocks(url), what="the adapter's blocks indexed")
                assert not set(block_hashes(PROMPT, BLOCK)) & router.index.blocks(url)  # keyed apart from the base
                assert router.pool.feeds[url].batches > 0
            finally:
                await runner.cleanup()
        ids: dict[int, int | None] = {}  # block hash -> the lora_id of its BlockStored events
        media: set[tuple[str | None, int | None]] = set()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and sub.poll(500):
            _, _, payload = sub.recv_multipart()
            for event in kv_events.decode_batch(payload).events:
                if isinstance(event, kv_events.BlockStored):
                    media.add((event.medium, event.lora_id))
                    for h in event.block_hashes:
                        assert ids.setdefault(h, event.lora_id) == event.lora_id, "a hash stored under two ids"
    finally:
        sub.close(0)
        context.term()
    for prompt in [*prompts, PROMPT]:
        for h in block_hashes(prompt, BLOCK, "sql"):
            assert ids.get(h, sql.lora_int_id) == sql.lora_int_id
        for h in block_hashes(prompt, BLOCK):
            assert ids.get(h) is None
    stored = set(ids)
    assert set(block_hashes(PROMPT, BLOCK, "sql")) <= stored and set(block_hashes(prompts[0], BLOCK)) <= stored
    assert {(kv_events.DEVICE_MEDIUM, sql.lora_int_id), (kv_events.DEVICE_MEDIUM, None),
            (kv_events.HOST_MEDIUM, sql.lora_int_id), (kv_events.HOST_MEDIUM, None)} <= media
