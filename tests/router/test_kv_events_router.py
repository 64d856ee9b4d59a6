"""The router takes the workers' KV events in (router/kv_events.py): a real worker (mock executor, a small pool and a
host tier, real HTTP, real ZMQ) publishes them; after one block-report poll (the sync) the router's index follows
the worker's cache from its events alone and, at the end of a load, equals the worker's own block report, tier
by tier; a lost stretch of events is detected by its gap and resynced from the block report. Then the pure parts:
the batch's net change, the sync state machine, the endpoint, and tier-aware scoring (a worker holding the
prefix on its device beats one holding it in its host tier, which beats one without it)."""

from __future__ import annotations

import asyncio
import json
import random

import aiohttp
import pytest
from router_fakes import wait_for
from worker_thread import real_workers

from hetero_infer.contracts import kv_events
from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.contracts.options import InvalidOption
from hetero_infer.contracts.router_options import RouterOptions
from hetero_infer.router import policies
from hetero_infer.router.index import PrefixIndex
from hetero_infer.router.kv_events import EventsSync, TierChanges, net_changes, subscribe_endpoint
from hetero_infer.router.pool import WorkerPool
from hetero_infer.worker.core.engine import LLMEngine

BLOCK = 16


def tiered_engine() -> LLMEngine:
    # 24 blocks: a few prompts fill the pool, so the load evicts into the host tier (0.004 GiB: 11 mock blocks),
    # which drops blocks too
    config = json.dumps({"enable_kv_cache_events": True, "endpoint": "tcp://127.0.0.1:*", "topic": "kv"})
    return LLMEngine(EngineConfig(executor="mock", max_model_len=256, max_num_blocks=24, max_num_seqs=2,
                                  kv_offloading_size=0.004, kv_events_config=config))


async def load(session: aiohttp.ClientSession, url: str, model: str, rng: random.Random, n: int) -> None:
    prefixes = [[rng.randrange(100, 20000) for _ in range(4 * BLOCK)] for _ in range(5)]

    async def one(i: int) -> None:
        prompt = rng.choice(prefixes) + [rng.randrange(100, 20000) for _ in range(rng.randrange(1, 2 * BLOCK))]
        async with session.post(url + "/v1/completions",
                                json={"model": model, "prompt": prompt, "max_tokens": 4}) as r:
            assert r.status == 200, await r.text()

    for start in range(0, n, 2):
        await asyncio.gather(*(one(i) for i in range(start, min(start + 2, n))))


async def report(session: aiohttp.ClientSession, url: str) -> dict:
    async with session.get(url + "/v1/cache/blocks") as r:
        return await r.json()


async def matches_report(pool: WorkerPool, session: aiohttp.ClientSession, url: str) -> None:
    """The index (device blocks and host tier) equals the worker's snapshot report, once the events have arrived."""
    def same(data: dict) -> bool:
        return (pool.index.blocks(url) == frozenset(data["added"])
                and pool.index.host_blocks(url) == frozenset(data["host_added"]))

    for _ in range(100):
        data = await report(session, url)
        if same(data):
            return
        await asyncio.sleep(0.05)
    data = await report(session, url)
    assert pool.index.blocks(url) == frozenset(data["added"])
    assert pool.index.host_blocks(url) == frozenset(data["host_added"])


async def stream_delivers(pool: WorkerPool, worker, session: aiohttp.ClientSession, engine: LLMEngine,
                          rng: random.Random) -> None:
    """Requests until the feed is live and has applied a batch (PUB/SUB: batches sent before the subscription
    reaches the publisher are lost; such a gap is resynced by a poll, as the woken poll loop would)."""
    feed = pool.feeds[worker.url]
    for _ in range(50):
        before = feed.batches
        await load(session, worker.url, engine.model_name, rng, 1)
        for _ in range(40):
            if feed.batches > before:
                break
            await asyncio.sleep(0.05)
        if feed.live and feed.batches > before:
            return
        if not feed.live:
            await pool.check(worker)
    raise AssertionError("the worker's events never arrived")


async def test_the_index_follows_a_real_workers_events_and_resyncs_after_a_gap() -> None:
    engine = tiered_engine()
    rng = random.Random(3)
    async with real_workers([engine]) as (url,), aiohttp.ClientSession() as session:
        index = PrefixIndex()
        pool = WorkerPool([url], index, BLOCK, interval_s=3600)
        pool.session = session
        worker = pool.workers[url]
        await pool.check(worker)  # the poll: readiness, and the block report that advertises the events
        feed = pool.feeds[url]
        assert feed.endpoint.startswith("tcp://127.0.0.1:") and feed.live
        await stream_delivers(pool, worker, session, engine, rng)
        polls, resyncs = index.cursor(url), feed.resyncs

        await load(session, url, engine.model_name, rng, 24)
        await matches_report(pool, session, url)
        assert index.cursor(url) == polls, "no block report was taken in: the index is the events'"
        assert feed.batches > 0 and feed.resyncs == resyncs
        assert index.host_blocks(url), "the load evicted blocks into the host tier"
        assert index.host_blocks(url) == frozenset(engine.block_manager.host._slots)  # the engine is idle
        assert index.blocks(url) == frozenset(engine.block_manager.hash_to_block)
        assert engine.block_manager.blocks_restored > 0, "and restored some"

        # A stretch of events lost (the subscription down while the worker works): the first batch after it is a
        # gap; the feed asks for a poll, and the snapshot report resyncs the index.
        await feed.stop()
        await load(session, url, engine.model_name, rng, 8)
        feed.start()
        for _ in range(100):  # until the new subscription delivers a batch: the first is after the gap
            await load(session, url, engine.model_name, rng, 1)
            await asyncio.sleep(0.05)
            if not feed.live:
                break
        assert not feed.live, "the gap seen"
        assert pool._wake[url].is_set(), "a poll asked for at once"
        await pool.check(worker)  # what the woken poll loop does
        assert feed.resyncs == resyncs + 1
        await stream_delivers(pool, worker, session, engine, rng)
        await load(session, url, engine.model_name, rng, 8)
        await matches_report(pool, session, url)
        await pool.stop()


async def test_events_that_never_arrive_fall_back_to_block_reports(monkeypatch) -> None:
    """A worker whose advertised events the router cannot reach (a port closed between them): the stream stalls
    behind what the reports say, resyncs, and after a few stalls without a batch the router keeps to block
    reports, which keep the index exact."""
    from hetero_infer.router import pool as pool_module

    monkeypatch.setattr(pool_module, "subscribe_endpoint", lambda advertised, url: "tcp://127.0.0.1:9")
    engine = tiered_engine()
    rng = random.Random(11)
    async with real_workers([engine]) as (url,), aiohttp.ClientSession() as session:
        pool = WorkerPool([url], PrefixIndex(), BLOCK, interval_s=3600)
        pool.session = session
        worker = pool.workers[url]
        for _ in range(12):
            await pool.check(worker)
            if url in pool.no_events:
                break
            await load(session, url, engine.model_name, rng, 2)
        assert url in pool.no_events and url not in pool.feeds
        await load(session, url, engine.model_name, rng, 6)
        await pool.check(worker)
        data = await report(session, url)
        assert pool.index.blocks(url) == frozenset(data["added"])
        assert pool.index.host_blocks(url) == frozenset(data["host_added"])
        await pool.stop()


async def test_the_router_follows_events_and_routes_on_them() -> None:
    """Through the router: its poll loop syncs, the events keep it exact, and a worker leaving stops its feed."""
    from router_fakes import start_router

    engines = [tiered_engine(), tiered_engine()]
    async with real_workers(engines) as urls, aiohttp.ClientSession() as session:
        router, runner, url = await start_router(RouterOptions(worker=urls, health_interval_s=0.05,
                                                               block_size=BLOCK, tokenizer="none"))
        try:
            await wait_for(lambda: len(router.pool.ready()) == 2 and all(
                f.live for f in router.pool.feeds.values()) and len(router.pool.feeds) == 2, what="feeds live")
            await load(session, url, engines[0].model_name, random.Random(5), 24)
            for u in urls:
                await matches_report(router.pool, session, u)
            assert all(f.batches for f in router.pool.feeds.values())
            async with session.get(url + "/metrics") as r:
                text = await r.text()
            for u in urls:
                assert f'hetero_infer_router_worker_kv_events_live{{worker="{u}"}} 1.0' in text
                host = len(router.index.host_blocks(u))
                assert f'hetero_infer_router_index_host_blocks{{worker="{u}"}} {float(host)}' in text
            assert any(router.index.host_blocks(u) for u in urls)
            router.pool.mark_down(urls[0], "test")
            assert urls[0] not in router.pool.feeds
        finally:
            await runner.cleanup()


def test_the_router_can_be_told_not_to_read_events() -> None:
    pool = WorkerPool(["http://w"], PrefixIndex(), BLOCK, 1.0, kv_events=False)
    assert pool._follow_events(pool.workers["http://w"], ("tcp://*:5557", "", 3)) is None and not pool.feeds
    assert RouterOptions(kv_events=False).kv_events is False


# -- pure parts ----------------------------------------------------------------------------------------


def test_a_batch_is_its_net_change_per_tier() -> None:
    gpu, cpu = kv_events.DEVICE_MEDIUM, kv_events.HOST_MEDIUM
    events = [kv_events.BlockStored([1, 2, 3], None, [], 4, None, gpu),
              kv_events.BlockRemoved([2], gpu),
              kv_events.BlockStored([2], None, [], 4, None, cpu),
              kv_events.BlockStored([9], None, [], 4, None, None),  # no medium: the device
              kv_events.BlockRemoved([7], cpu)]
    c = net_changes(kv_events.decode_batch(kv_events.encode_batch(kv_events.KVEventBatch(ts=0.0, events=events))).events)
    assert (sorted(c.added), c.removed, c.host_added, c.host_removed, c.cleared) == ([1, 3, 9], [2], [2], [7], False)
    c = net_changes([kv_events.BlockStored([5], None, [], 4, None, gpu), kv_events.AllBlocksCleared(),
                     kv_events.BlockStored([6], None, [], 4, None, gpu)])
    assert c.cleared and c.added == [6] and not c.removed


def test_the_sync_applies_in_order_buffers_while_syncing_and_sees_gaps() -> None:
    a, b, c, d = (TierChanges(added=[i]) for i in range(4))
    sync = EventsSync()
    assert sync.receive(5, a) == [] and sync.receive(6, b) == [] and not sync.live  # buffered until a snapshot
    assert sync.synced(6) == [b] and sync.expected == 7  # the snapshot holds batch 5 already
    assert sync.receive(7, c) == [c]
    assert sync.receive(6, a) == []  # older than the stream: in the snapshot
    assert sync.receive(9, d) is None and not sync.live  # 8 lost
    assert sync.synced(8) is None  # the buffer (9) does not continue a snapshot at 8: ask again
    assert sync.receive(10, a) == [] and sync.synced(10) == [a] and sync.expected == 11
    restarted = EventsSync()
    restarted.expected = 50
    cleared = TierChanges(cleared=True)
    assert restarted.receive(0, cleared) == [cleared] and restarted.expected == 1  # a restarted worker's first batch
    empty = EventsSync()
    assert empty.synced(4) == [] and empty.expected == 4


def test_the_events_endpoint_is_the_workers_host_for_a_wildcard() -> None:
    assert subscribe_endpoint("tcp://*:5557", "http://10.0.0.7:8000") == "tcp://10.0.0.7:5557"
    assert subscribe_endpoint("tcp://0.0.0.0:5557", "http://[fd00::1]:8000") == "tcp://[fd00::1]:5557"
    assert subscribe_endpoint("tcp://127.0.0.1:4000", "http://localhost:8000") == "tcp://127.0.0.1:4000"
    assert subscribe_endpoint("ipc:///tmp/kv", "http://w:1") == "ipc:///tmp/kv"


def test_the_index_knows_each_tier_from_events() -> None:
    index = PrefixIndex()
    index.apply_events("w", TierChanges(added=[1, 2], host_added=[3, 4]))
    index.apply_events("w", TierChanges(removed=[2], host_added=[2], host_removed=[4]))
    assert index.blocks("w") == {1} and index.host_blocks("w") == {2, 3}
    # the prompt's blocks 1, 2, 3, 5: 1 on the device, then 2 and 3 in the host tier (restored), 5 nowhere
    assert index.host_match([1, 2, 3, 5], index.match([1, 2, 3, 5], ["w"])) == {"w": 2}
    index.apply_events("w", TierChanges(cleared=True, added=[7]))
    assert index.blocks("w") == {7} and not index.host_blocks("w")
    index.drop("w")
    assert not index.host_blocks("w")


def test_a_device_hit_beats_a_host_hit_which_beats_none() -> None:
    states = [policies.EndpointState(u, max_num_seqs=8, num_blocks=1000) for u in ("http://a", "http://b", "http://c")]
    device, host, none = "http://a", "http://b", "http://c"
    index = PrefixIndex()
    prompt = list(range(100, 110))
    index.apply_events(device, TierChanges(added=prompt))
    index.apply_events(host, TierChanges(host_added=prompt))
    index.apply_events(none, TierChanges(added=[1, 2]))

    def choose(states: list[policies.EndpointState], weight: float = policies.HOST_HIT_WEIGHT) -> policies.Decision:
        urls = [s.url for s in states]
        matched = index.match(prompt, urls)
        return policies.prefix(states, matched, host_matched=index.host_match(prompt, matched), host_weight=weight,
                               eviction={u: index.eviction_cost(u, len(prompt)) for u in urls})

    assert choose(states) == policies.Decision(device, 10, 0)
    assert choose(states[1:]) == policies.Decision(host, 0, 10)
    # the host holder wins even when the worker without the prefix is idle and it is not (under its bound)
    busy = [policies.EndpointState(host, in_flight=2, max_num_seqs=8, num_blocks=1000), states[2]]
    assert choose(busy).url == host
    # a host run more than 1/weight times the device run beats it
    assert policies.tier_score(3, 0) < policies.tier_score(0, 7) and policies.tier_score(4, 0) > policies.tier_score(0, 7)
    # the load bound still holds: a device holder at its bound (no free sequence slot) loses to the host holder
    full = [policies.EndpointState(device, in_flight=2, waiting=2, max_num_seqs=2, num_blocks=1000),
            policies.EndpointState(host, max_num_seqs=8, num_blocks=1000), states[2]]
    assert choose(full).url == host


def test_the_host_weight_is_checked() -> None:
    for bad in (-0.1, 1.0, 2):
        with pytest.raises(InvalidOption, match="host_hit_weight"):
            RouterOptions(host_hit_weight=bad)
