"""--flow-control: the router's queues per (tenant, priority). The queue's rules on their own (FlowControl with a
fixed capacity), then through a router in front of a real mock worker (max_num_seqs 4): two tenants flooding at
5x and 10x its capacity each complete half of the requests, and a low-priority flood is shed with 429s while
high-priority requests all run."""

from __future__ import annotations

import asyncio
import collections
import time

import aiohttp
import pytest
from router_fakes import start_router, wait_for
from worker_thread import real_workers

from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.contracts.router_options import RouterOptions
from hetero_infer.router.flow import FlowControl, Shed, priority_of, tenant_of
from hetero_infer.worker.core.engine import LLMEngine


# -- the queue ---------------------------------------------------------------------------------------------
class Recorder:
    """Requests through a FlowControl of fixed capacity, recording the order they got their slots."""

    def __init__(self, capacity: int, max_queued: int = 100, timeout: float = 30.0,
                 tenant_limits: dict[str, int] | None = None) -> None:
        self.flow = FlowControl(lambda model: capacity, max_queued, timeout, lambda p, r: self.shed.append((p, r)),
                                tenant_limits=tenant_limits)
        self.order: list[str] = []
        self.running: collections.deque[str] = collections.deque()  # tenants of the requests running, oldest first
        self.shed: list[tuple[int, str]] = []

    async def request(self, name: str, tenant: str, priority: int = 0) -> str:
        try:
            await self.flow.acquire("m", tenant, priority)
        except Shed as exc:
            return f"{name}:{exc.reason}"
        self.order.append(name)
        self.running.append(tenant)
        return name

    def finish_one(self) -> None:
        self.flow.release("m", self.running.popleft())


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_the_best_priority_first_then_tenants_in_turn():
    rec = Recorder(capacity=1)
    tasks = [asyncio.create_task(rec.request("first", "a"))]
    await settle()
    for name, tenant, priority in [("a1", "a", 5), ("a2", "a", 5), ("a3", "a", 5), ("b1", "b", 5), ("hi", "c", 0),
                                   ("b2", "b", 5)]:
        tasks.append(asyncio.create_task(rec.request(name, tenant, priority)))
        await settle()
    for _ in range(6):
        rec.finish_one()
        await settle()
    await asyncio.gather(*tasks)
    assert rec.order == ["first", "hi", "a1", "b1", "a2", "b2", "a3"]


async def test_a_full_queue_sheds_the_worst_priority_and_the_longest_tenant_first():
    rec = Recorder(capacity=1, max_queued=4)
    running = asyncio.create_task(rec.request("run", "x"))
    await settle()
    queued = {}
    for name, tenant in [("a1", "a"), ("a2", "a"), ("a3", "a"), ("b1", "b")]:
        queued[name] = asyncio.create_task(rec.request(name, tenant, 5))
        await settle()
    assert await rec.request("a4", "a", 5) == "a4:queue_full"  # its tenant has the longest queue: itself
    assert await rec.request("low", "c", 9) == "low:queue_full"  # worse than anything queued
    queued["b2"] = asyncio.create_task(rec.request("b2", "b", 5))  # b's queue is shorter: a's newest goes
    await settle()
    assert queued["a3"].done() and await queued["a3"] == "a3:displaced"
    hi = asyncio.create_task(rec.request("hi", "d", 0))  # better than all: the worst priority's longest queue's newest
    await settle()
    assert queued["b2"].done() and await queued["b2"] == "b2:displaced"  # a and b tie at 2: b by name
    for _ in range(4):
        rec.finish_one()
        await settle()
    await asyncio.gather(running, hi, queued["a1"], queued["a2"], queued["b1"])
    assert rec.order == ["run", "hi", "a1", "b1", "a2"]
    assert sorted(r for _, r in rec.shed) == ["displaced", "displaced", "queue_full", "queue_full"]


async def test_a_request_waiting_too_long_is_shed_and_a_cancelled_one_leaves_no_slot_behind():
    rec = Recorder(capacity=1, timeout=0.2)
    await rec.request("run", "a")
    assert await rec.request("late", "a") == "late:queue_timeout"
    waiting = asyncio.create_task(rec.request("gone", "a"))
    await settle()
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    assert rec.flow.models["m"].queued == 0
    rec.finish_one()
    assert await rec.request("next", "b") == "next" and rec.flow.models["m"].in_flight == 1


def test_tenants_and_priorities_of_requests():
    assert tenant_of({"X-Tenant": "team-a", "Authorization": "Bearer k1"}, "X-Tenant", True) == "team-a"
    by_key = tenant_of({"Authorization": "Bearer k1"}, "X-Tenant", True)
    assert by_key.startswith("key-") and "k1" not in by_key
    assert by_key != tenant_of({"Authorization": "Bearer k2"}, None, True)
    assert tenant_of({"Authorization": "Bearer k1"}, None, False) == "anonymous"  # no keys: nothing to trust
    assert [priority_of(p) for p in ({"priority": -2}, {}, {"priority": "1"}, {"priority": True}, [])] == [-2, 0, 0,
                                                                                                            0, 0]


# -- through the router, a real worker behind it ----------------------------------------------------------------
@pytest.fixture
async def routed():
    engine = LLMEngine(EngineConfig(executor="mock", max_model_len=256, max_num_seqs=4, mock_step_latency_s=0.01))
    async with real_workers([engine]) as urls:
        router, runner, url = await start_router(RouterOptions(
            worker=urls, health_interval_s=0.05, tokenizer="none", flow_control=True, tenant_header="X-Tenant",
            max_queued=64, queue_timeout_s=20, retry_after_s=1, priority_class=["interactive=0", "batch=10"],
            priority_class_header="X-Priority-Class"))
        try:
            await wait_for(lambda: router.slots(None) == 4, what="the worker's 4 slots")
            yield router, url, engine.model_name
        finally:
            await runner.cleanup()


async def flood(url: str, model: str, clients: dict[tuple[str, int], int], seconds: float) -> dict:
    """`clients[(tenant, priority)]` clients each sending one request after another for `seconds`; per
    (tenant, priority) the count of each outcome (a status, or the exception's name)."""
    outcomes: dict[tuple[str, int], collections.Counter] = collections.defaultdict(collections.Counter)
    stop = time.monotonic() + seconds
    timeout = aiohttp.ClientTimeout(total=60)

    async def client(s: aiohttp.ClientSession, tenant: str, priority: int) -> None:
        while time.monotonic() < stop:
            body = {"model": model, "prompt": "hello", "max_tokens": 4, "priority": priority, "ignore_eos": True}
            try:
                async with s.post(url + "/v1/completions", json=body, headers={"X-Tenant": tenant}) as r:
                    await r.read()
                    outcomes[(tenant, priority)][r.status] += 1
                    if r.status == 429:
                        assert r.headers["Retry-After"] == "1"
                        await asyncio.sleep(0.05)
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                outcomes[(tenant, priority)][exc.__class__.__name__] += 1

    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as s:
        await asyncio.gather(*(client(s, t, p) for (t, p), n in clients.items() for _ in range(n)))
    return outcomes


async def test_two_tenants_flooding_share_the_worker_equally(routed):
    router, url, model = routed
    outcomes = await flood(url, model, {("big", 0): 40, ("small", 0): 20}, seconds=6)
    done = {t: outcomes[(t, 0)][200] for t in ("big", "small")}
    assert set(outcomes[("big", 0)]) == {200} and set(outcomes[("small", 0)]) == {200}, outcomes  # queued, not shed
    share = done["small"] / (done["big"] + done["small"])
    assert 0.4 <= share <= 0.6, done  # without the turns, small (a third of the clients) would get a third


async def test_a_request_names_its_priority_class_in_the_trusted_header(routed):
    router, url, model = routed
    body = {"model": model, "prompt": "hello", "max_tokens": 2}
    async with aiohttp.ClientSession() as s:
        async with s.post(url + "/v1/completions", json=body, headers={"X-Priority-Class": "batch"}) as r:
            assert r.status == 200, await r.text()
        async with s.post(url + "/v1/completions", json=body, headers={"X-Priority-Class": "bulk"}) as r:
            assert r.status == 400
            assert "unknown priority class 'bulk'" in (await r.json())["error"]["message"]


async def test_a_low_priority_flood_is_shed_with_429s_while_high_priority_runs(routed):
    router, url, model = routed
    router.flow.max_queued = 8
    outcomes = await flood(url, model, {("batch", 10): 40, ("chat", 0): 4}, seconds=6)
    low, high = outcomes[("batch", 10)], outcomes[("chat", 0)]
    assert set(high) == {200} and high[200] > 0, outcomes  # never shed
    assert set(low) <= {200, 429} and low[429] > 0, outcomes  # shed, never a time-out or a broken connection
    shed = router.metrics.registry.get_sample_value("hetero_infer_router_requests_shed_total",
                                                    {"priority": "10", "reason": "queue_full"})
    assert shed and shed > 0


async def test_a_tenant_at_its_limit_waits_and_its_turn_passes_on():
    """--tenant-limit a=1: with three slots, tenant a runs one request at a time; b's take the other slots, and a's
    next runs only when its first has ended."""
    rec = Recorder(capacity=3, tenant_limits={"a": 1})
    tasks = [asyncio.create_task(rec.request(name, tenant)) for name, tenant in
             [("a1", "a"), ("a2", "a"), ("a3", "a"), ("b1", "b"), ("b2", "b"), ("b3", "b")]]
    await settle()
    assert rec.order == ["a1", "b1", "b2"]  # a2 queued behind a's limit though a slot was free for it
    rec.finish_one()  # a1 ends: a's turn again
    await settle()
    assert rec.order == ["a1", "b1", "b2", "a2"]
    for _ in range(5):
        rec.finish_one()
        await settle()
    await asyncio.gather(*tasks)
    assert sorted(rec.order) == ["a1", "a2", "a3", "b1", "b2", "b3"] and rec.flow.tenant_in_flight["a"] <= 1


def test_a_named_priority_class_gives_its_priority_unless_the_request_has_one():
    classes = {"interactive": 0, "batch": 10}
    assert priority_of({}, "batch", classes) == 10
    assert priority_of({"priority": 3}, "batch", classes) == 3  # the request's own field wins
    assert priority_of({}, None, classes) == 0
    with pytest.raises(ValueError, match="unknown priority class 'bulk' .*batch, interactive"):
        priority_of({}, "bulk", classes)


def test_priority_classes_and_tenant_limits_are_checked_options():
    from hetero_infer.contracts.options import InvalidOption

    options = RouterOptions(worker=["http://w:1"], priority_class=["interactive=0,batch=10"],
                            priority_class_header="X-Priority-Class", tenant_limit=["team-a=2"])
    assert options.priority_classes == {"interactive": 0, "batch": 10} and options.tenant_limits == {"team-a": 2}
    for bad in ({"priority_class": ["batch"]}, {"priority_class": ["batch=high"]},
                {"tenant_limit": ["a=0"]}, {"tenant_limit": ["a=1", "a=2"]}):
        with pytest.raises(InvalidOption):
            RouterOptions(worker=["http://w:1"], priority_class_header="X-Priority-Class", **bad)
    with pytest.raises(InvalidOption, match="priority-class-header"):
        RouterOptions(worker=["http://w:1"], priority_class=["batch=10"])
