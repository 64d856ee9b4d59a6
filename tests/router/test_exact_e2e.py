"""The exact index end to end with real processes: two mock workers (one running its engine in a child process,
so the block reports cross that pipe too; small KV pools, so blocks are evicted) behind `hetero-infer router
--tokenizer default`, chat requests as text. Once the router has polled, its index holds as many blocks per
worker as the worker reports, and for every request the tokens the router predicted the chosen worker holds
are the tokens that worker served from its prefix cache."""

from __future__ import annotations

import json

import openai
import pytest
from router_proc import get, samples, start_router, start_workers, wait_index_synced

pytestmark = pytest.mark.slow  # three processes start (about a minute on two loaded cores)

SYSTEMS = [f"You are assistant number {k}. Answer in one short sentence and never guess. " * 6 for k in range(3)]


def by_worker(router_url: str, name: str) -> dict[str, float]:
    return samples(router_url, name)


def test_router_predictions_are_the_workers_prefix_cache_hits():
    workers = start_workers(2, "--max-num-blocks", "24", "--mock-step-latency-s", "0.005",
                            extra={0: ["--engine-process"]})
    try:
        router = start_router(workers, "--tokenizer", "default", "--policy", "prefix")
        try:
            c = openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0, timeout=120)
            model = c.models.list().data[0].id
            urls = [w.url for w in workers]
            total_hits = 0.0
            for i in range(12):
                hits_before = [sum(samples(u, "hetero_infer_prefix_cache_hits_total").values()) for u in urls]
                matched_before = by_worker(router.url, "hetero_infer_router_prefix_matched_tokens_total")
                c.chat.completions.create(model=model, max_tokens=3, messages=[
                    {"role": "system", "content": SYSTEMS[i % 3]}, {"role": "user", "content": f"Question {i}?"}])
                wait_index_synced(router.url, urls)  # the router polls every 0.2 s
                matched_after = by_worker(router.url, "hetero_infer_router_prefix_matched_tokens_total")
                for u, before in zip(urls, hits_before):
                    got = sum(samples(u, "hetero_infer_prefix_cache_hits_total").values()) - before
                    predicted = matched_after.get(u, 0.0) - matched_before.get(u, 0.0)
                    assert got == predicted, (i, u, got, predicted)
                    total_hits += got
            assert by_worker(router.url, "hetero_infer_router_worker_reports_blocks") == {u: 1.0 for u in urls}
            assert total_hits > 0
            evictions = [json.loads(get(u + "/v1/cache/blocks")[1]) for u in urls]
            assert any(e["seq"] > len(e["added"]) for e in evictions)  # blocks left a cache too
        finally:
            router.stop()
    finally:
        for w in workers:
            w.stop()
