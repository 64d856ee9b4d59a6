"""The real operator (kopf, mode operator) against KMock: its decisions change the InferenceDeployment's
replicas, the Deployment follows, status/events/metrics tell why; in mode hpa it never writes replicas.

The test plays the Deployment controller and the kubelet: it keeps one pod object per Deployment replica
in the API, each pointing (podIP + the `http` containerPort) at an in-process fake worker whose /metrics
values the test sets. The operator finds those pods through the API, as it does in a cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from autoscale_fakes import PODS, FakeWorkers
from kmock_cluster import DEPLOYMENTS, EVENTS, INFD, wait_for

from hetero_infer.operator import constants as c
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
                                                                           operator: Any) -> None:
    kmock = cluster
    await operator()
    workers.set_all(kv=0.5, queue=0.0)  # one replica, comfortably loaded
    await create(kmock, infd(OPERATOR_MODE))

    cond = await wait_for(lambda: (scaling_active(kmock) or {}).get("status") == "True" and scaling_active(kmock),
                          what="ScalingActive True")
    assert cond["reason"] in ("Steady", "AtMinReplicas")
    status = live(kmock, INFD)["status"]
    assert status["metrics"]["kvCacheUsage"] == 0.5 and status["metrics"]["queueDepth"] == 0.0
    assert spec_replicas(kmock) == 1

    # Load: KV pressure and a queue on every worker. Up at once, at most doubling per pass, up to max.
    workers.set_all(kv=0.95, queue=20.0)
    await wait_for(lambda: spec_replicas(kmock) == 2, timeout=10, what="scaled to 2")
    await wait_for(lambda: spec_replicas(kmock) == 4, timeout=10, what="scaled to 4")
    await wait_for(lambda: live(kmock, DEPLOYMENTS)["spec"]["replicas"] == 4, what="the Deployment follows")
    await wait_for(lambda: len(pod_names(kmock)) == 4, what="4 worker pods")
    await wait_for(lambda: (scaling_active(kmock) or {}).get("reason") == "AtMaxReplicas", what="AtMaxReplicas")
    status = live(kmock, INFD)["status"]
    assert status["desiredReplicas"] == 4 and status["lastScaleTime"]
    assert status["metrics"]["queueDepth"] == 20.0
    ups = [e for e in events(kmock) if e.get("reason") == "ScaledUp"]
    assert [e["message"].split(";")[0] for e in ups][:2] == ["scaling up from 1 to 2", "scaling up from 2 to 4"]
    assert "queueDepth 20/5" in ups[0]["message"]

    # Load gone: down to min only after the 2 s window of lower recommendations. First passes that hold
    # (lower recommendations, not for the whole window yet), then the scale-down, 2 s after the last pass that
    # saw the load; that pass came at most one interval before the load went.
    workers.set_all(kv=0.05, queue=0.0)
    loop = asyncio.get_running_loop()
    quiet_since = loop.time()
    await wait_for(lambda: (scaling_active(kmock) or {}).get("reason") == "ScaleDownStabilizing",
                   what="ScaleDownStabilizing")
    assert spec_replicas(kmock) == 4
    await wait_for(lambda: spec_replicas(kmock) == 1, timeout=15, what="scaled down to 1")
    assert loop.time() - quiet_since >= 2.0 - OPERATOR_MODE["intervalSeconds"]
    await wait_for(lambda: live(kmock, DEPLOYMENTS)["spec"]["replicas"] == 1, what="the Deployment follows down")
    await wait_for(lambda: any(e.get("reason") == "ScaledDown" for e in events(kmock)), what="ScaledDown event")

    labels = {"namespace": NS, "name": NAME}
    assert metric_value("hetero_infer_operator_autoscale_decisions_total", direction="up", **labels) >= 2
    assert metric_value("hetero_infer_operator_autoscale_decisions_total", direction="down", **labels) >= 1
    assert metric_value("hetero_infer_operator_autoscale_decisions_total", direction="none", **labels) >= 1
    await wait_for(lambda: metric_value("hetero_infer_operator_desired_replicas", **labels) == 1, what="gauge")


async def test_workers_that_do_not_answer_keep_the_size(cluster: Any, workers: FakeWorkers, operator: Any) -> None:
    kmock = cluster
    await operator()
    workers.set_all(kv=0.8, queue=5.0)
    await create(kmock, infd(dict(OPERATOR_MODE, scaleDownStabilizationSeconds=0), replicas=3))
    await wait_for(lambda: (scaling_active(kmock) or {}).get("reason") == "Steady", what="steady at 3")
    labels = {"namespace": NS, "name": NAME}
    before = metric_value("hetero_infer_operator_scrape_errors_total", kind="http", **labels)

    # Two of three stop answering while the third is idle: their load is unknown, so no scale-down
    # (with a 0 s window it would otherwise happen at the next pass).
    workers.values[0] = (0.0, 0.0)
    workers.values[1] = workers.values[2] = None
    await wait_for(lambda: metric_value("hetero_infer_operator_scrape_errors_total", kind="http", **labels)
                   >= before + 2, what="scrape errors counted")
    await wait_for(lambda: (scaling_active(kmock) or {}).get("reason") == "ScaleDownHeld", what="ScaleDownHeld")
    await asyncio.sleep(2.0)
    assert spec_replicas(kmock) == 3
    # None answers: no metrics, keep the size, ScalingActive False and one Warning event.
    size = spec_replicas(kmock)
    workers.values[0] = None
    cond = await wait_for(lambda: (scaling_active(kmock) or {}).get("reason") == "NoMetrics" and scaling_active(kmock),
                          what="NoMetrics")
    assert cond["status"] == "False"
    await asyncio.sleep(2.0)
    assert spec_replicas(kmock) == size
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
        cluster: Any, workers: FakeWorkers, operator: Any) -> None:
    """Issue 17: a new operator process (empty autoscaling history) creates nothing that exists, and
    its first low readings do not scale down before a whole stabilization window of them."""
    kmock = cluster
    window = 3
    await operator()
    workers.set_all(kv=0.95, queue=20.0)
    await create(kmock, infd(dict(OPERATOR_MODE, scaleDownStabilizationSeconds=window)))
    await wait_for(lambda: spec_replicas(kmock) == 4, timeout=15, what="scaled to 4 under load")
    await wait_for(lambda: live(kmock, DEPLOYMENTS)["spec"]["replicas"] == 4 and len(pod_names(kmock)) == 4,
                   what="4 ready workers")
    await operator.stop()

    workers.set_all(kv=0.05, queue=0.0)  # the load went while no operator ran
    seen = len(kmock._requests)
    updated = [e for e in events(kmock) if e.get("reason") == "Updated"]
    loop = asyncio.get_running_loop()
    restarted = loop.time()
    await operator("--resync-seconds", "0.5")
    await wait_for(lambda: (scaling_active(kmock) or {}).get("reason") == "ScaleDownStabilizing"
                   and live(kmock, INFD)["status"]["metrics"]["kvCacheUsage"] == 0.05,
                   what="the new operator sees the low load and holds")
    assert spec_replicas(kmock) == 4
    await wait_for(lambda: spec_replicas(kmock) == 1, timeout=20, what="scaled down after the window")
    assert loop.time() - restarted >= window  # the window counts from the new process's first pass
    await wait_for(lambda: live(kmock, DEPLOYMENTS)["spec"]["replicas"] == 1, what="the Deployment follows down")

    new = child_writes(kmock._requests[seen:])
    assert not [w for w in new if w.startswith("POST")], f"duplicate creates after the restart: {new}"
    # The only change to the children is the scale-down itself.
    assert new and all(w == f"PATCH /apis/apps/v1/namespaces/{NS}/deployments/{NAME}" for w in new), new
    for event in [e for e in events(kmock) if e.get("reason") == "Updated"][len(updated):]:
        assert "spec.replicas" in event["message"], event["message"]
