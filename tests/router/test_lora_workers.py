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
