"""spec.model.cache with the real operator (kopf) against the API emulator: the claim, one download Job, no worker
before the model is in the cache, ModelReady through Pending -> Downloading -> Ready and -> Failed, a new revision
downloaded beside the old one and rolled to, and resyncs after convergence that write nothing.

The emulator has no Job controller and no kubelet: the tests play them, writing what they would (the Job's pod
with the selector's labels, its phase, its log, the Job's status), and check what the operator makes of it."""

from __future__ import annotations

import asyncio
from typing import Any

from kmock_cluster import DEPLOYMENTS, INFD, JOBS, PODS, PVCS, wait_for
from test_operator_kmock import NS, create, events, infd, live, patch

from hetero_infer.operator import constants as c
from hetero_infer.operator.manifests import cache_key, cached_model_path, fetch_job_name
from hetero_infer.operator.manifests.common import Owner

URL = "hf://org/tiny"
INFD_PATH = f"/apis/{c.API_VERSION}/namespaces/{NS}/{c.PLURAL}/smol"


def cached(**model: Any) -> dict[str, Any]:
    spec = {"name": "tiny", "url": URL, "credentialsSecret": "hf-token",
            "cache": {"storageClassName": "nfs", "size": "50Gi"}, **model}
    return infd(model=spec, replicas=2)


def job_name(url: str = URL, claim: str | None = None) -> str:
    return fetch_job_name(Owner("smol", NS, ""), cache_key(url), claim)


def condition(kmock: Any, kind: str) -> dict[str, Any] | None:
    status = (live(kmock, INFD) or {}).get("status") or {}
    return next((cd for cd in status.get("conditions") or [] if cd["type"] == kind), None)


def model_reason(kmock: Any) -> str | None:
    cond = condition(kmock, c.COND_MODEL_READY)
    return cond["reason"] if cond else None


async def start_pod(kmock: Any, job: dict[str, Any], name: str, phase: str, log: str = "",
                    terminated: dict[str, Any] | None = None) -> None:
    """What the Job controller and the kubelet do: a pod with the Job's selector labels, in `phase`."""
    labels = dict(job["spec"]["selector"]["matchLabels"], **{"batch.kubernetes.io/job-name": job["metadata"]["name"]})
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS, "labels": labels},
           "spec": job["spec"]["template"]["spec"]}
    rsp = await kmock.post(f"/api/v1/namespaces/{NS}/pods", json=pod)
    assert rsp.status == 200, await rsp.text()
    state = {"terminated": terminated} if terminated else {"running": {}} if phase == "Running" else {
        "waiting": {"reason": "ContainerCreating"}}
    await patch(kmock, f"/api/v1/namespaces/{NS}/pods/{name}/status", {"status": {
        "phase": phase, "containerStatuses": [{"name": "fetch-model", "state": state}]}})
    kmock.pod_logs[NS, name] = log


async def job_status(kmock: Any, name: str, status: dict[str, Any]) -> None:
    await patch(kmock, f"/apis/batch/v1/namespaces/{NS}/jobs/{name}/status", {"status": status})


COMPLETE = {"succeeded": 1, "active": 0, "conditions": [{"type": "Complete", "status": "True"}]}


async def test_one_download_job_fills_the_cache_before_any_worker_starts(kmock: Any, operator: Any) -> None:
    await operator()
    created = await create(kmock, cached())
    claim = await wait_for(lambda: live(kmock, PVCS, "smol-model-cache"), what="the cache claim")
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"] and claim["spec"]["storageClassName"] == "nfs"
    assert claim["spec"]["resources"]["requests"]["storage"] == "50Gi"
    assert claim["metadata"]["ownerReferences"][0]["uid"] == created["metadata"]["uid"]

    job = await wait_for(lambda: live(kmock, JOBS, job_name()), what="the download Job")
    key = cache_key(URL)
    (fetch,) = job["spec"]["template"]["spec"]["containers"]
    assert fetch["command"] == ["hetero-infer", "fetch", URL, "--link", cached_model_path(key)]
    assert fetch["image"] == "ghcr.io/hetero-infer/worker:0.1.0-cpu"  # the worker's image
    assert fetch["envFrom"] == [{"secretRef": {"name": "hf-token"}}]
    assert {e["name"]: e["value"] for e in fetch["env"]}["HF_HOME"] == f"/models/{key}/huggingface"
    assert {"name": "model", "mountPath": "/models"} in fetch["volumeMounts"]
    volumes = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
    assert volumes["model"] == {"name": "model", "persistentVolumeClaim": {"claimName": "smol-model-cache"}}
    assert job["spec"]["backoffLimit"] == 6 and job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    assert not [v for v in job["spec"]["template"]["spec"]["containers"][0]["env"] if "TOKEN" in v["name"]]

    await wait_for(lambda: model_reason(kmock) == "Pending", what="ModelReady Pending")
    assert condition(kmock, "Ready")["reason"] == "ModelPending"

    # The pod is scheduled, then runs and logs progress (hetero-infer fetch's own lines).
    await start_pod(kmock, job, "smol-fetch-a", "Pending")
    await job_status(kmock, job_name(), {"active": 1})
    await wait_for(lambda: "ContainerCreating" in (condition(kmock, c.COND_MODEL_READY) or {}).get("message", ""),
                   what="the pod's waiting reason")
    await patch(kmock, f"/api/v1/namespaces/{NS}/pods/smol-fetch-a/status", {"status": {
        "phase": "Running", "containerStatuses": [{"name": "fetch-model", "state": {"running": {}}}]}})
    kmock.pod_logs[NS, "smol-fetch-a"] = (
        "2026-11-27 03:00:00,000 INFO hetero_infer.model_source: downloading hf://org/tiny: 5 file(s), 16.1 GB "
        "into /models/x/huggingface/hub\n"
        "2026-11-27 03:00:10,000 INFO hetero_infer.progress: hf://org/tiny: 1.5 GB of 16.1 GB (9%), 150.0 MB/s, 10 s\n")
    await job_status(kmock, job_name(), {"active": 1, "ready": 1})
    await wait_for(lambda: model_reason(kmock) == "Downloading", what="ModelReady Downloading")
    assert "1.5 GB of 16.1 GB (9%)" in condition(kmock, c.COND_MODEL_READY)["message"]
    assert live(kmock, INFD)["status"]["model"] == {"url": URL, "phase": "Downloading"}
    rsp = await kmock.get(f"/apis/{c.API_VERSION}/namespaces/{NS}/{c.PLURAL}",
                          headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"})
    table = await rsp.json()  # what `kubectl get infd -o wide` prints, by the CRD's printer columns
    names = [col["name"] for col in table["columnDefinitions"]]
    (row,) = table["rows"]
    assert row["cells"][names.index("Download")] == "Downloading"
    assert row["cells"][names.index("Status")] == "ModelDownloading"
    assert live(kmock, DEPLOYMENTS) is None, "a worker started before the model was in the cache"
    assert not [p for (res, _, n), p in kmock.objects.items() if res == PODS and not n.startswith("smol-fetch")]

    await job_status(kmock, job_name(), COMPLETE)
    dep = await wait_for(lambda: live(kmock, DEPLOYMENTS), what="the worker Deployment")
    pod = dep["spec"]["template"]["spec"]
    (worker,) = pod["containers"]
    assert worker["args"][worker["args"].index("--model") + 1] == f"/models/{key}/model"
    assert "initContainers" not in pod and "envFrom" not in worker  # the Job alone holds the credentials
    assert {"name": "model", "persistentVolumeClaim": {"claimName": "smol-model-cache", "readOnly": True}} \
        in pod["volumes"]
    # only their model's folder of the shared claim (a subPath), where --model points into
    assert {"name": "model", "mountPath": f"/models/{key}", "subPath": key, "readOnly": True} in worker["volumeMounts"]
    assert dep["spec"]["replicas"] == 2
    await wait_for(lambda: model_reason(kmock) == "Ready" and condition(kmock, c.COND_MODEL_READY)["status"] == "True",
                   what="ModelReady True")

    def transitions() -> list[str]:
        return [e["reason"] for e in events(kmock) if e.get("reason", "").startswith("Model")]

    await wait_for(lambda: "ModelReady" in transitions(), what="the ModelReady event")
    assert transitions() == ["ModelPending", "ModelDownloading", "ModelReady"]  # one event per transition


async def test_a_new_revision_downloads_beside_the_old_one_then_rolls_the_workers(kmock: Any,
                                                                                   operator: Any) -> None:
    await operator("--resync-seconds", "0.2")
    await create(kmock, cached())
    await wait_for(lambda: live(kmock, JOBS, job_name()), what="the first Job")
    await job_status(kmock, job_name(), COMPLETE)
    await wait_for(lambda: live(kmock, DEPLOYMENTS), what="workers")
    old_args = live(kmock, DEPLOYMENTS)["spec"]["template"]["spec"]["containers"][0]["args"]

    new = URL + "@v2"
    await patch(kmock, INFD_PATH, {"spec": {"model": {"url": new}}})
    job = await wait_for(lambda: live(kmock, JOBS, job_name(new)), what="the new revision's Job")
    assert job["spec"]["template"]["spec"]["containers"][0]["command"][3:] == [
        "--link", cached_model_path(cache_key(new))]
    await start_pod(kmock, job, "smol-fetch-v2", "Running", log="")
    await job_status(kmock, job_name(new), {"active": 1})
    await wait_for(lambda: model_reason(kmock) == "Downloading", what="downloading v2")
    assert condition(kmock, "Progressing")["reason"] == "DownloadingModel"
    assert live(kmock, DEPLOYMENTS)["spec"]["template"]["spec"]["containers"][0]["args"] == old_args  # serving
    assert live(kmock, JOBS, job_name()) is not None

    await job_status(kmock, job_name(new), COMPLETE)
    await wait_for(lambda: f"/models/{cache_key(new)}/model" in
                   live(kmock, DEPLOYMENTS)["spec"]["template"]["spec"]["containers"][0]["args"], what="rolled")
    await wait_for(lambda: live(kmock, JOBS, job_name()) is None, what="the old revision's Job deleted")
    await wait_for(lambda: model_reason(kmock) == "Ready", what="ModelReady for v2")

    def writes() -> list[str]:
        return [f"{r.method.value} {r.url.path}" for r in kmock._requests if r.method.value in ("POST", "PATCH",
                "PUT", "DELETE") and r.resource in (DEPLOYMENTS, JOBS, PVCS)]

    def versions() -> list[str]:  # a status write that conflicted (a pass that started before the last write) is none
        return [live(kmock, res, name)["metadata"]["resourceVersion"] for res, name in (
            (INFD, "smol"), (DEPLOYMENTS, "smol"), (JOBS, job_name(new)), (PVCS, "smol-model-cache"))]

    def gets(path: str) -> int:
        return sum(1 for r in kmock._requests if r.method.value == "GET" and r.url.path == path)

    job_path = f"/apis/batch/v1/namespaces/{NS}/jobs/{job_name(new)}"
    start = gets(job_path)
    await wait_for(lambda: gets(job_path) >= start + 2, what="resyncs after convergence")
    await wait_for(lambda: "tiny@v2" in live(kmock, INFD)["metadata"]["annotations"].get(
        f"{c.KOPF_ANNOTATION_PREFIX}/last-handled-configuration", ""), what="kopf done with the spec change")
    before, versions_before, start = writes(), versions(), gets(job_path)
    await wait_for(lambda: gets(job_path) >= start + 10, timeout=60, what="ten resync passes")
    assert writes() == before and versions() == versions_before, "resyncs after convergence wrote something"


async def test_a_failed_download_backs_off_then_fails_without_starting_workers(kmock: Any, operator: Any) -> None:
    await operator()
    missing = "hf://org/missing"
    await create(kmock, cached(url=missing))
    job = await wait_for(lambda: live(kmock, JOBS, job_name(missing)), what="the Job")
    line = f"{missing}: repository not found (HTTP 404)"
    message = f"2026-11-27 03:00:00,000 ERROR hetero_infer.model_source: {line}\n"
    await start_pod(kmock, job, "fetch-1", "Failed", terminated={"exitCode": 1, "reason": "Error",
                                                                  "message": message})
    await job_status(kmock, job_name(missing), {"active": 0, "failed": 1})
    await wait_for(lambda: "after 1 failed attempt(s)" in (condition(kmock, c.COND_MODEL_READY) or {}).get("message", ""),
                   what="back-off between attempts")
    assert model_reason(kmock) == "Pending" and line in condition(kmock, c.COND_MODEL_READY)["message"]

    await job_status(kmock, job_name(missing), {"active": 0, "failed": 7, "conditions": [
        {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
         "message": "Job has reached the specified backoff limit"}]})
    await wait_for(lambda: model_reason(kmock) == "NotFound", what="ModelReady NotFound")
    cond = condition(kmock, c.COND_MODEL_READY)
    assert cond["status"] == "False" and cond["message"].startswith(line)
    assert live(kmock, INFD)["status"]["model"]["phase"] == "Failed"
    assert condition(kmock, "Ready")["reason"] == "ModelFailed" and condition(kmock, "Degraded")["reason"] == "ModelFailed"
    await wait_for(lambda: any(e.get("reason") == "ModelFailed" and e.get("type") == "Warning"
                               and line in e.get("message", "") for e in events(kmock)), what="ModelFailed event")
    assert live(kmock, DEPLOYMENTS) is None

    # Deleting the Job (after fixing the cause) is a fresh attempt: the operator creates it again.
    rsp = await kmock.delete(f"/apis/batch/v1/namespaces/{NS}/jobs/{job_name(missing)}")
    assert rsp.status == 200
    await wait_for(lambda: (live(kmock, JOBS, job_name(missing)) or {}).get("metadata", {}).get("uid") not in
                   (None, job["metadata"]["uid"]), what="a new Job")
    await wait_for(lambda: model_reason(kmock) == "Pending", what="Pending again")


async def test_an_existing_claim_is_waited_for_and_never_created(kmock: Any, operator: Any) -> None:
    await operator()
    await create(kmock, cached(url="s3://models/llama/8b", cache={"claimName": "shared-models"}))
    await wait_for(lambda: "shared-models" in (condition(kmock, c.COND_MODEL_READY) or {}).get("message", ""),
                   what="waiting for the claim")
    assert live(kmock, JOBS, job_name("s3://models/llama/8b", "shared-models")) is None
    assert live(kmock, PVCS, "smol-model-cache") is None
    rsp = await kmock.post(f"/api/v1/namespaces/{NS}/persistentvolumeclaims", json={
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "shared-models", "namespace": NS},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "100Gi"}}}})
    assert rsp.status == 200
    # Not a child of this InferenceDeployment: the resync (or an edit) notices it.
    await patch(kmock, INFD_PATH, {"spec": {"replicas": 3}})
    job = await wait_for(lambda: live(kmock, JOBS, job_name("s3://models/llama/8b", "shared-models")), what="the Job")
    assert {"name": "model", "persistentVolumeClaim": {"claimName": "shared-models"}} in \
        job["spec"]["template"]["spec"]["volumes"]


async def test_two_deployments_on_one_claim_and_url_share_one_download_job(kmock: Any, operator: Any) -> None:
    """Two InferenceDeployments of one model on one existing claim: one Job writes its folder (named by the claim and
    the source, not by either owner); the second waits on it, and both start their workers once it completed."""
    await operator()
    rsp = await kmock.post(f"/api/v1/namespaces/{NS}/persistentvolumeclaims", json={
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "shared-models", "namespace": NS},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "100Gi"}}}})
    assert rsp.status == 200
    model = {"name": "tiny", "url": URL, "cache": {"claimName": "shared-models"}}
    first = await create(kmock, infd("first", model=model))
    name = job_name(URL, "shared-models")
    job = await wait_for(lambda: live(kmock, JOBS, name), what="the shared download Job")
    assert [o["uid"] for o in job["metadata"]["ownerReferences"]] == [first["metadata"]["uid"]]
    await create(kmock, infd("second", model=model))
    await wait_for(lambda: (live(kmock, INFD, "second") or {}).get("status", {}).get("model", {}).get("phase")
                   == "Pending", what="the second one waiting on the first one's Job")
    assert [k for k in kmock.objects if k[0] == JOBS and not kmock.objects[k].deleted] == [(JOBS, NS, name)]
    assert not any(e.get("reason") == "ChildConflict" for e in events(kmock))
    # the second's own children's events have long been handled: only the Job's completion can wake it now (an
    # event of the Job reaches its controller, the first; the operator also wakes those sharing the download)
    await asyncio.sleep(1.0)
    await job_status(kmock, name, COMPLETE)
    for owner in ("first", "second"):
        dep = await wait_for(lambda o=owner: live(kmock, DEPLOYMENTS, o), what=f"{owner}'s workers")
        assert dep["metadata"]["annotations"][c.MODEL_CACHE_KEY_ANNOTATION] == cache_key(URL)


async def test_the_download_job_runs_where_and_as_whom_the_spec_says(kmock: Any, operator: Any) -> None:
    """spec.model.cache.download reaches the Job: a CPU node pool, a workload-identity ServiceAccount, a private CA
    bundle from a ConfigMap, a priority, a deadline and the fail-fast policy; an image of its own."""
    await operator()
    download = {
        "image": "registry.example.com/hetero-infer/fetch:1",
        "nodeSelector": {"pool": "cpu"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "batch", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}]}}},
        "serviceAccountName": "model-reader",
        "priorityClassName": "batch-low",
        "podLabels": {"azure.workload.identity/use": "true"},
        "podAnnotations": {"eks.amazonaws.com/sts-regional-endpoints": "true"},
        "volumes": [{"name": "ca", "configMap": {"name": "corp-ca"}}],
        "volumeMounts": [{"name": "ca", "mountPath": "/etc/corp-ca", "readOnly": True}],
        "activeDeadlineSeconds": 7200,
        "backoffLimit": 2,
        "resources": {"cpu": "2", "memory": "1Gi"},
    }
    await create(kmock, cached(url="s3://models/llama/8b", credentialsSecret=None,
                               cache={"size": "50Gi", "download": download}))
    job = await wait_for(lambda: live(kmock, JOBS, job_name("s3://models/llama/8b")), what="the download Job")
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    assert spec["activeDeadlineSeconds"] == 7200 and spec["backoffLimit"] == 2
    assert spec["podFailurePolicy"]["rules"][0]["action"] == "FailJob"
    assert pod["nodeSelector"] == {"pool": "cpu"} and pod["tolerations"] == download["tolerations"]
    assert pod["affinity"] == download["affinity"]
    assert pod["serviceAccountName"] == "model-reader" and pod["priorityClassName"] == "batch-low"
    assert job["spec"]["template"]["metadata"]["labels"]["azure.workload.identity/use"] == "true"
    assert job["spec"]["template"]["metadata"]["annotations"] == download["podAnnotations"]
    assert {v["name"]: v.get("configMap", {}).get("name") for v in pod["volumes"]}["ca"] == "corp-ca"
    (fetch,) = pod["containers"]
    assert fetch["image"] == download["image"]
    assert {"name": "ca", "mountPath": "/etc/corp-ca", "readOnly": True} in fetch["volumeMounts"]
    assert fetch["resources"] == {"requests": {"cpu": "2", "memory": "1Gi"}, "limits": {"memory": "1Gi"}}


async def test_a_gguf_on_a_claim_is_converted_once_for_gpu_workers(kmock: Any, operator: Any) -> None:
    await operator()
    body = infd(model={"name": "llama", "url": "pvc://weights/llama.Q4_K_M.gguf", "cache": {"size": "20Gi"}},
                replicas=2, resources={"gpus": 1})
    await create(kmock, body)
    name = fetch_job_name(Owner("smol", NS, ""), cache_key("pvc://weights/llama.Q4_K_M.gguf as bfloat16"))
    job = await wait_for(lambda: live(kmock, JOBS, name), what="the conversion Job")
    assert job["spec"]["template"]["spec"]["containers"][0]["command"][-2:] == ["--gguf-dtype", "bfloat16"]
    await wait_for(lambda: (live(kmock, INFD).get("status") or {}).get("model") == {
        "url": "pvc://weights/llama.Q4_K_M.gguf as bfloat16", "phase": "Pending"}, what="status.model")
    assert live(kmock, DEPLOYMENTS) is None
    await job_status(kmock, name, COMPLETE)
    dep = await wait_for(lambda: live(kmock, DEPLOYMENTS), what="the workers")
    assert [v["persistentVolumeClaim"]["claimName"] for v in dep["spec"]["template"]["spec"]["volumes"]
            if "persistentVolumeClaim" in v] == ["smol-model-cache"]


async def test_a_model_that_cannot_be_split_fails_its_download_then_a_fixed_spec_retries(kmock: Any, operator: Any,
                                                                                        tmp_path: Any) -> None:
    """resources.gpus: 3 renders fetch's split check; its one-line refusal (fetch's real error line) is ModelReady
    CannotSplit and no worker starts; gpus: 2 replaces the failed Job with one that checks 2 ways."""
    import json

    import pytest

    from hetero_infer.model_source import EXIT_PERMANENT, ModelSourceError, check_tensor_split

    (tmp_path / "config.json").write_text(json.dumps({"num_attention_heads": 16, "num_key_value_heads": 8,
                                                      "hidden_size": 64, "intermediate_size": 128}))
    with pytest.raises(ModelSourceError) as refused:  # the line fetch logs in the Job's pod
        check_tensor_split("org/tiny", tmp_path, 3)
    line = str(refused.value)

    await operator()
    body = cached(cache={"storageClassName": "nfs", "size": "50Gi"})
    body["spec"].update(executor="torch", resources={"gpus": 3})
    await create(kmock, body)
    job = await wait_for(lambda: live(kmock, JOBS, job_name()), what="the Job")
    (fetch,) = job["spec"]["template"]["spec"]["containers"]
    assert fetch["command"][-2:] == ["--tensor-parallel-size", "3"]
    await start_pod(kmock, job, "fetch-1", "Failed", terminated={
        "exitCode": EXIT_PERMANENT, "reason": "Error",
        "message": f"2026-11-29 10:00:00,000 ERROR hetero_infer.model_source: {line}\n"})
    await job_status(kmock, job_name(), {"active": 0, "failed": 1, "conditions": [
        {"type": "Failed", "status": "True", "reason": "PodFailurePolicy", "message": "Container fetch-model ..."}]})
    await wait_for(lambda: model_reason(kmock) == "CannotSplit", what="ModelReady CannotSplit")
    cond = condition(kmock, c.COND_MODEL_READY)
    assert cond["status"] == "False" and cond["message"].startswith(line)
    assert condition(kmock, "Ready")["reason"] == "ModelFailed"
    assert live(kmock, DEPLOYMENTS) is None

    await patch(kmock, f"{INFD_PATH}", {"spec": {"resources": {"gpus": 2}}})
    await wait_for(lambda: (live(kmock, JOBS, job_name()) or {}).get("metadata", {}).get("uid") not in
                   (None, job["metadata"]["uid"]), what="the failed Job replaced")
    (fetch,) = live(kmock, JOBS, job_name())["spec"]["template"]["spec"]["containers"]
    assert fetch["command"][-2:] == ["--tensor-parallel-size", "2"]
    await wait_for(lambda: model_reason(kmock) == "Pending", what="a fresh attempt")
