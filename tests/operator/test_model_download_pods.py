"""spec.model.url without a cache: the download's phase from the worker pods' `fetch-model` init containers (pure),
on pods as the operator renders them with statuses as the kubelet reports them (initContainerStatuses with state
and lastState), and the status it writes from that."""

from __future__ import annotations

import copy
from typing import Any

from hetero_infer.operator import constants as c
from hetero_infer.operator.manifests import Owner, children
from hetero_infer.operator.model_state import (
    DOWNLOADING,
    FAILED,
    NO_SPACE,
    NOT_FOUND,
    PENDING,
    READY,
    UNAUTHORIZED,
    fetching_pod,
    init_state,
    transition_event,
)
from hetero_infer.operator.spec import parse_spec
from hetero_infer.operator.status import Observed, compute_status

OWNER = Owner("llama-8b", "models", "uid-1")
URL = "hf://org/tiny"
LOG_404 = ("2026-11-27 03:00:00,000 INFO hetero_infer.model_source: resolving hf://org/tiny\n"
           "2026-11-27 03:00:01,000 ERROR hetero_infer.model_source: hf://org/tiny: repository not found (HTTP 404)\n")
LOG_401 = ("2026-11-27 03:00:01,000 ERROR hetero_infer.model_source: hf://org/tiny: repository not found or not "
           "authorized (HTTP 401): check the name, and set HF_TOKEN\n")
PROGRESS = ("2026-11-27 03:00:00,000 INFO hetero_infer.model_source: downloading hf://org/tiny: 5 file(s), 16.1 GB "
            "into /models/huggingface/hub\n"
            "2026-11-27 03:00:10,000 INFO hetero_infer.progress: hf://org/tiny: 1.5 GB of 16.1 GB (9%), 150.0 MB/s, 10 s\n")


def spec(url: str | None = URL, **model: Any) -> Any:
    raw = {"name": "tiny", **({"url": url} if url else {"path": "/opt/models/tiny"}), **model}
    return parse_spec({"model": raw, "replicas": 2}, OWNER.name)


def worker_pod(name: str, init: dict[str, Any] | None = None, worker: dict[str, Any] | None = None,
               url: str = URL, created: str = "2026-11-27T03:00:00Z", phase: str = "Pending") -> dict[str, Any]:
    """A worker pod of the rendered Deployment, with the kubelet's statuses: `init` is fetch-model's
    (state, lastState, restartCount), `worker` the worker container's state (PodInitializing until init is done)."""
    template = children(OWNER, spec(url)).deployment["spec"]["template"]
    status: dict[str, Any] = {"phase": phase, "containerStatuses": [{
        "name": "worker", "ready": False, "restartCount": 0, "started": False, "image": "worker",
        "state": worker or {"waiting": {"reason": "PodInitializing"}}}]}
    if init is not None:
        status["initContainerStatuses"] = [{"name": "fetch-model", "ready": False, "image": "worker",
                                            "restartCount": 0, **init}]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": OWNER.namespace, "creationTimestamp": created,
                         "labels": dict(template["metadata"]["labels"])},
            "spec": copy.deepcopy(template["spec"]), "status": status}


RUNNING = {"state": {"running": {"startedAt": "2026-11-27T03:00:05Z"}}, "started": True}
DONE = {"state": {"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": "2026-11-27T03:00:05Z",
                                 "finishedAt": "2026-11-27T03:04:00Z"}}, "ready": True}


def crash_looping(message: str, restarts: int = 2) -> dict[str, Any]:
    return {"restartCount": restarts, "state": {"waiting": {
        "reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container=fetch-model "
                                                 "pod=llama-8b-6d4f-x_models(uid)"}},
            "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": message}}}


def test_no_pod_or_none_downloading_yet_is_pending() -> None:
    state = init_state(URL, [])
    assert (state.phase, state.reason, state.source) == (PENDING, PENDING, URL)
    assert state.message == "waiting for a worker pod to download hf://org/tiny"
    pulling = worker_pod("a", {"state": {"waiting": {"reason": "ErrImagePull", "message": "pull access denied"}}})
    assert init_state(URL, [pulling]).message.endswith("not downloading yet: ErrImagePull: pull access denied")
    unscheduled = worker_pod("b")
    del unscheduled["status"]["containerStatuses"]
    unscheduled["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                            "message": "0/3 nodes are available: 3 Insufficient ephemeral-storage."}]
    pending = init_state(URL, [unscheduled])
    assert pending.phase == PENDING and pending.message.endswith("3 Insufficient ephemeral-storage.")
    assert fetching_pod(URL, [pulling, unscheduled]) is None


def test_a_running_init_container_is_downloading_with_its_progress() -> None:
    pods = [worker_pod("a", RUNNING)]
    assert fetching_pod(URL, pods) == "a"
    state = init_state(URL, pods, PROGRESS)
    assert (state.phase, state.message) == (DOWNLOADING, "downloading hf://org/tiny: 1.5 GB of 16.1 GB (9%), "
                                                         "150.0 MB/s")
    assert init_state(URL, pods).message == "downloading hf://org/tiny"  # no log yet
    # a retry after a failed attempt says so, while the kubelet's next attempt runs
    retry = worker_pod("b", {**RUNNING, "restartCount": 1,
                             "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": LOG_401}}},
                       created="2026-11-27T03:01:00Z")
    again = init_state(URL, [worker_pod("a", crash_looping(LOG_404)), retry])
    assert fetching_pod(URL, [worker_pod("a", crash_looping(LOG_404)), retry]) == "b"
    assert again.phase == DOWNLOADING and again.message.endswith(
        "(after 1 failed attempt(s): hf://org/tiny: repository not found or not authorized (HTTP 401): check the "
        "name, and set HF_TOKEN)")


def test_a_failed_init_container_is_failed_with_the_reason_of_its_message() -> None:
    looping = init_state(URL, [worker_pod("a", crash_looping(LOG_404))])
    assert (looping.phase, looping.reason) == (FAILED, NOT_FOUND)
    assert looping.message == ("hf://org/tiny: repository not found (HTTP 404) (pod a, init container fetch-model; "
                               "the kubelet retries it with back-off)")
    # just terminated, before the kubelet's back-off shows
    now = worker_pod("a", {"state": {"terminated": {"exitCode": 1, "reason": "Error", "message": LOG_401}}})
    assert init_state(URL, [now]).reason == UNAUTHORIZED and fetching_pod(URL, [now]) is None
    # no termination message: the kubelet's reason and exit code
    killed = worker_pod("a", {"restartCount": 1, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                              "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}})
    assert init_state(URL, [killed]).message.startswith("OOMKilled: exit code 137")
    # evicted for its storage (the emptyDir's sizeLimit, model.downloadSize)
    evicted = worker_pod("a", {"state": {"terminated": {"exitCode": 137, "reason": "ContainerStatusUnknown"}}},
                         phase="Failed")
    evicted["status"].update(reason="Evicted", message="Pod ephemeral local storage usage exceeds the total limit "
                                                       "of containers 20Gi.")
    assert init_state(URL, [evicted]).reason == NO_SPACE
    # the model is there but does not split over resources.gpus (fetch --tensor-parallel-size)
    split = "cannot split org/tiny 3 ways: num_attention_heads=16 is not divisible by 3"
    refused = worker_pod("a", {"state": {"terminated": {"exitCode": 3, "reason": "Error", "message":
                                                        f"2026-11-29 10:00:00,000 ERROR hetero_infer.model_source: {split}\n"}}})
    state = init_state(URL, [refused])
    assert (state.phase, state.reason) == (FAILED, "CannotSplit") and state.message.startswith(split)


def test_one_pod_with_the_model_is_ready_whatever_the_others_do() -> None:
    pods = [worker_pod("a", crash_looping(LOG_404)), worker_pod("b", DONE, {"running": {}}), worker_pod("c", RUNNING)]
    state = init_state(URL, pods, PROGRESS)
    assert (state.phase, state.ready, state.message) == (READY, True, "a worker pod downloaded hf://org/tiny")
    assert fetching_pod(URL, pods) is None  # no log is read once a pod has the model
    # the pod's sandbox was recreated: its init container runs again, but its worker has run
    rerun = worker_pod("a", RUNNING, {"waiting": {"reason": "PodInitializing"}})
    rerun["status"]["containerStatuses"][0]["lastState"] = {"terminated": {"exitCode": 0, "reason": "Completed"}}
    assert init_state(URL, [rerun]).phase == READY


def test_pods_of_another_url_do_not_count() -> None:
    old = worker_pod("old", DONE, {"running": {}}, url=URL)
    new = worker_pod("new", RUNNING, url=URL + "@v2", created="2026-11-27T04:00:00Z")
    assert init_state(URL + "@v2", [old, new]).phase == DOWNLOADING
    assert fetching_pod(URL + "@v2", [old, new]) == "new"
    assert init_state(URL + "@v2", [old]).phase == PENDING


def test_transitions_are_events() -> None:
    failed = init_state(URL, [worker_pod("a", crash_looping(LOG_404))])
    written = {"url": URL, "phase": DOWNLOADING}
    etype, reason, message = transition_event(written, {"reason": DOWNLOADING}, URL, failed)
    assert (etype, reason) == ("Warning", "ModelFailed") and message.startswith("NotFound: hf://org/tiny")
    assert transition_event({"url": URL, "phase": FAILED}, {"reason": NOT_FOUND}, URL, failed) is None


def status_for(model_spec: Any, state: Any, previous: dict[str, Any] | None = None) -> dict[str, Any]:
    dep = {"status": {"replicas": 2, "readyReplicas": 0}}
    return compute_status(spec=model_spec, observed=Observed(generation=1, deployment=dep, model=state),
                          previous=previous, selector="s", endpoint="e", now="2026-11-27T03:00:00Z")


def test_the_status_has_the_download_only_while_each_pod_downloads() -> None:
    state = init_state(URL, [worker_pod("a", crash_looping(LOG_404))])
    status = status_for(spec(), state)
    assert status["model"] == {"url": URL, "phase": FAILED}
    cond = {cd["type"]: cd for cd in status["conditions"]}
    assert (cond[c.COND_MODEL_READY]["status"], cond[c.COND_MODEL_READY]["reason"]) == ("False", NOT_FOUND)
    assert cond["Ready"]["reason"] == "NoReplicasReady"  # the workers' conditions are theirs, as before
    # the url replaced by a path in the image: the download's fields go
    without = status_for(spec(None), None, previous=status)
    assert without["model"] is None and c.COND_MODEL_READY not in {cd["type"] for cd in without["conditions"]}
    # an API error this pass (no state): the last known download stays
    kept = status_for(spec(), None, previous=status)
    assert "model" not in kept and c.COND_MODEL_READY in {cd["type"] for cd in kept["conditions"]}
