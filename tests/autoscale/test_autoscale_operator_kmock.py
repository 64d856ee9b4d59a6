"""The real operator (kopf, mode operator) against KMock: its decisions change the InferenceDeployment's
replicas, the Deployment follows, status/events/metrics tell why; in mode hpa it never writes replicas.

The test plays the Deployment controller and the kubelet: it keeps one pod object per Deployment replica
in the API, each pointing (podIP + the `http` containerPort) at an in-process fake worker whose /metrics
values the test sets. The operator finds those pods through the API, as it does in a cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from autoscale_fakes import PODS, FakeWorkers
from kmock_cluster import DEPLOYMENTS, EVENTS, INFD, wait_for

from hetero_infer.operator import constants as c
from hetero_infer.operator.autoscale import decision as opdecision
from hetero_infer.operator.autoscale import loop as oploop
from hetero_infer.operator.autoscale import metrics as opmetrics
from hetero_infer.operator.manifests import selector_labels

NS = "autoscale"
NAME = "smol"
INFD_PATH = f"/apis/{c.API_VERSION}/namespaces/{NS}/{c.PLURAL}/{NAME}"


@pytest.fixture
async def workers() -> AsyncIterator[FakeWorkers]:
    w = FakeWorkers()
    await w.start(4)
    yield w
    await w.stop()


def live(kmock: Any, resource: Any, name: str = NAME) -> dict[str, Any] | None:
    key = (resource, NS, name)
    if key not in kmock.objects or kmock.objects[key].deleted:
        return None
    return kmock.objects[key].raw


def versions(kmock: Any, resource: Any, name: str = NAME) -> list[dict[str, Any]]:
    """Every version the API server stored of the object, oldest first (KMock keeps the history)."""
    return [v.raw for v in kmock.objects[(resource, NS, name)].history if v is not None and v.raw]


def changes(values: list[Any]) -> list[Any]:
    """`values` without consecutive repeats: the sequence of states, whatever their durations."""
    return [v for i, v in enumerate(values) if i == 0 or v != values[i - 1]]


def reason_of(obj: dict[str, Any]) -> str | None:
    conds = (obj.get("status") or {}).get("conditions") or []
    return next((cond["reason"] for cond in conds if cond["type"] == c.COND_SCALING_ACTIVE), None)


@dataclass(frozen=True)
class Decided:
    """One autoscaling pass as the operator decided it, at the time of its own clock."""

    now: float
    current: int
    recommendation: int
    desired: int
    reason: str


@pytest.fixture
def decisions(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Decided]]:
    """Records every decision the operator's autoscaler makes (it runs in this process), so the tests
    check the stabilization windows on the operator's own clock instead of the test's wall clock."""
    seen: list[Decided] = []

    def recording(history: Any, obs: Any, policy: Any, now: float) -> opdecision.Decision:
        d = opdecision.decide(history, obs, policy, now)
        seen.append(Decided(now, d.current, d.recommendation, d.desired, d.reason))
        return d

    monkeypatch.setattr(oploop, "decide", recording)
    yield seen


async def passes_after(decisions: list[Decided], n: int = 2, timeout: float = 30) -> None:
    """Wait until the autoscaler made `n` more passes (not a fixed time, which a busy CPU may not fill)."""
    start = len(decisions)
    await wait_for(lambda: len(decisions) >= start + n, timeout=timeout, what=f"{n} more autoscaling passes")


def pod_names(kmock: Any) -> list[str]:
    return sorted(name for (res, ns, name), obj in kmock.objects.items()
                  if res == PODS and ns == NS and not obj.deleted)


def events(kmock: Any) -> list[dict[str, Any]]:
    return [obj.raw for (res, _, _), obj in kmock.objects.items() if res == EVENTS and not obj.deleted]


def worker_pod(i: int, port: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"{NAME}-{i}", "namespace": NS, "labels": selector_labels(NAME)},
        "spec": {"containers": [{"name": "worker", "image": "w",
                                 "ports": [{"name": "http", "containerPort": port}]}]},
        "status": {"phase": "Running", "podIP": "127.0.0.1",
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }


async def play_deployment_controller(kmock: Any, workers: FakeWorkers, stop: asyncio.Event) -> None:
    """One ready pod per Deployment replica (pod i -> fake worker i), and the Deployment's status."""
    while not stop.is_set():
        dep = live(kmock, DEPLOYMENTS)
        if dep is not None:
            want = min(int(dep["spec"].get("replicas") or 0), len(workers.ports))
            have = pod_names(kmock)
            for i in range(want):
                if f"{NAME}-{i}" not in have:
                    rsp = await kmock.post(f"/api/v1/namespaces/{NS}/pods", json=worker_pod(i, workers.ports[i]))
                    assert rsp.status == 200, await rsp.text()
            for name in have:
                if int(name.rsplit("-", 1)[1]) >= want:
                    await kmock.delete(f"/api/v1/namespaces/{NS}/pods/{name}")
            st = dep.get("status") or {}
            if st.get("readyReplicas") != want or st.get("replicas") != want:
                await kmock.patch(f"/apis/apps/v1/namespaces/{NS}/deployments/{NAME}/status", json={"status": {
                    "observedGeneration": dep["metadata"].get("generation"), "replicas": want,
                    "updatedReplicas": want, "readyReplicas": want, "availableReplicas": want}},
                    headers={"Content-Type": "application/merge-patch+json"})
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.1)


@pytest.fixture
async def cluster(kmock: Any, workers: FakeWorkers) -> AsyncIterator[Any]:
    stop = asyncio.Event()
    task = asyncio.create_task(play_deployment_controller(kmock, workers, stop))
    yield kmock
    stop.set()
    await task


def infd(autoscaling: dict[str, Any], replicas: int = 1) -> dict[str, Any]:
    return {"apiVersion": c.API_VERSION, "kind": c.KIND, "metadata": {"name": NAME, "namespace": NS},
            "spec": {"model": {"name": "m"}, "executor": "mock", "replicas": replicas, "autoscaling": autoscaling}}


OPERATOR_MODE = {"enabled": True, "mode": "operator", "minReplicas": 1, "maxReplicas": 4, "intervalSeconds": 1,
                 "scaleDownStabilizationSeconds": 2, "targetKVCacheUsage": 0.8, "targetQueueDepth": 5}


async def create(kmock: Any, body: dict[str, Any]) -> None:
    rsp = await kmock.post(f"/apis/{c.API_VERSION}/namespaces/{NS}/{c.PLURAL}", json=body)
    assert rsp.status == 200, await rsp.text()


def scaling_active(kmock: Any) -> dict[str, Any] | None:
    for cond in (live(kmock, INFD) or {}).get("status", {}).get("conditions") or []:
        if cond["type"] == c.COND_SCALING_ACTIVE:
            return cond
    return None


def spec_replicas(kmock: Any) -> int:
    return int(live(kmock, INFD)["spec"]["replicas"])


def metric_value(metric: str, **labels: str) -> float:
    value = opmetrics.REGISTRY.get_sample_value(metric, labels)
    return value or 0.0


async def test_operator_mode_scales_up_and_down_and_the_deployment_follows(cluster: Any, workers: FakeWorkers,
                                                                           operator: Any,
                                                                           decisions: list[Decided]) -> None:
    """Asserts on what was stored and decided (the object's versions, the events, the operator's passes)
    rather than on catching a state that lasts one pass: a busy CPU may stretch or skip any window."""
    kmock = cluster
    window = OPERATOR_MODE["scaleDownStabilizationSeconds"]
    await operator()
    workers.set_all(kv=0.5, queue=0.0)  # one replica, comfortably loaded
    await create(kmock, infd(OPERATOR_MODE))

    cond = await wait_for(lambda: (scaling_active(kmock) or {}).get("status") == "True" and scaling_active(kmock),
                          timeout=30, what="ScalingActive True")
    assert cond["reason"] in ("Steady", "AtMinReplicas")
    status = live(kmock, INFD)["status"]
    assert status["metrics"]["kvCacheUsage"] == 0.5 and status["metrics"]["queueDepth"] == 0.0
    assert spec_replicas(kmock) == 1

    # Load: KV pressure and a queue on every worker. Up at once, at most doubling per pass, up to max.
    workers.set_all(kv=0.95, queue=20.0)
    await wait_for(lambda: (scaling_active(kmock) or {}).get("reason") == "AtMaxReplicas", timeout=30,
                   what="AtMaxReplicas")
    await wait_for(lambda: live(kmock, DEPLOYMENTS)["spec"]["replicas"] == 4, timeout=30,
                   what="the Deployment follows")
    await wait_for(lambda: len(pod_names(kmock)) == 4, timeout=30, what="4 worker pods")
    assert changes([v["spec"]["replicas"] for v in versions(kmock, INFD)]) == [1, 2, 4]
    status = live(kmock, INFD)["status"]
    assert status["desiredReplicas"] == 4 and status["lastScaleTime"]
    assert status["metrics"]["queueDepth"] == 20.0
    ups = [e for e in events(kmock) if e.get("reason") == "ScaledUp"]
    assert [e["message"].split(";")[0] for e in ups] == ["scaling up from 1 to 2", "scaling up from 2 to 4"]
    assert "queueDepth 20/5" in ups[0]["message"]

    # Load gone: down to min only after a whole window of lower recommendations, on the operator's clock.
    held_from = len(decisions)
    workers.set_all(kv=0.05, queue=0.0)
    await wait_for(lambda: spec_replicas(kmock) == 1, timeout=30, what="scaled down to 1")
    await wait_for(lambda: live(kmock, DEPLOYMENTS)["spec"]["replicas"] == 1, timeout=30,
                   what="the Deployment follows down")
    await wait_for(lambda: any(e.get("reason") == "ScaledDown" for e in events(kmock)), what="ScaledDown event")
    sizes = changes([v["spec"]["replicas"] for v in versions(kmock, INFD)])
    # Straight down to 1, or via a size a pass recommended while the workers' values were changing under it.
    assert sizes[:3] == [1, 2, 4] and sizes[-1] == 1 and sizes[3:] == sorted(sizes[3:], reverse=True), sizes

    # Every scale-down goes to the largest recommendation of the window before it, so the first one comes a
    # whole window after the last pass that still recommended 4; the passes in between hold.
    downs = [i for i, d in enumerate(decisions) if d.desired < d.current]
    assert downs and downs[0] >= held_from, decisions
    for i in downs:
        recent = [d.recommendation for d in decisions[:i + 1] if d.now > decisions[i].now - window]
        assert decisions[i].desired == max(recent), decisions[:i + 1]
    down = downs[0]
    last_high = max(i for i, d in enumerate(decisions[:down]) if d.recommendation >= 4)
    assert decisions[down].now - decisions[last_high].now >= window, decisions[last_high:down + 1]
    holding = decisions[last_high + 1:down]  # low passes inside the window: each one keeps the size
    assert all(d.desired == d.current == 4 and d.reason == "ScaleDownStabilizing" for d in holding), holding
    # The status tells the same story, whatever the passes' timing: at most, holding, then down (no holding
    # state at all when the CPU was so busy that a whole window passed between two passes).
    stored = changes([(v["spec"]["replicas"], reason_of(v)) for v in versions(kmock, INFD)])
    at_max = stored.index((4, "AtMaxReplicas"))
    told = [(4, "AtMaxReplicas"), *([(4, "ScaleDownStabilizing")] if holding else []), (4, "ScaledDown")]
    assert stored[at_max:at_max + len(told)] == told, stored

    labels = {"namespace": NS, "name": NAME}
    assert metric_value("hetero_infer_operator_autoscale_decisions_total", direction="up", **labels) >= 2
    assert metric_value("hetero_infer_operator_autoscale_decisions_total", direction="down", **labels) >= 1
    assert metric_value("hetero_infer_operator_autoscale_decisions_total", direction="none", **labels) >= 1
    await wait_for(lambda: metric_value("hetero_infer_operator_desired_replicas", **labels) == 1, what="gauge")


async def test_workers_that_do_not_answer_keep_the_size(cluster: Any, workers: FakeWorkers, operator: Any,
                                                        decisions: list[Decided]) -> None:
    kmock = cluster
    await operator()
    workers.set_all(kv=0.8, queue=5.0)
    await create(kmock, infd(dict(OPERATOR_MODE, scaleDownStabilizationSeconds=0), replicas=3))
    await wait_for(lambda: (scaling_active(kmock) or {}).get("reason") == "Steady", timeout=30, what="steady at 3")
    labels = {"namespace": NS, "name": NAME}
    before = metric_value("hetero_infer_operator_scrape_errors_total", kind="http", **labels)

    # Two of three stop answering while the third is idle: their load is unknown, so no scale-down
    # (with a 0 s window it would otherwise happen at the next pass).
    workers.values[0] = (0.0, 0.0)
    workers.values[1] = workers.values[2] = None
    await wait_for(lambda: metric_value("hetero_infer_operator_scrape_errors_total", kind="http", **labels)
                   >= before + 2, timeout=30, what="scrape errors counted")
    await wait_for(lambda: (scaling_active(kmock) or {}).get("reason") == "ScaleDownHeld", timeout=30,
                   what="ScaleDownHeld")
    await passes_after(decisions, 2)
    assert spec_replicas(kmock) == 3 and decisions[-1].reason == "ScaleDownHeld"
    # None answers: no metrics, keep the size, ScalingActive False and one Warning event.
    size = spec_replicas(kmock)
    workers.values[0] = None
    cond = await wait_for(lambda: (scaling_active(kmock) or {}).get("reason") == "NoMetrics" and scaling_active(kmock),
                          timeout=30, what="NoMetrics")
    assert cond["status"] == "False"
    await passes_after(decisions, 2)
    assert spec_replicas(kmock) == size and decisions[-1].reason == "NoMetrics"
    warnings = [e for e in events(kmock) if e.get("reason") == "NoMetrics"]
    assert len(warnings) == 1 and warnings[0]["type"] == "Warning"


async def test_hpa_mode_never_writes_replicas(cluster: Any, workers: FakeWorkers, operator: Any) -> None:
    kmock = cluster
    await operator()
    workers.set_all(kv=1.0, queue=50.0)  # would scale in mode operator
    await create(kmock, infd(dict(OPERATOR_MODE, mode="hpa")))
    await wait_for(lambda: scaling_active(kmock), what="status")
    await asyncio.sleep(3.0)
    assert spec_replicas(kmock) == 1 and scaling_active(kmock)["reason"].startswith("HPA")
    assert not [e for e in events(kmock) if e.get("reason") in ("ScaledUp", "ScaledDown")]


async def test_switching_to_hpa_mode_stops_the_autoscaler(cluster: Any, workers: FakeWorkers,
                                                          operator: Any) -> None:
    kmock = cluster
    await operator()
    workers.set_all(kv=0.5, queue=0.0)
    await create(kmock, infd(OPERATOR_MODE))
    await wait_for(lambda: (scaling_active(kmock) or {}).get("status") == "True", what="autoscaler running")
    rsp = await kmock.patch(INFD_PATH, json={"spec": {"autoscaling": {"mode": "hpa"}}},
                            headers={"Content-Type": "application/merge-patch+json"})
    assert rsp.status == 200
    await wait_for(lambda: (scaling_active(kmock) or {}).get("reason", "").startswith("HPA"), what="hpa mode")
    workers.set_all(kv=1.0, queue=50.0)
    await asyncio.sleep(3.0)
    assert spec_replicas(kmock) == 1  # the HPA owns replicas now; the operator does not fight it


CHILDREN = ("deployments", "services", "poddisruptionbudgets", "horizontalpodautoscalers")


def child_writes(requests: list[Any]) -> list[str]:
    """Writes to the children's main resources (not their status, which the test writes as the controller)."""
    return [f"{r.method.value} {r.url.path}" for r in requests
            if r.method.value in ("POST", "PUT", "PATCH") and r.resource is not None
            and r.resource.plural in CHILDREN and r.url.path.split("/")[-1] != "status"]


async def test_a_restarted_operator_adopts_the_children_and_waits_a_whole_window_to_scale_down(
        cluster: Any, workers: FakeWorkers, operator: Any, decisions: list[Decided]) -> None:
    """Issue 17: a new operator process (empty autoscaling history) creates nothing that exists, and
    its first low readings do not scale down before a whole stabilization window of them."""
    kmock = cluster
    window = 3
    await operator()
    workers.set_all(kv=0.95, queue=20.0)
    await create(kmock, infd(dict(OPERATOR_MODE, scaleDownStabilizationSeconds=window)))
    await wait_for(lambda: spec_replicas(kmock) == 4, timeout=30, what="scaled to 4 under load")
    await wait_for(lambda: live(kmock, DEPLOYMENTS)["spec"]["replicas"] == 4 and len(pod_names(kmock)) == 4,
                   timeout=30, what="4 ready workers")
    await operator.stop()

    workers.set_all(kv=0.05, queue=0.0)  # the load went while no operator ran
    seen = len(kmock._requests)
    updated = [e for e in events(kmock) if e.get("reason") == "Updated"]
    versions_before = versions(kmock, INFD)
    restarted = len(decisions)
    await operator("--resync-seconds", "0.5")
    await wait_for(lambda: spec_replicas(kmock) == 1, timeout=30, what="scaled down after the window")
    # The window counts from the new process's first pass (its history is empty): every pass before a
    # whole window of them holds, on the operator's own clock; the status said so before the scale-down.
    new_passes = decisions[restarted:]
    down = next(i for i, d in enumerate(new_passes) if d.desired < d.current)
    assert new_passes[down].now - new_passes[0].now >= window, new_passes
    assert down >= 1 and all(d.desired == d.current == 4 and d.reason == "ScaleDownStabilizing"
                             for d in new_passes[:down]), new_passes
    stored = [(v["spec"]["replicas"], reason_of(v), (v.get("status") or {}).get("metrics", {}).get("kvCacheUsage"))
              for v in versions(kmock, INFD)[len(versions_before):]]
    assert (4, "ScaleDownStabilizing", 0.05) in stored, stored
    await wait_for(lambda: live(kmock, DEPLOYMENTS)["spec"]["replicas"] == 1, what="the Deployment follows down")

    new = child_writes(kmock._requests[seen:])
    assert not [w for w in new if w.startswith("POST")], f"duplicate creates after the restart: {new}"
    # The only change to the children is the scale-down itself.
    assert new and all(w == f"PATCH /apis/apps/v1/namespaces/{NS}/deployments/{NAME}" for w in new), new
    for event in [e for e in events(kmock) if e.get("reason") == "Updated"][len(updated):]:
        assert "spec.replicas" in event["message"], event["message"]
