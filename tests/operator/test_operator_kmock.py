"""The real operator (kopf handlers) against a KMock API server: create, update, drift, delete."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kmock_cluster import DEPLOYMENTS, EVENTS, HPAS, INFD, PDBS, PEERINGS, SERVICES, wait_for

from hetero_infer.operator import constants as c
from hetero_infer.operator.manifests import selector_string

NS = "models"


def infd(name: str = "smol", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": {"name": "smollm2"}, "executor": "mock", "replicas": 1}
    body.update(spec)
    return {"apiVersion": c.API_VERSION, "kind": c.KIND, "metadata": {"name": name, "namespace": NS}, "spec": body}


async def create(kmock: Any, body: dict[str, Any]) -> dict[str, Any]:
    rsp = await kmock.post(f"/apis/{c.API_VERSION}/namespaces/{NS}/{c.PLURAL}", json=body)
    assert rsp.status == 200, await rsp.text()
    return await rsp.json()


async def patch(kmock: Any, path: str, patch: dict[str, Any]) -> None:
    rsp = await kmock.patch(path, json=patch, headers={"Content-Type": "application/merge-patch+json"})
    assert rsp.status == 200, await rsp.text()


def live(kmock: Any, resource: Any, name: str = "smol") -> dict[str, Any] | None:
    key = (resource, NS, name)
    if key not in kmock.objects or kmock.objects[key].deleted:
        return None
    return kmock.objects[key].raw


def container(kmock: Any, name: str = "smol") -> dict[str, Any]:
    dep = live(kmock, DEPLOYMENTS, name)
    assert dep is not None
    return dep["spec"]["template"]["spec"]["containers"][0]


def events(kmock: Any) -> list[dict[str, Any]]:
    return [obj.raw for (res, _, _), obj in kmock.objects.items() if res == EVENTS and not obj.deleted]


async def test_create_makes_children_with_owner_references_and_status(kmock: Any, operator: Any) -> None:
    await operator()
    created = await create(kmock, infd())
    uid = created["metadata"]["uid"]

    for res in (DEPLOYMENTS, SERVICES, PDBS):
        obj = await wait_for(lambda res=res: live(kmock, res), what=f"{res.plural} created")
        refs = obj["metadata"]["ownerReferences"]
        assert refs == [{"apiVersion": c.API_VERSION, "kind": c.KIND, "name": "smol", "uid": uid,
                         "controller": True, "blockOwnerDeletion": True}]
    assert live(kmock, HPAS) is None  # autoscaling is off

    args = container(kmock)["args"]
    assert args[:2] == ["serve", "--host"] and "--executor" in args and args[args.index("--executor") + 1] == "mock"

    status = await wait_for(lambda: (live(kmock, INFD) or {}).get("status", {}).get("selector") and
                            live(kmock, INFD)["status"], what="status.selector")
    assert status["selector"] == selector_string("smol")
    assert status["observedGeneration"] == 1
    assert status["endpoint"] == f"http://smol.{NS}.svc/v1"
    types = {cond["type"]: cond for cond in status["conditions"]}
    assert set(types) == {"Ready", "Progressing", "Degraded", "ScalingActive"}
    assert types["Degraded"]["status"] == "False"
    assert types["Ready"]["status"] == "False"  # no pods in KMock
    await wait_for(lambda: any(e.get("reason") == "Created" and "Deployment" in e.get("message", "")
                               for e in events(kmock)), what="Created event")


async def test_ready_replicas_flow_from_the_deployment_into_status(kmock: Any, operator: Any) -> None:
    await operator()
    await create(kmock, infd(replicas=2))
    await wait_for(lambda: live(kmock, DEPLOYMENTS), what="deployment")
    dep_path = f"/apis/apps/v1/namespaces/{NS}/deployments/smol"
    # What the Deployment controller would report once both pods pass /readyz.
    await patch(kmock, dep_path + "/status", {"status": {
        "observedGeneration": live(kmock, DEPLOYMENTS)["metadata"]["generation"],
        "replicas": 2, "updatedReplicas": 2, "readyReplicas": 2, "availableReplicas": 2}})
    status = await wait_for(lambda: live(kmock, INFD)["status"].get("readyReplicas") == 2 and
                            live(kmock, INFD)["status"], what="readyReplicas=2")
    assert status["replicas"] == 2
    ready = next(cond for cond in status["conditions"] if cond["type"] == "Ready")
    assert ready["status"] == "True" and ready["reason"] == "AllReplicasReady"


async def test_replicas_and_image_changes_propagate(kmock: Any, operator: Any) -> None:
    await operator()
    await create(kmock, infd())
    await wait_for(lambda: live(kmock, DEPLOYMENTS), what="deployment")
    path = f"/apis/{c.API_VERSION}/namespaces/{NS}/{c.PLURAL}/smol"
    await patch(kmock, path, {"spec": {"replicas": 3, "image": "registry.example/worker:2"}})
    await wait_for(lambda: live(kmock, DEPLOYMENTS)["spec"]["replicas"] == 3, what="replicas=3")
    await wait_for(lambda: container(kmock)["image"] == "registry.example/worker:2", what="new image")
    status = await wait_for(lambda: live(kmock, INFD)["status"].get("observedGeneration") == 2 and
                            live(kmock, INFD)["status"], what="observedGeneration=2")
    assert status["desiredReplicas"] == 3

    # The scale subresource (what `kubectl scale` and an HPA use) reaches the Deployment too.
    await patch(kmock, path + "/scale", {"spec": {"replicas": 0}})
    await wait_for(lambda: live(kmock, DEPLOYMENTS)["spec"]["replicas"] == 0, what="replicas=0 via scale")


async def test_deleted_and_edited_children_are_restored(kmock: Any, operator: Any) -> None:
    await operator()
    await create(kmock, infd())
    await wait_for(lambda: live(kmock, SERVICES) and live(kmock, DEPLOYMENTS), what="children")
    old_uid = live(kmock, SERVICES)["metadata"]["uid"]
    rsp = await kmock.delete(f"/api/v1/namespaces/{NS}/services/smol")
    assert rsp.status == 200
    await wait_for(lambda: live(kmock, SERVICES) and live(kmock, SERVICES)["metadata"]["uid"] != old_uid,
                   what="service recreated")
    await wait_for(lambda: any(e.get("reason") == "Restoring" for e in events(kmock)), what="Restoring event")

    dep_path = f"/apis/apps/v1/namespaces/{NS}/deployments/smol"
    await patch(kmock, dep_path, {"spec": {"replicas": 7}})
    await wait_for(lambda: live(kmock, DEPLOYMENTS)["spec"]["replicas"] == 1, what="replicas restored")


async def test_hpa_mode_writes_an_hpa_and_removes_it_when_turned_off(kmock: Any, operator: Any) -> None:
    await operator()
    await create(kmock, infd(autoscaling={"enabled": True, "mode": "hpa", "minReplicas": 1, "maxReplicas": 4}))
    hpa = await wait_for(lambda: live(kmock, HPAS), what="hpa")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": c.API_VERSION, "kind": c.KIND, "name": "smol"}
    # The HPA scales the InferenceDeployment; the operator carries spec.replicas to the Deployment.
    path = f"/apis/{c.API_VERSION}/namespaces/{NS}/{c.PLURAL}/smol"
    await patch(kmock, path + "/scale", {"spec": {"replicas": 3}})
    await wait_for(lambda: live(kmock, DEPLOYMENTS)["spec"]["replicas"] == 3, what="replicas=3")
    assert live(kmock, INFD)["spec"]["replicas"] == 3  # the operator did not write it back

    await patch(kmock, path, {"spec": {"autoscaling": {"enabled": False}}})
    await wait_for(lambda: live(kmock, HPAS) is None, what="hpa deleted")


async def test_invalid_spec_is_degraded_not_a_crash(kmock: Any, operator: Any) -> None:
    await operator()
    bad = infd(replicas=-2, executor="cuda-magic")
    await create(kmock, bad)
    status = await wait_for(lambda: live(kmock, INFD).get("status", {}).get("conditions") and
                            live(kmock, INFD)["status"], what="degraded status")
    degraded = next(cond for cond in status["conditions"] if cond["type"] == "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "InvalidSpec"
    assert "spec.replicas" in degraded["message"] and "spec.executor" in degraded["message"]
    assert live(kmock, DEPLOYMENTS) is None
    await wait_for(lambda: any(e.get("reason") == "InvalidSpec" and e.get("type") == "Warning"
                               for e in events(kmock)), what="InvalidSpec event")

    # Fixing the spec recovers without restarting anything.
    path = f"/apis/{c.API_VERSION}/namespaces/{NS}/{c.PLURAL}/smol"
    await patch(kmock, path, {"spec": {"replicas": 1, "executor": "mock"}})
    await wait_for(lambda: live(kmock, DEPLOYMENTS), what="deployment after the fix")
    await wait_for(lambda: any(cond["type"] == "Degraded" and cond["status"] == "False"
                               for cond in live(kmock, INFD)["status"]["conditions"]), what="not degraded")


async def test_with_the_operator_gone_an_infd_and_its_namespace_delete_cleanly(kmock: Any, operator: Any) -> None:
    """No finalizer: deletion never waits for the operator; the garbage collector takes the children."""
    await operator()
    auto = {"enabled": True, "mode": "operator", "maxReplicas": 2}  # the autoscaler runs for it
    await create(kmock, infd(autoscaling={"enabled": True, "mode": "hpa", "maxReplicas": 2}))
    other = infd(autoscaling=auto)
    other["metadata"]["namespace"] = "doomed"
    rsp = await kmock.post(f"/apis/{c.API_VERSION}/namespaces/doomed/{c.PLURAL}", json=other)
    assert rsp.status == 200
    await wait_for(lambda: all(live(kmock, r) for r in (DEPLOYMENTS, SERVICES, PDBS, HPAS)), what="children")
    await wait_for(lambda: (DEPLOYMENTS, "doomed", "smol") in kmock.objects, what="children in doomed")
    await wait_for(lambda: live(kmock, INFD).get("status", {}).get("conditions"), what="status")
    await operator.stop()

    remaining = [(res.plural, ns, name) for (res, ns, name), obj in kmock.objects.items()
                 if not obj.deleted and (obj.raw.get("metadata") or {}).get("finalizers")]
    assert remaining == []
    rsp = await kmock.delete(f"/apis/{c.API_VERSION}/namespaces/{NS}/{c.PLURAL}/smol")
    assert rsp.status == 200
    await kmock.delete_namespace("doomed")

    def leftovers() -> list[tuple[str, str | None, str]]:
        return [(res.plural, ns, name) for (res, ns, name), obj in kmock.objects.items()
                if not obj.deleted and res != EVENTS and ns in (NS, "doomed")]

    await wait_for(lambda: not leftovers(), what="everything deleted without the operator")


async def test_the_finalizer_of_an_older_version_is_removed(kmock: Any, operator: Any) -> None:
    old = infd()
    old["metadata"]["finalizers"] = [f"{c.GROUP}/operator"]
    await create(kmock, old)
    await operator()
    await wait_for(lambda: live(kmock, DEPLOYMENTS), what="deployment")
    await wait_for(lambda: not live(kmock, INFD)["metadata"].get("finalizers"), what="finalizer removed")


@pytest.mark.parametrize("foreign", [{"metadata": {"name": "smol", "namespace": NS}, "spec": {"ports": []}}])
async def test_a_foreign_object_in_the_way_is_a_conflict_not_a_takeover(kmock: Any, operator: Any,
                                                                        foreign: dict[str, Any]) -> None:
    rsp = await kmock.post(f"/api/v1/namespaces/{NS}/services", json=foreign)
    assert rsp.status == 200
    await operator()
    await create(kmock, infd())
    status = await wait_for(lambda: live(kmock, INFD).get("status", {}).get("conditions") and
                            live(kmock, INFD)["status"], what="status")
    degraded = next(cond for cond in status["conditions"] if cond["type"] == "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "ChildConflict"
    assert "ownerReferences" not in live(kmock, SERVICES)["metadata"]


WRITES = ("POST", "PATCH", "PUT", "DELETE")


def writes(kmock: Any) -> list[str]:
    """Writes to anything but events and peering keep-alives."""
    return [f"{r.method.value} {r.url.path}" for r in kmock._requests
            if r.method.value in WRITES and r.resource not in (EVENTS, PEERINGS)]


def child_writes(kmock: Any) -> list[str]:
    return [f"{r.method.value} {r.url.path}" for r in kmock._requests
            if r.method.value in ("POST", "PATCH", "PUT") and r.resource in (DEPLOYMENTS, SERVICES, PDBS, HPAS)]


def gets_of(kmock: Any, path: str) -> int:
    return sum(1 for r in kmock._requests if r.method.value == "GET" and r.url.path == path)


async def test_ten_resyncs_against_server_defaults_write_nothing(kmock: Any, operator: Any) -> None:
    """The emulator defaults every child as kube-apiserver does; nothing of that is drift."""
    await operator("--resync-seconds", "0.2")
    await create(kmock, infd(autoscaling={"enabled": True, "mode": "hpa", "maxReplicas": 3},
                             service={"type": "NodePort"}, image="registry.example/worker"))
    await wait_for(lambda: live(kmock, HPAS) and live(kmock, INFD).get("status", {}).get("conditions"),
                   what="children and status")
    assert container(kmock)["imagePullPolicy"] == "Always"  # defaulted by the server, not sent
    dep_path = f"/apis/apps/v1/namespaces/{NS}/deployments/smol"
    start = gets_of(kmock, dep_path)
    await wait_for(lambda: gets_of(kmock, dep_path) >= start + 1, what="a resync pass after convergence")
    before, updated_before = child_writes(kmock), [e for e in events(kmock) if e.get("reason") == "Updated"]
    start = gets_of(kmock, dep_path)
    await wait_for(lambda: gets_of(kmock, dep_path) >= start + 10, timeout=60, what="ten resync passes")
    assert child_writes(kmock) == before, "the operator rewrites what the API server defaulted"
    sent = [body for _, path, body in kmock.received if "/deployments" in path]
    assert sent and not [body for body in sent if '"imagePullPolicy": null' in body]
    assert [e for e in events(kmock) if e.get("reason") == "Updated"] == updated_before == []


async def test_two_replicas_with_peering_act_as_one(kmock: Any, operator: Any,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    rsp = await kmock.post("/apis/kopf.dev/v1/clusterkopfpeerings", json={
        "apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": "hetero-infer"}})
    assert rsp.status == 200
    await operator("--peering", "hetero-infer", "--priority", "10", identity="replica-low")
    await operator("--peering", "hetero-infer", "--priority", "20", identity="replica-high")
    key = (PEERINGS, None, "hetero-infer")
    await wait_for(lambda: set(kmock.objects[key].raw.get("status") or {}) == {"replica-low", "replica-high"},
                   what="both replicas in the peering status")
    # The status lists both before the low one has read it: wait until it has paused.
    await wait_for(lambda: any("Pausing operations in favour of" in r.getMessage() for r in caplog.records),
                   what="the low-priority replica paused")
    await create(kmock, infd())
    await wait_for(lambda: live(kmock, DEPLOYMENTS), what="deployment")
    await asyncio.sleep(1.0)
    creates = [w for w in writes(kmock) if w.startswith("POST") and "/deployments" in w]
    assert creates == [f"POST /apis/apps/v1/namespaces/{NS}/deployments"]


def unrelated_deployment(i: int) -> dict[str, Any]:
    labels = {"app": f"other-{i}"}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": f"other-{i}", "namespace": "unrelated", "labels": labels},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
                "metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": "nginx:1.27"}]}}}}


async def test_a_thousand_unrelated_deployments_never_reach_the_operator(kmock: Any, operator: Any) -> None:
    """The child watches select the operator's own objects on the server: the rest of the cluster's
    Deployments never arrive (so kopf keeps no state for them). Counted per object at the server, after
    an event sent later has arrived: no settling time, and the operator's own events do not count."""
    await operator()
    await create(kmock, infd())
    await wait_for(lambda: live(kmock, DEPLOYMENTS) and live(kmock, INFD).get("status", {}).get("conditions"),
                   timeout=30, what="converged")
    own_before = kmock.watch_events_in["deployments", NS]
    await kmock.add_many(DEPLOYMENTS, [unrelated_deployment(i) for i in range(1000)])
    # Then touch the operator's own Deployment: once that event arrived, everything sent before it has.
    await patch(kmock, f"/apis/apps/v1/namespaces/{NS}/deployments/smol", {"spec": {"replicas": 5}})
    await wait_for(lambda: live(kmock, DEPLOYMENTS)["spec"]["replicas"] == 1, timeout=30,
                   what="the operator's own event")
    assert kmock.watch_events_in["deployments", NS] > own_before  # the watch that would carry them is live
    received = kmock.watch_events_in["deployments", "unrelated"]
    assert received == 0, f"{received} unrelated Deployment events streamed to the operator"
