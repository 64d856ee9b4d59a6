"""loops.py (per-object workers without kopf daemons) and peering.py (kopf's peering rule)."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone
from typing import Any

from kmock_cluster import wait_for

from hetero_infer.operator import kube, loops
from hetero_infer.operator.peering import Peering, active, is_active

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)  # noqa: UP017


def body(uid: str = "u1", enabled: bool = True, **meta: Any) -> dict[str, Any]:
    return {"metadata": {"uid": uid, "name": "smol", "namespace": "ns", **meta}, "spec": {"on": enabled}}


async def test_workers_start_follow_the_live_body_and_stop_with_the_filter_and_deletion() -> None:
    seen: list[Any] = []

    async def work(stopper: loops.Stopper, live: dict[str, Any]) -> None:
        while not stopper:
            seen.append(live["spec"].get("n"))
            await stopper.wait(0.01)

    sup = loops.Supervisor({"w": loops.Worker(lambda b: b["spec"]["on"], work)})
    sup.observe(None, body())
    assert sup.running("w") == ["u1"]
    sup.observe("MODIFIED", {**body(), "spec": {"on": True, "n": 7}})
    await wait_for(lambda: 7 in seen, what="the worker sees the new body")
    assert sup.running("w") == ["u1"]  # not restarted
    sup.observe("MODIFIED", body(enabled=False))
    assert sup.running("w") == []
    sup.observe("MODIFIED", body())
    assert sup.running("w") == ["u1"]
    sup.observe("MODIFIED", body(deletionTimestamp="2026-01-01T00:00:00Z"))
    assert sup.running("w") == [] and sup.bodies == {}
    sup.observe("ADDED", body("u2"))
    sup.observe("DELETED", body("u2"))
    assert sup.running("w") == []
    await sup.stop()


async def test_a_periodic_step_runs_once_per_interval_and_survives_failures() -> None:
    calls: list[int] = []

    async def step() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("first step fails")

    sup = loops.Supervisor({})
    sup.start_periodic(lambda: 0.01, step)
    sup.start_periodic(lambda: 0.01, step)  # a second call starts nothing
    await wait_for(lambda: len(calls) >= 3, what="steps after a failure")
    await sup.stop()
    n = len(calls)
    await asyncio.sleep(0.05)
    assert len(calls) == n


def peer(priority: int, seconds_ago: float = 1, lifetime: int = 60) -> dict[str, Any]:
    seen = (NOW - timedelta(seconds=seconds_ago)).replace(tzinfo=None).isoformat()  # kopf writes naive UTC
    return {"priority": priority, "lastseen": seen, "lifetime": lifetime}


def test_peering_rule_matches_kopf() -> None:
    assert is_active({}, "me", 10, NOW)
    assert is_active({"me": peer(10), "low": peer(5)}, "me", 10, NOW)
    assert not is_active({"me": peer(10), "high": peer(20)}, "me", 10, NOW)
    assert not is_active({"me": peer(10), "same": peer(10)}, "me", 10, NOW)  # kopf pauses both
    assert is_active({"me": peer(10), "dead": peer(20, seconds_ago=120)}, "me", 10, NOW)


class OnePeering:
    def __init__(self, status: dict[str, Any] | None) -> None:
        self.status = status
        self.asked: list[tuple[str, str, str]] = []

    def get(self, kind: Any, namespace: str, name: str) -> dict[str, Any] | None:
        self.asked.append((kind.plural, namespace, name))
        return None if self.status is None else {"status": self.status}


def test_active_reads_the_peering_object_of_the_operators_scope() -> None:
    assert active(OnePeering({"other": peer(99)}), None, NOW)  # standalone: always
    cluster = OnePeering({"other": peer(99)})
    assert not active(cluster, Peering("p", "me", 10), NOW)
    assert cluster.asked == [("clusterkopfpeerings", "", "p")]
    spaced = OnePeering({"other": peer(1)})
    assert active(spaced, Peering("p", "me", 10, ("a", "b")), NOW)
    assert spaced.asked == [("kopfpeerings", "a", "p"), ("kopfpeerings", "b", "p")]
    assert active(OnePeering(None), Peering("p", "me", 10), NOW)  # no peering object: no peers


class CountingClient:
    """Counts every API call; writes fail (the pass reports them and goes on)."""

    def __init__(self) -> None:
        self.calls = 0

    def get(self, *_: Any) -> None:
        self.calls += 1
        return None

    def request(self, *_: Any, **__: Any) -> dict[str, Any]:
        self.calls += 1
        return {"items": []}

    def __getattr__(self, name: str) -> Any:
        def write(*_: Any, **__: Any) -> Any:
            self.calls += 1
            raise kube.ApiError(500, "InternalError", name)

        return write


async def test_a_standing_by_replica_neither_resyncs_nor_autoscales() -> None:
    from hetero_infer.operator.autoscale import loop as autoscale_loop
    from hetero_infer.operator.handlers import OperatorOptions, resync_all

    async def standing_by() -> bool:
        return False

    async def working() -> bool:
        return True

    sup = loops.Supervisor({})
    sup.observe(None, {"metadata": {"uid": "u", "name": "smol", "namespace": "ns"}, "spec": {"model": {"name": "m"}}})
    client = CountingClient()
    await resync_all(sup, client, OperatorOptions(), standing_by)  # type: ignore[arg-type]
    assert client.calls == 0
    await resync_all(sup, client, OperatorOptions(), working)  # type: ignore[arg-type]
    assert client.calls > 0  # the same pass, active: it reads the children

    autoscaled = {"metadata": {"uid": "u", "name": "smol", "namespace": "ns"},
                  "spec": {"model": {"name": "m"}, "autoscaling": {"enabled": True, "maxReplicas": 2,
                                                                   "intervalSeconds": 1}}}
    for gate, expect_calls in ((standing_by, False), (working, True)):
        client = CountingClient()
        stopper = loops.Stopper()
        asked: list[bool] = []

        async def counted(gate: Any = gate, asked: list[bool] = asked) -> bool:
            asked.append(await gate())
            return asked[-1]

        task = asyncio.create_task(autoscale_loop.run(stopper, autoscaled, client, lambda *e: None, active=counted))
        # Two passes asked the gate (the first pass is over, whatever the machine's load); then stop.
        deadline = asyncio.get_running_loop().time() + 30
        while len(asked) < 2 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        stopper.set()
        await asyncio.wait_for(task, 10)
        assert len(asked) >= 2
        assert (client.calls > 0) is expect_calls
