"""spec.model.url without a cache, with the real operator (kopf) against the API emulator: status.model and the
ModelReady condition from the worker pods' `fetch-model` init containers, through Pending -> Downloading -> Failed
-> Ready, one event per transition, and resyncs after convergence that write nothing.

The emulator has no Deployment controller and no kubelet: the test plays them, creating a pod of the worker
Deployment's template and writing its statuses and its init container's log as the kubelet would. Pod changes
trigger no pass (the operator does not watch pods): the periodic resync picks them up."""

from __future__ import annotations

from typing import Any

from kmock_cluster import DEPLOYMENTS, INFD, PODS, wait_for
from test_operator_kmock import NS, create, events, infd, live, patch, writes

from hetero_infer.operator import constants as c

URL = "hf://org/tiny"
POD = "smol-6d4f9c-x7k2p"
POD_PATH = f"/api/v1/namespaces/{NS}/pods/{POD}"
LOG_401 = ("2026-11-27 03:00:01,000 ERROR hetero_infer.model_source: hf://org/tiny: repository not found or not "
           "authorized (HTTP 401): check the name, and set HF_TOKEN\n")


def model_condition(kmock: Any) -> dict[str, Any]:
    status = (live(kmock, INFD) or {}).get("status") or {}
    return next((cd for cd in status.get("conditions") or [] if cd["type"] == c.COND_MODEL_READY), {})


async def pod_status(kmock: Any, init: dict[str, Any], worker: dict[str, Any] | None = None,
                     phase: str = "Pending") -> None:
    """What the kubelet writes: fetch-model's status, and the worker container's (PodInitializing until then)."""
    await patch(kmock, f"{POD_PATH}/status", {"status": {
        "phase": phase,
        "initContainerStatuses": [{"name": "fetch-model", "ready": False, "restartCount": 0, "image": "w", **init}],
        "containerStatuses": [{"name": "worker", "ready": False, "restartCount": 0, "image": "w",
                               "state": worker or {"waiting": {"reason": "PodInitializing"}}}]}})


async def test_the_init_containers_download_is_in_the_status(kmock: Any, operator: Any) -> None:
    await operator("--resync-seconds", "0.2")
    await create(kmock, infd(model={"name": "tiny", "url": URL, "credentialsSecret": "hf-token"}))
    dep = await wait_for(lambda: live(kmock, DEPLOYMENTS), what="the worker Deployment")
    await wait_for(lambda: model_condition(kmock).get("reason") == "Pending", what="ModelReady Pending")
    assert live(kmock, INFD)["status"]["model"] == {"url": URL, "phase": "Pending"}

    # The Deployment's pod, scheduled; its init container starts downloading and logs progress.
    template = dep["spec"]["template"]
    rsp = await kmock.post(f"/api/v1/namespaces/{NS}/pods", json={
        "apiVersion": "v1", "kind": "Pod", "spec": template["spec"],
        "metadata": {"name": POD, "namespace": NS, "labels": template["metadata"]["labels"]}})
    assert rsp.status == 200, await rsp.text()
    kmock.pod_logs[NS, POD] = (
        "2026-11-27 03:00:00,000 INFO hetero_infer.model_source: downloading hf://org/tiny: 5 file(s), 16.1 GB "
        "into /models/huggingface/hub\n"
        "2026-11-27 03:00:10,000 INFO hetero_infer.progress: hf://org/tiny: 1.5 GB of 16.1 GB (9%), 150.0 MB/s, 10 s\n")
    await pod_status(kmock, {"state": {"running": {"startedAt": "2026-11-27T03:00:00Z"}}, "started": True})
    await wait_for(lambda: model_condition(kmock).get("reason") == "Downloading", what="ModelReady Downloading")
    assert model_condition(kmock)["message"] == "downloading hf://org/tiny: 1.5 GB of 16.1 GB (9%), 150.0 MB/s"
    assert model_condition(kmock)["status"] == "False"
    logs = [r.params for r in kmock._requests if r.url.path == f"{POD_PATH}/log"]
    assert logs and all(p.get("container") == "fetch-model" for p in logs)

    # It fails (the token is wrong) and the kubelet backs off before the next attempt.
    await pod_status(kmock, {"restartCount": 1, "state": {"waiting": {
        "reason": "CrashLoopBackOff", "message": f"back-off 10s restarting failed container=fetch-model pod={POD}"}},
        "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": LOG_401}}})
    await wait_for(lambda: model_condition(kmock).get("reason") == "Unauthorized", what="ModelReady Unauthorized")
    assert model_condition(kmock)["message"].startswith("hf://org/tiny: repository not found or not authorized")
    assert live(kmock, INFD)["status"]["model"]["phase"] == "Failed"
    rsp = await kmock.get(f"/apis/{c.API_VERSION}/namespaces/{NS}/{c.PLURAL}",
                          headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"})
    table = await rsp.json()  # `kubectl get infd -o wide`
    (row,) = table["rows"]
    assert row["cells"][[col["name"] for col in table["columnDefinitions"]].index("Download")] == "Failed"

    # The Secret is fixed: the next attempt completes and the worker starts.
    await pod_status(kmock, {"restartCount": 1, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}},
                             "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": LOG_401}}},
                     worker={"running": {"startedAt": "2026-11-27T03:05:00Z"}}, phase="Running")
    await wait_for(lambda: model_condition(kmock).get("status") == "True", what="ModelReady True")
    assert model_condition(kmock)["reason"] == "Ready"
    assert live(kmock, INFD)["status"]["model"] == {"url": URL, "phase": "Ready"}

    def transitions() -> list[tuple[str, str]]:
        return [(e["type"], e["reason"]) for e in events(kmock) if e.get("reason", "").startswith("Model")]

    await wait_for(lambda: ("Normal", "ModelReady") in transitions(), what="the ModelReady event")
    assert transitions() == [("Normal", "ModelPending"), ("Normal", "ModelDownloading"), ("Warning", "ModelFailed"),
                             ("Normal", "ModelReady")]

    def lists() -> int:  # one pod list per pass
        return sum(1 for r in kmock._requests if r.method.value == "GET" and r.resource == PODS and r.name is None
                   and r.params.get("labelSelector"))

    start = lists()
    await wait_for(lambda: lists() >= start + 2, what="resyncs after convergence")
    def log_reads() -> int:
        return sum(1 for r in kmock._requests if r.url.path.endswith("/log"))

    before, start, version = writes(kmock), lists(), live(kmock, INFD)["metadata"]["resourceVersion"]
    events_before, logs_before = len(events(kmock)), log_reads()
    await wait_for(lambda: lists() >= start + 10, timeout=60, what="ten resync passes")
    assert writes(kmock) == before and live(kmock, INFD)["metadata"]["resourceVersion"] == version, \
        "resyncs after convergence wrote something"
    assert len(events(kmock)) == events_before
    assert log_reads() == logs_before, "a log was read with the model downloaded"
