"""LoRA adapters behind the router: what a worker's vllm:lora_requests_info says (parsed as the Gateway API
Inference Extension's endpoint picker reads it), the affinity order of llm-d's LoRA scorer (workers using the
adapter, then those with a free adapter slot, then the rest) inside the load bound and the prefix affinity, and the
router's /v1/models listing every adapter with its parent. Policies as pure functions; the routing through real
HTTP with in-process fake workers."""

from __future__ import annotations

import asyncio
import contextlib

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest
from router_fakes import FakeWorker, wait_for
from test_models import cluster as model_cluster

from hetero_infer.router.hashing import block_hashes, text_block_hashes
from hetero_infer.router.lora import LoraInfo, adapter_bases, parse_lora_info
from hetero_infer.router.policies import (
    LORA_ACTIVE,
    LORA_FREE_SLOT,
    LORA_NO_SLOT,
    EndpointState,
    least_load,
    lora_rank,
    prefix,
)
from hetero_infer.router.prompt import request_hashes

A, B, C = "http://a", "http://b", "http://c"
LABELS = ["max_lora", "running_lora_adapters", "waiting_lora_adapters"]


def lora_line(max_lora: int, running: str = "", waiting: str = "", at: float = 1.7e9) -> str:
    return (f'vllm:lora_requests_info{{max_lora="{max_lora}",running_lora_adapters="{running}",'
            f'waiting_lora_adapters="{waiting}"}} {at}\n')


# -- what a worker reports ------------------------------------------------------------------------------------------
names = st.lists(st.from_regex(r"[a-z][a-z0-9-]{0,8}", fullmatch=True), max_size=4, unique=True)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 16), names, names), min_size=1, max_size=4, unique_by=lambda t: t[0]))
def test_the_latest_sample_wins_as_the_endpoint_picker_reads_it(label_sets):
    """A server may keep older label sets (vLLM does: a gauge per label set, set to the time); the one with the
    latest timestamp is the current state, among the other families of a real exposition."""
    r = CollectorRegistry()
    Histogram("vllm:time_to_first_token_seconds", "ttft", ["model_name"], registry=r).labels("m").observe(0.1)
    g = Gauge("vllm:lora_requests_info", "Running stats on lora requests.", LABELS, registry=r)
    for i, (max_lora, running, waiting) in enumerate(label_sets):
        g.labels(str(max_lora), ",".join(running), ",".join(waiting)).set(1.7e9 + i)
    max_lora, running, waiting = label_sets[-1]
    assert parse_lora_info(generate_latest(r).decode()) == LoraInfo(max_lora, frozenset(running), frozenset(waiting))


def test_a_worker_without_adapters_reports_none():
    assert parse_lora_info("hetero_infer_num_requests_running 1\n") is None
    assert parse_lora_info(lora_line(4, "a, b", "c")) == LoraInfo(4, frozenset({"a", "b"}), frozenset({"c"}))
    assert parse_lora_info('vllm:lora_requests_info{max_lora="x"} 1\n') is None  # unreadable: as none


def test_adapters_are_the_cards_with_a_parent():
    cards = [[{"id": "base"}, {"id": "sql", "parent": "base"}], [{"id": "base", "parent": None},
                                                                  {"id": "chat", "parent": "base"}]]
    assert adapter_bases(cards) == {"sql": "base", "chat": "base"}


# -- the affinity order -----------------------------------------------------------------------------------------------
def test_lora_rank_follows_the_llm_d_scorer():
    using = EndpointState(A, max_lora=2, adapters=frozenset({"sql"}))
    free = EndpointState(B, max_lora=2, adapters=frozenset({"chat"}))
    full = EndpointState(C, max_lora=1, adapters=frozenset({"chat"}))
    assert [lora_rank(e, "sql") for e in (using, free, full)] == [LORA_ACTIVE, LORA_FREE_SLOT, LORA_NO_SLOT]
    assert lora_rank(full, None) == LORA_ACTIVE  # the base model runs anywhere
    assert lora_rank(EndpointState(A), "sql") == LORA_FREE_SLOT  # no report: taken to have a slot


def test_prefix_policy_prefers_the_adapter_then_a_free_slot_within_the_load_bound():
    using = EndpointState(A, in_flight=1, max_lora=1, adapters=frozenset({"sql"}))
    free = EndpointState(B, max_lora=2, adapters=frozenset({"chat"}))
    full = EndpointState(C, max_lora=1, adapters=frozenset({"chat"}))
    assert prefix([full, free, using], {}, adapter="sql").url == A  # using it, though the others are idler
    assert prefix([full, free], {}, adapter="sql").url == B  # a free slot before a full one
    assert prefix([full, free], {C: 3}, adapter="sql").url == B  # a held prefix does not buy a wait for a slot
    assert prefix([using, free], {B: 2}, adapter="sql").url == B  # the longest prefix first among those with a slot
    busy = EndpointState(A, in_flight=9, max_lora=1, adapters=frozenset({"sql"}))
    assert prefix([busy, free, full], {}, adapter="sql").url == B  # over its load bound: spills to a free slot
    assert prefix([busy, full], {}, adapter="sql").url == C  # nowhere else: the least loaded after all
    assert least_load([full, free], adapter="sql").url == B
    assert least_load([full, using], adapter="chat").url == C


def test_an_adapters_blocks_chain_from_its_own_root():
    ids = list(range(40))
    base, sql = block_hashes(ids, 16), block_hashes(ids, 16, "sql")
    assert len(base) == len(sql) == 2 and not set(base) & set(sql) and sql != block_hashes(ids, 16, "chat")
    payload = {"model": "sql", "prompt": ids}
    assert request_hashes(payload, None, 16, 64, adapter="sql") == (sql, True)
    text = "x" * 200
    assert text_block_hashes(text, 64, "sql") != text_block_hashes(text, 64) != []


# -- through the router -----------------------------------------------------------------------------------------------
@contextlib.asynccontextmanager
async def cluster(*workers: FakeWorker, **options):
    """test_models' cluster, once the router has read every worker's adapter slots too."""
    async with model_cluster(*workers, **options) as (router, url, session):
        await wait_for(lambda: all(w.lora is not None for w in router.pool.workers.values()), what="lora info read")
        yield router, url, session


def lora_worker(name: str, max_lora: int, running: str = "") -> FakeWorker:
    return FakeWorker(name, models=["base", "sql", "chat"], parents={"sql": "base", "chat": "base"}, stall=True,
                      extra_metrics=lora_line(max_lora, running))


async def test_adapter_requests_go_to_the_worker_using_it_then_to_a_free_slot():
    full = lora_worker("full", 1, "chat")  # its one slot is taken by another adapter
    using = lora_worker("using", 2, "sql")
    free1, free2 = lora_worker("free1", 2, "chat"), lora_worker("free2", 2, "chat")
    workers = (full, using, free1, free2)
    async with cluster(*workers) as (router, url, s):
        assert router.adapters == {"sql": "base", "chat": "base"}
        sent = []
        for i in range(7):  # distinct prompts: no prefix to follow; each stays open (the workers stall)
            before = sum(len(w.requests) for w in workers)
            sent.append(asyncio.create_task(s.post(url + "/v1/completions",
                                                   json={"model": "sql", "prompt": f"prompt {i} " * 20})))
            await wait_for(lambda b=before: sum(len(w.requests) for w in workers) == b + 1,
                           what=f"request {i} arrived")
        order = [w.name for i in range(7) for w in workers
                 if any(r["prompt"].startswith(f"prompt {i} ") for r in w.requests)]
        for task in sent:
            task.cancel()
        await asyncio.gather(*sent, return_exceptions=True)
    # `using` takes them up to its load bound (4 open: the slack of 4 above the fair share); then one worker with
    # a free slot, which from the first request the router sent it uses the adapter too (before its next report
    # says so), so it takes the rest rather than a second worker loading it; never the worker without a slot
    assert order[:4] == ["using"] * 4 and order[4] in ("free1", "free2") and order[4:] == [order[4]] * 3, order
    routed = {rank: router.metrics.registry.get_sample_value("hetero_infer_router_lora_routed_total", {"rank": rank})
              for rank in ("active", "free_slot", "no_slot")}
    assert routed == {"active": 6.0, "free_slot": 1.0, "no_slot": None}


async def test_the_same_adapter_prompt_returns_to_its_worker_and_the_base_prompt_is_another_prefix():
    a, b = lora_worker("a", 4), lora_worker("b", 4)
    for w in (a, b):
        w.stall = False
    async with cluster(a, b) as (router, url, s):
        async def ask(model: str) -> str:
            async with s.post(url + "/v1/completions", json={"model": model, "prompt": "shared system " * 30}) as r:
                assert r.status == 200
                await r.read()
                return r.headers["X-From"]

        first = await ask("sql")
        assert all([await ask("sql") == first for _ in range(4)])
        sql_hashes = request_hashes({"prompt": "shared system " * 30}, None, 16,
                                    router.options.text_chunk_bytes, adapter="sql")[0]
        base_hashes = request_hashes({"prompt": "shared system " * 30}, None, 16, router.options.text_chunk_bytes)[0]
        assert router.index.match(sql_hashes, [a.url, b.url], False)[router.pool.workers[a.url if first == "a"
                                                                                         else b.url].url] > 0
        assert not any(router.index.match(base_hashes, [a.url, b.url], False).values())


async def test_router_models_list_every_adapter_of_the_pool_with_its_parent():
    a = FakeWorker("a", models=["base", "sql"], parents={"sql": "base"}, extra_metrics=lora_line(2))
    b = FakeWorker("b", models=["base", "chat"], parents={"chat": "base"}, extra_metrics=lora_line(2))
    async with cluster(a, b) as (router, url, s):
        async with s.get(url + "/v1/models") as r:
            cards = {c["id"]: c for c in (await r.json())["data"]}
        async with s.post(url + "/v1/completions", json={"model": "chat", "prompt": "hi"}) as r:
            assert r.status == 200 and r.headers["X-From"] == "b"  # only b holds it
    assert set(cards) == {"base", "sql", "chat"}
    assert cards["sql"]["parent"] == cards["chat"]["parent"] == "base" and "parent" not in cards["base"]
