"""Routing by model: the router learns each worker's models from its GET /v1/models and sends each request to a
worker of its `model` (in-process fake workers; the end-to-end run with real processes is
test_models_e2e.py)."""

from __future__ import annotations

import asyncio
import collections
import contextlib

import aiohttp
import pytest
from router_fakes import FakeWorker, start_router, wait_for

from hetero_infer.contracts.options import InvalidOption
from hetero_infer.contracts.router_options import RouterOptions, parse_aliases
from hetero_infer.router.models import model_ids, pick_target, union_cards


@contextlib.asynccontextmanager
async def cluster(*workers: FakeWorker, **options):
    for w in workers:
        await w.start()
    opts = RouterOptions(worker=[w.url for w in workers], health_interval_s=0.05, tokenizer="none", **options)
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


async def ask(s: aiohttp.ClientSession, url: str, model: str, prompt: str = "x") -> tuple[int, dict | str]:
    async with s.post(url + "/v1/completions", json={"model": model, "prompt": prompt}) as r:
        return r.status, (await r.json() if r.status != 200 else r.headers["X-From"])


async def test_each_request_goes_to_a_worker_of_its_model():
    a1, a2, b = FakeWorker("a1", models=["alpha"]), FakeWorker("a2", models=["alpha"]), FakeWorker("b", models=["beta"])
    async with cluster(a1, a2, b) as (router, url, s):
        answers = [await ask(s, url, m, f"prompt {i}") for i, m in enumerate(["alpha", "beta"] * 10)]
    assert all(status == 200 for status, _ in answers), answers
    assert {w for (_, w), m in zip(answers, ["alpha", "beta"] * 10) if m == "beta"} == {"b"}
    assert {w for (_, w), m in zip(answers, ["alpha", "beta"] * 10) if m == "alpha"} <= {"a1", "a2"}
    assert len(b.requests) == 10 and len(a1.requests) + len(a2.requests) == 10


async def test_models_is_the_union_and_an_unknown_model_is_a_404_listing_them():
    a, b = FakeWorker("a", models=["alpha", "alpha-lora"]), FakeWorker("b", models=["beta"])
    async with cluster(a, b, model_alias=["chat=alpha"]) as (router, url, s):
        async with s.get(url + "/v1/models") as r:
            assert r.status == 200
            assert [c["id"] for c in (await r.json())["data"]] == ["alpha", "alpha-lora", "beta", "chat"]
        async with s.get(url + "/v1/models/beta") as r:
            assert r.status == 200 and (await r.json())["id"] == "beta"
        status, body = await ask(s, url, "gamma")
        async with s.get(url + "/v1/models/gamma") as r:
            assert r.status == 404
    assert status == 404 and body["error"]["code"] == "model_not_found" and body["error"]["param"] == "model"
    assert "`alpha`, `alpha-lora`, `beta`, `chat`" in body["error"]["message"]
    assert a.requests == [] and b.requests == []  # nothing was sent anywhere


async def test_a_model_with_no_ready_worker_is_held_until_one_is_ready():
    a, b = FakeWorker("a", models=["alpha"]), FakeWorker("b", models=["beta"])
    async with cluster(a, b, hold_timeout_s=60) as (router, url, s):
        await wait_for(lambda: router.pool.known_models() == {"alpha", "beta"}, what="models known")
        b.ready = False
        await wait_for(lambda: [w.url for w in router.pool.ready()] == [a.url], what="b out of the pool")
        held = asyncio.create_task(ask(s, url, "beta"))
        await wait_for(lambda: router.metrics.registry.get_sample_value("hetero_infer_router_requests_held") == 1,
                       what="the beta request held")
        assert await ask(s, url, "alpha") == (200, "a")  # the other model is not held meanwhile
        assert not held.done()
        b.ready = True
        assert await asyncio.wait_for(held, 30) == (200, "b")
    assert len(a.requests) == 1


async def test_a_request_held_before_the_workers_listed_models_is_a_404_once_none_serves_it():
    a = FakeWorker("a", models=["alpha"], ready=False)
    async with cluster(a, hold_timeout_s=60) as (router, url, s):
        held = asyncio.create_task(ask(s, url, "gamma"))  # a's models are not known yet: held, not refused
        await wait_for(lambda: router.metrics.registry.get_sample_value("hetero_infer_router_requests_held") == 1,
                       what="held")
        a.ready = True
        status, body = await asyncio.wait_for(held, 30)
    assert status == 404 and "`alpha`" in body["error"]["message"]


async def test_a_worker_that_does_not_list_models_is_sent_any_model():
    other, b = FakeWorker("other"), FakeWorker("b", models=["beta"])  # `other` answers 404 to GET /v1/models
    async with cluster(other, b, policy="round-robin") as (router, url, s):
        seen = collections.Counter([(await ask(s, url, "beta"))[1] for _ in range(4)])
        assert seen == {"other": 2, "b": 2}
        assert (await ask(s, url, "zeta"))[0] == 200  # who knows what `other` serves: it is asked


async def test_an_alias_renames_and_a_canary_splits_by_weight_and_prompt():
    old, new = FakeWorker("old", models=["m-v1"]), FakeWorker("new", models=["m-v2"])
    async with cluster(old, new, model_alias=["m=m-v1:3", "m=m-v2:1", "legacy=m-v1"]) as (router, url, s):
        assert await ask(s, url, "legacy") == (200, "old")
        assert old.requests[-1]["model"] == "m-v1"  # the worker sees its own name
        prompts = [f"conversation {i} " * 20 for i in range(200)]
        first = [(await ask(s, url, "m", p))[1] for p in prompts]
        again = [(await ask(s, url, "m", p))[1] for p in prompts[:50]]
    assert again == first[:50]  # a prompt always goes to the same target (its cache)
    share = first.count("new") / len(first)
    assert 0.15 <= share <= 0.35, share  # weight 1 of 4
    assert {r["model"] for r in new.requests} == {"m-v2"}


def test_pick_target_shares_follow_the_weights():
    targets = (("a", 1.0), ("b", 2.0), ("c", 7.0))
    counts = collections.Counter(pick_target(targets, key * 0x9E3779B97F4A7C15 % 2**64) for key in range(20000))
    assert abs(counts["a"] / 20000 - 0.1) < 0.02 and abs(counts["c"] / 20000 - 0.7) < 0.02
    # Adding a target moves prompts only to it (rendezvous): none moves between the old ones.
    more = targets + (("d", 2.0),)
    moved = [k for k in range(2000) if pick_target(targets, k * 7919) != pick_target(more, k * 7919)]
    assert moved and all(pick_target(more, k * 7919) == "d" for k in moved)


def test_aliases_parse_and_bad_ones_are_refused():
    assert parse_aliases(["chat=alpha", "c=x:9", "c=y:1", "o=llama3:8b:2"]) == {
        "chat": (("alpha", 1.0),), "c": (("x", 9.0), ("y", 1.0)), "o": (("llama3:8b", 2.0),)}
    assert RouterOptions(model_alias=["a=x,b=y"]).aliases == {"a": (("x", 1.0),), "b": (("y", 1.0),)}
    for bad in (["chat"], ["=x"], ["chat="], ["c=x:0"], ["c=x:-1"], ["c=x", "c=x:2"]):
        with pytest.raises(InvalidOption):
            RouterOptions(model_alias=bad)


def test_model_lists_and_their_union():
    assert model_ids({"data": [{"id": "a"}, {"id": "b", "parent": "a"}]}) == [{"id": "a"}, {"id": "b", "parent": "a"}]
    for bad in ({}, {"data": {}}, {"data": [{"name": "a"}]}, []):
        with pytest.raises(ValueError):
            model_ids(bad)
    cards = union_cards([[{"id": "b", "owned_by": "w1"}], [{"id": "a"}, {"id": "b", "owned_by": "w2"}]], ["c", "a"])
    assert [c["id"] for c in cards] == ["a", "b", "c"] and cards[1]["owned_by"] == "w1"


async def test_models_asked_before_any_worker_listed_waits_for_the_first():
    a = FakeWorker("a", models=["alpha"], ready=False)
    async with cluster(a, hold_timeout_s=60) as (router, url, s):
        async def models() -> list[str]:
            async with s.get(url + "/v1/models") as r:
                return [c["id"] for c in (await r.json())["data"]]

        asked = asyncio.create_task(models())
        await asyncio.sleep(0.3)
        assert not asked.done()  # not an empty list: nothing is known yet
        a.ready = True
        assert await asyncio.wait_for(asked, 30) == ["alpha"]
