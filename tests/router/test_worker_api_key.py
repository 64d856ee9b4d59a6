"""Workers started with --api-key guard GET /v1/cache/blocks like the rest of /v1/: the router sends the key
given as --worker-api-key on its block-report polls, and without it falls back to the approximate index."""

from __future__ import annotations

import contextlib

import pytest
from router_fakes import start_router, wait_for
from worker_thread import real_workers

from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.contracts.router_options import RouterOptions
from hetero_infer.worker.core.engine import LLMEngine

KEY = "sk-worker-secret"


@contextlib.asynccontextmanager
async def keyed_worker():
    engine = LLMEngine(EngineConfig(executor="mock", max_model_len=128, max_num_blocks=16, max_num_seqs=2))
    async with real_workers([engine], api_key=[KEY]) as (url,):
        yield url


@pytest.mark.parametrize("key, reports", [(KEY, True), (None, False), ("wrong", False)])
async def test_block_reports_need_the_workers_key(key, reports):
    async with keyed_worker() as url:
        router, runner, _ = await start_router(RouterOptions(worker=[url], health_interval_s=0.02,
                                                             worker_api_key=key))
        try:
            worker = router.pool.workers[url]
            await wait_for(lambda: worker.reports_blocks is not None, what="first block-report poll")
            assert worker.reports_blocks is reports
            assert len(router.pool.ready()) == 1  # the worker serves either way
        finally:
            await runner.cleanup()


def test_the_key_is_never_printed():
    assert KEY not in repr(RouterOptions(worker_api_key=KEY))
