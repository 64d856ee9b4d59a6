"""The router's proxy against in-process fake workers: pass-through, retries before the first byte only,
holding while no worker is ready, client disconnects, and routing by prefix."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
import pytest
from router_fakes import FakeWorker, start_router, wait_for

from hetero_infer.contracts.block_hashes import BlockLog
from hetero_infer.contracts.router_options import RouterOptions
from hetero_infer.router.hashing import block_hashes


@contextlib.asynccontextmanager
async def cluster(*workers: FakeWorker, **options):
    for w in workers:
        await w.start()
    opts = RouterOptions(worker=[w.url for w in workers], health_interval_s=0.05, **options)
    router, runner, url = await start_router(opts)
    session = aiohttp.ClientSession()
    try:
        await wait_for(lambda: len(router.pool.ready()) == sum(w.ready for w in workers), what="workers ready")
        yield router, url, session
    finally:
        await session.close()
        await runner.cleanup()
        for w in workers:
            await w.stop()


def metric(router, name: str, **labels) -> float:
    value = router.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def test_stream_passes_through_untouched():
    a = FakeWorker("a", chunks=4)
    async with cluster(a) as (router, url, s):
        async with s.post(url + "/v1/completions", json={"prompt": "hi", "stream": True}) as r:
            body = await r.read()
            assert r.status == 200 and r.headers["Content-Type"] == "text/event-stream"
            assert r.headers["X-From"] == "a"
    expected = "".join(f'data: {{"worker": "a", "i": {i}}}\n\n' for i in range(4)) + "data: [DONE]\n\n"
    assert body.decode() == expected
    assert a.requests == [{"prompt": "hi", "stream": True}]


@pytest.mark.parametrize("status", [503, 429])
async def test_a_refusal_is_retried_on_another_worker(status):
    a, b = FakeWorker("a", refuse=status), FakeWorker("b", refuse=status)
    async with cluster(a, b, policy="round-robin") as (router, url, s):
        b.refuse = None
        for _ in range(2):  # one of the two starts on a
            async with s.post(url + "/v1/completions", json={"prompt": "x"}) as r:
                assert r.status == 200 and r.headers["X-From"] == "b"
        assert len(b.requests) == 2 and len(a.requests) >= 1
        assert metric(router, "hetero_infer_router_retries_total", worker=a.url, reason=f"status {status}") == len(a.requests)


async def test_when_every_worker_refuses_the_client_gets_the_refusal():
    a, b = FakeWorker("a", refuse=429), FakeWorker("b", refuse=429)
    async with cluster(a, b) as (router, url, s):
        async with s.post(url + "/v1/completions", json={"prompt": "x"}) as r:
            assert r.status == 429 and (await r.json())["error"]["message"] == "busy"
    assert len(a.requests) == len(b.requests) == 1


async def test_a_dead_worker_is_retried_elsewhere_and_leaves_the_pool():
    a, b = FakeWorker("a"), FakeWorker("b")
    async with cluster(a, b, policy="round-robin") as (router, url, s):
        router.pool.interval_s = 3600  # no health check notices before the request does
        await a.stop()
        for _ in range(3):
            async with s.post(url + "/v1/completions", json={"prompt": "x"}) as r:
                assert r.status == 200 and r.headers["X-From"] == "b"
        assert [w.url for w in router.pool.ready()] == [b.url]
        assert metric(router, "hetero_infer_router_retries_total", worker=a.url, reason="connect") == 1


async def test_no_second_send_once_a_byte_went_back():
    a, b = FakeWorker("a", drop_after_first=True), FakeWorker("b")
    async with cluster(a, b, policy="round-robin") as (router, url, s):
        router._rr = {None: sorted([a.url, b.url]).index(a.url)}
        with pytest.raises(aiohttp.ClientPayloadError):
            async with s.post(url + "/v1/completions", json={"prompt": "x", "stream": True}) as r:
                assert (await r.content.readline()).startswith(b"data:")
                a.cut.set()
                await r.read()
        assert len(a.requests) == 1 and b.requests == []


async def test_held_while_no_worker_is_ready_then_served():
    a = FakeWorker("a", ready=False)
    async with cluster(a, hold_timeout_s=120) as (router, url, s):
        task = asyncio.create_task(s.post(url + "/v1/completions", json={"prompt": "x"}))
        await wait_for(lambda: metric(router, "hetero_infer_router_requests_held") == 1, what="held request")
        assert a.requests == []
        a.ready = True
        r = await asyncio.wait_for(task, 60)
        assert r.status == 200 and len(a.requests) == 1
        assert metric(router, "hetero_infer_router_requests_held") == 0
        assert metric(router, "hetero_infer_router_hold_seconds_count") == 1


async def test_hold_timeout_gives_503_with_retry_after():
    a = FakeWorker("a", ready=False)
    async with cluster(a, hold_timeout_s=0.3, retry_after_s=7) as (router, url, s):
        async with s.post(url + "/v1/completions", json={"prompt": "x"}) as r:
            assert r.status == 503 and r.headers["Retry-After"] == "7"
            assert "error" in await r.json()
    assert a.requests == []


async def test_a_client_disconnect_aborts_the_upstream_request():
    a = FakeWorker("a", stall=True)
    async with cluster(a) as (router, url, s):
        r = await s.post(url + "/v1/completions", json={"prompt": "x", "stream": True})
        assert (await r.content.readline()).startswith(b"data:")
        r.close()
        await wait_for(a.aborted.is_set, what="the worker to see the abort")
        await wait_for(lambda: router.pool.workers[a.url].in_flight == 0, what="in-flight count back to 0")


async def test_prefix_policy_sends_a_shared_prefix_to_the_same_worker():
    workers = [FakeWorker(n) for n in "abc"]
    system = "You are a helpful assistant. " * 20
    async with cluster(*workers, policy="prefix") as (router, url, s):
        seen = []
        for user in range(6):
            async with s.post(url + "/v1/completions", json={"prompt": system + f"user {user}"}) as r:
                seen.append(r.headers["X-From"])
        assert len(set(seen)) == 1
        other = []
        for user in range(6):
            async with s.post(url + "/v1/completions", json={"prompt": f"{user} unrelated " * 30}) as r:
                other.append(r.headers["X-From"])
        assert len(set(other)) > 1  # cold prefixes spread (the rendezvous rank of their first block)
        assert metric(router, "hetero_infer_router_prefix_matched_tokens_total", worker=workers["abc".index(seen[0])].url) > 0


async def test_prefix_policy_follows_the_workers_block_reports():
    ids = list(range(100, 132))  # 8 blocks of 4
    logs = [BlockLog(), BlockLog()]
    a, b = FakeWorker("a", block_log=logs[0]), FakeWorker("b", block_log=logs[1])
    async with cluster(a, b, policy="prefix", block_size=4) as (router, url, s):
        for h in block_hashes(ids, 4)[:5]:
            logs[1].added(h)
        await wait_for(lambda: len(router.index.blocks(b.url)) == 5, what="b's report")
        async with s.post(url + "/v1/completions", json={"prompt": ids}) as r:
            assert r.headers["X-From"] == "b"
        for h in block_hashes(ids, 4):
            logs[0].added(h)
        await wait_for(lambda: len(router.index.blocks(a.url)) == 8, what="a's report")
        async with s.post(url + "/v1/completions", json={"prompt": ids}) as r:
            assert r.headers["X-From"] == "a"
        assert metric(router, "hetero_infer_router_prefix_matched_tokens_total", worker=a.url) == 32


async def test_least_load_follows_the_queues_the_workers_report():
    a, b = FakeWorker("a", waiting=6), FakeWorker("b", waiting=2)
    async with cluster(a, b, policy="least-load") as (router, url, s):
        await wait_for(lambda: router.pool.workers[a.url].waiting == 6, what="a's scraped queue")
        for _ in range(3):
            async with s.post(url + "/v1/completions", json={"prompt": "x"}) as r:
                assert r.headers["X-From"] == "b"
        a.waiting, b.waiting = 0, 9
        await wait_for(lambda: router.pool.workers[b.url].waiting == 9, what="b's scraped queue")
        async with s.post(url + "/v1/completions", json={"prompt": "x"}) as r:
            assert r.headers["X-From"] == "a"
