"""Reconcile and the autoscaler write one `.status` (status.py: each owns its fields, and both rebuild the
conditions list); racing them against the KMock API server, neither drops the other's condition.

Every round changes what both writers see (the Deployment's ready pods, the workers' load), takes ONE
snapshot of the InferenceDeployment, and has both write from that same stale snapshot: one after the
other in either order, or at once. The second writer's status patch names a resourceVersion that is
gone, is refused (409), reads again and rebuilds the list; without the precondition it would write its
snapshot's old copy of the other's condition.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from autoscale_fakes import FakeWorkers
from kmock_cluster import DEPLOYMENTS, INFD

from hetero_infer.operator import constants as c
from hetero_infer.operator import kube
from hetero_infer.operator.autoscale.loop import Autoscaler, autoscale_once
from hetero_infer.operator.manifests import selector_labels
from hetero_infer.operator.reconcile import reconcile

NS, NAME = "race", "smol"
INFD_PATH = f"/apis/{c.API_VERSION}/namespaces/{NS}/{c.PLURAL}/{NAME}"

# (kv usage, queue depth) per worker, or None (503), -> the ScalingActive reason, from spec.autoscaling
# below: 2 replicas, min 1, max 2, targets 0.8 / 5, scale-down window 300 s.
LOADS = [((0.8, 5.0), "Steady"), ((0.95, 20.0), "AtMaxReplicas"), ((0.2, 0.0), "ScaleDownStabilizing"),
         (None, "NoMetrics")]
# ready worker pods of 2 -> the Ready condition's reason
READY = [(2, "AllReplicasReady"), (1, "PartiallyReady"), (0, "NoReplicasReady"), (2, "AllReplicasReady")]


@pytest.fixture
async def workers() -> AsyncIterator[FakeWorkers]:
    w = FakeWorkers()
    await w.start(2)
    yield w
    await w.stop()


def worker_pod(i: int, port: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{NAME}-{i}", "namespace": NS, "labels": selector_labels(NAME)},
            "spec": {"containers": [{"name": "worker", "image": "w",
                                     "ports": [{"name": "http", "containerPort": port}]}]},
            "status": {"phase": "Running", "podIP": "127.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]}}


async def set_ready(kmock: Any, ready: int) -> None:
    dep = kmock.objects[DEPLOYMENTS, NS, NAME].raw
    rsp = await kmock.patch(f"/apis/apps/v1/namespaces/{NS}/deployments/{NAME}/status", json={"status": {
        "replicas": 2, "updatedReplicas": 2, "readyReplicas": ready, "availableReplicas": ready,
        "observedGeneration": dep["metadata"]["generation"]}})
    assert rsp.status == 200, await rsp.text()


def conditions(kmock: Any) -> dict[str, dict[str, Any]]:
    listed = kmock.objects[INFD, NS, NAME].raw["status"]["conditions"]
    by_type = {cond["type"]: cond for cond in listed}
    assert len(by_type) == len(listed), f"a condition type twice: {listed}"
    return by_type


@pytest.mark.parametrize("order", ["autoscaler first", "reconcile first", "together"])
async def test_racing_writers_keep_each_others_conditions(kmock: Any, kubeconfig: Path, workers: FakeWorkers,
                                                          order: str) -> None:
    rsp = await kmock.post(f"/apis/{c.API_VERSION}/namespaces/{NS}/{c.PLURAL}", json={
        "apiVersion": c.API_VERSION, "kind": c.KIND, "metadata": {"name": NAME, "namespace": NS},
        "spec": {"model": {"name": "m"}, "replicas": 2,
                 "autoscaling": {"enabled": True, "mode": "operator", "minReplicas": 1, "maxReplicas": 2}}})
    assert rsp.status == 200, await rsp.text()
    for i, port in enumerate(workers.ports):
        rsp = await kmock.post(f"/api/v1/namespaces/{NS}/pods", json=worker_pod(i, port))
        assert rsp.status == 200, await rsp.text()
    client = kube.RestClient.from_environment()
    autoscaler = Autoscaler()
    events: list[tuple[str, str, str]] = []

    def record(*event: str) -> None:
        events.append(event)  # type: ignore[arg-type]

    async def run_reconcile(snapshot: dict[str, Any]) -> None:
        outcome = await asyncio.to_thread(reconcile, snapshot, client, record)
        assert not outcome.errors and not outcome.invalid

    async def run_autoscaler(snapshot: dict[str, Any], now: float) -> None:
        result = await autoscale_once(snapshot, client, autoscaler, record, now=now)
        assert result is not None and result.decision.desired == 2

    await run_reconcile(await asyncio.to_thread(client.get, kube.INFERENCE_DEPLOYMENT, NS, NAME))  # the children
    for step, ((load, scaling), (ready, readiness)) in enumerate(zip(LOADS * 2, READY * 2)):
        await set_ready(kmock, ready)
        if load is None:
            workers.values = dict.fromkeys(workers.values)
        else:
            workers.set_all(*load)
        snapshot = await asyncio.to_thread(client.get, kube.INFERENCE_DEPLOYMENT, NS, NAME)
        assert snapshot is not None
        if order == "autoscaler first":
            await run_autoscaler(dict(snapshot), float(step))
            await run_reconcile(dict(snapshot))
        elif order == "reconcile first":
            await run_reconcile(dict(snapshot))
            await run_autoscaler(dict(snapshot), float(step))
        else:
            await asyncio.gather(run_reconcile(dict(snapshot)), run_autoscaler(dict(snapshot), float(step)))

        conds = conditions(kmock)
        assert conds["ScalingActive"]["reason"] == scaling, (step, conds)
        assert conds["Ready"]["reason"] == readiness, (step, conds)
        assert set(conds) == {"Ready", "Progressing", "Degraded", "ScalingActive"}
        status = kmock.objects[INFD, NS, NAME].raw["status"]
        assert status["desiredReplicas"] == 2 and status["readyReplicas"] == ready
        assert status["metrics"]["kvCacheUsage"] == (load or LOADS[2][0])[0]  # kept through the no-data round


async def test_a_pass_for_an_older_spec_never_writes_over_the_newer_ones_status(kmock: Any, kubeconfig: Path) -> None:
    """A reconcile of generation N that loses the race to the pass for N+1 drops its status, rather than
    rebuilding it on the new version (observedGeneration and Ready would go back to N)."""
    rsp = await kmock.post(f"/apis/{c.API_VERSION}/namespaces/{NS}/{c.PLURAL}", json={
        "apiVersion": c.API_VERSION, "kind": c.KIND, "metadata": {"name": NAME, "namespace": NS},
        "spec": {"model": {"name": "m"}, "replicas": 2}})
    assert rsp.status == 200, await rsp.text()
    client = kube.RestClient.from_environment()
    old = await asyncio.to_thread(client.get, kube.INFERENCE_DEPLOYMENT, NS, NAME)
    assert old is not None
    rsp = await kmock.patch(INFD_PATH, json={"spec": {"replicas": 0}})
    assert rsp.status == 200, await rsp.text()
    new = await asyncio.to_thread(client.get, kube.INFERENCE_DEPLOYMENT, NS, NAME)
    assert new is not None and new["metadata"]["generation"] == old["metadata"]["generation"] + 1
    await asyncio.to_thread(reconcile, new, client, lambda *e: None)
    assert conditions(kmock)["Ready"]["reason"] == "ScaledToZero"
    await asyncio.to_thread(reconcile, old, client, lambda *e: None)  # its spec: 2 replicas, none ready
    status = kmock.objects[INFD, NS, NAME].raw["status"]
    assert status["observedGeneration"] == new["metadata"]["generation"]
    assert conditions(kmock)["Ready"]["reason"] == "ScaledToZero"
