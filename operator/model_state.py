"""How far a model's download into spec.model.cache got (pure): the download Job, its pods and the running pod's
log tail -> the phase the ModelReady condition reports.

Phases: Pending (no Job yet, its pod not running, a missing claim, or waiting out the back-off after a failed
attempt), Downloading (the pod runs; the message carries the last progress line `hetero-infer fetch` logged:
bytes done of the total), Ready (the Job completed) and Failed (the Job gave up after its back-off limit). A
failure's reason comes from the failed pod's termination message (the fetch's one-line error, its log's tail
with terminationMessagePolicy FallbackToLogsOnError): NotFound, Unauthorized, NoSpace, CannotSplit (the model
is in place but cannot be split over resources.gpus tensor-parallel ranks: `fetch --tensor-parallel-size`), else
DownloadFailed, and the message is that line. The fetcher redacts secrets from what it logs, so none reach the status or events.

Without a cache each worker pod downloads spec.model.url in its init container `fetch-model` (`init_state`): the
same phases from those containers' states, as the kubelet reports them. Ready once a pod's init container
exited 0 (or its worker started), Downloading while one runs (its log's last progress line), Failed while one
failed last (its termination message, classified as above; the kubelet retries it with back-off, so a later
attempt can still succeed), else Pending (no pod yet, or none has started downloading).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

PENDING, DOWNLOADING, READY, FAILED = "Pending", "Downloading", "Ready", "Failed"
NOT_FOUND, UNAUTHORIZED, NO_SPACE, DOWNLOAD_FAILED = "NotFound", "Unauthorized", "NoSpace", "DownloadFailed"
CANNOT_SPLIT = "CannotSplit"  # the model is there but does not split over resources.gpus tensor-parallel ranks
MAX_MESSAGE = 600
FETCH_CONTAINER = "fetch-model"  # the container that downloads (manifests/worker.py fetch_container)

# hetero_infer.progress.progress_line: "LABEL: 12.0 MB of 48.0 MB (25%), 3.0 MB/s, 4 s"
_PROGRESS = re.compile(r"(\d+(?:\.\d+)? [kMG]?B) of (\d+(?:\.\d+)? [kMG]?B) \((\d+)%\)(?:, (\d+(?:\.\d+)? [kMG]?B/s))?")
# hetero_infer.model_source._download_line: "downloading REF: N file(s), 16.1 GB into FOLDER"
_STARTING = re.compile(r"downloading \S+: (\d+) file\(s\), (\d+(?:\.\d+)? [kMG]?B) into")
# The fetch command's log format: "TIME LEVEL LOGGER: MESSAGE"
_LOG_ERROR = re.compile(r"\b(?:ERROR|CRITICAL) [\w.]+: (.*)$")
_NO_SPACE = re.compile(r"no space left on device|\[errno 28\]|enospc|disk quota exceeded|ephemeral.(?:local.)?storage",
                       re.IGNORECASE)
_UNAUTHORIZED = re.compile(r"access denied|not authorized|unauthorized|forbidden|no aws credentials|http 40[13]\b|"
                           r"invalidaccesskeyid|signaturedoesnotmatch", re.IGNORECASE)
# hetero_infer.model_source.check_tensor_split: "cannot split MODEL N ways: ..."
_CANNOT_SPLIT = re.compile(r"^cannot split \S+ \d+ ways: ")
_NOT_FOUND = re.compile(r"not found|no objects under|no such", re.IGNORECASE)


@dataclass(frozen=True)
class ModelState:
    """Where the download of one source and revision stands."""

    phase: str  # Pending | Downloading | Ready | Failed
    reason: str  # the ModelReady condition's reason: the phase, or for Failed the kind of failure
    message: str
    source: str = ""  # what is downloaded (spec.model.url, or the GGUF converted): status.model.url

    @property
    def ready(self) -> bool:
        return self.phase == READY


def failure_reason(line: str) -> str:
    """CannotSplit, NoSpace, Unauthorized, NotFound or DownloadFailed for a fetch's error line."""
    if _CANNOT_SPLIT.search(line):
        return CANNOT_SPLIT
    if _NO_SPACE.search(line):
        return NO_SPACE
    if "(HTTP 404)" in line:
        return NOT_FOUND
    if _UNAUTHORIZED.search(line):
        return UNAUTHORIZED
    if _NOT_FOUND.search(line):
        return NOT_FOUND
    return DOWNLOAD_FAILED


def error_line(text: str) -> str:
    """The line that says why, out of a termination message (the fetch's log tail): its last ERROR line's
    message, else its last non-empty line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        found = _LOG_ERROR.search(line)
        if found:
            return found.group(1)
    return lines[-1] if lines else ""


def download_progress(log: str) -> str | None:
    """'12.0 MB of 48.0 MB (25%), 3.0 MB/s' from the last progress line in a fetch's log tail (None: none yet)."""
    last = None
    for line in log.splitlines():
        found = _PROGRESS.search(line)
        if found:
            last = f"{found.group(1)} of {found.group(2)} ({found.group(3)}%)"
            last += f", {found.group(4)}" if found.group(4) else ""
        elif (starting := _STARTING.search(line)) and last is None:
            last = f"0 B of {starting.group(2)} (0%), {starting.group(1)} file(s)"
    return last


def _created(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("creationTimestamp") or "")


def _container_status(pod: Mapping[str, Any], key: str = "containerStatuses", name: str | None = None
                      ) -> Mapping[str, Any]:
    """A container's status from the pod's `key` list: the one called `name`, else the first."""
    statuses = [s for s in (pod.get("status") or {}).get(key) or [] if name is None or s.get("name") == name]
    return statuses[0] if statuses else {}


def _container_state(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return _container_status(pod).get("state") or {}


def _pod_failure(pod: Mapping[str, Any], terminated: Mapping[str, Any] | None = None) -> str:
    """Why a failed pod (or its container that ended as `terminated`) failed: the termination message's error
    line, else the kubelet's reason."""
    status = pod.get("status") or {}
    terminated = _container_state(pod).get("terminated") or {} if terminated is None else terminated
    line = error_line(str(terminated.get("message") or ""))
    if line:
        return line
    why = terminated.get("reason") or status.get("reason") or "Failed"
    detail = status.get("message") or (f"exit code {terminated['exitCode']}" if "exitCode" in terminated else "")
    return f"{why}: {detail}" if detail else str(why)


def _waiting(pod: Mapping[str, Any], state: Mapping[str, Any] | None = None) -> str:
    """Why a pod (or the container in `state`) has not started: the container's waiting reason, else the
    scheduler's."""
    waiting = (_container_state(pod) if state is None else state).get("waiting") or {}
    if waiting.get("reason"):
        return f"{waiting['reason']}: {waiting['message']}" if waiting.get("message") else str(waiting["reason"])
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return str(cond.get("message") or cond.get("reason") or "unschedulable")
    return "starting"


def _clip(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE - 3] + "..."


def model_state(url: str, job: Mapping[str, Any] | None, pods: Sequence[Mapping[str, Any]] = (), log: str = "",
                claim_missing: str | None = None) -> ModelState:
    """The phase of `url`'s download from its Job (None: not created yet), the Job's pods and the running pod's
    log tail; `claim_missing` names a cache claim that does not exist."""
    return dataclasses.replace(_phase(url, job, pods, log, claim_missing), source=url)


def _phase(url: str, job: Mapping[str, Any] | None, pods: Sequence[Mapping[str, Any]], log: str,
           claim_missing: str | None) -> ModelState:
    if claim_missing is not None:
        return ModelState(PENDING, PENDING, f"waiting for the PersistentVolumeClaim {claim_missing} "
                                            "(spec.model.cache.claimName): it does not exist")
    if job is None:
        return ModelState(PENDING, PENDING, f"creating the download Job for {url}")
    status = job.get("status") or {}
    conditions = {cd.get("type"): cd for cd in status.get("conditions") or [] if cd.get("status") == "True"}
    name = (job.get("metadata") or {}).get("name")
    if "Complete" in conditions or int(status.get("succeeded") or 0) > 0:
        return ModelState(READY, READY, f"{url} is in the cache")
    failed = sorted((p for p in pods if (p.get("status") or {}).get("phase") == "Failed"), key=_created)
    last_failure = _pod_failure(failed[-1]) if failed else ""
    if "Failed" in conditions:
        cond = conditions["Failed"]
        line = last_failure or str(cond.get("message") or cond.get("reason") or "the download Job failed")
        attempts = int(status.get("failed") or len(failed) or 1)
        return ModelState(FAILED, failure_reason(line), _clip(
            f"{line} (Job {name} gave up after {attempts} attempt(s); a spec that changes the Job replaces it, "
            "else delete the Job to retry once the cause is fixed)"))
    retrying = f" (after {int(status.get('failed') or len(failed))} failed attempt(s): {last_failure})" \
        if failed or status.get("failed") else ""
    live = sorted((p for p in pods if (p.get("status") or {}).get("phase") in ("Pending", "Running")), key=_created)
    if live and (live[-1].get("status") or {}).get("phase") == "Running":
        progress = download_progress(log)
        return ModelState(DOWNLOADING, DOWNLOADING, _clip(f"downloading {url}" + (f": {progress}" if progress else "")
                                                          + retrying))
    if live:
        return ModelState(PENDING, PENDING, _clip(f"the download pod for {url} is not running yet: "
                                                  f"{_waiting(live[-1])}{retrying}"))
    if retrying:
        return ModelState(PENDING, PENDING, _clip(f"waiting to retry {url}{retrying}"))
    return ModelState(PENDING, PENDING, f"waiting for the download Job {name} to start its pod")


def _fetch_status(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return _container_status(pod, "initContainerStatuses", FETCH_CONTAINER)


def _fetches(pod: Mapping[str, Any], url: str) -> bool:
    """Whether the pod's init container downloads `url` (in a rollout to another url, the old pods fetched theirs)."""
    return any(ct.get("name") == FETCH_CONTAINER and url in (ct.get("command") or [])
               for ct in (pod.get("spec") or {}).get("initContainers") or [])


def _fetched(pod: Mapping[str, Any]) -> bool:
    """The init container exited 0, or the worker container (which starts only after it) has run."""
    if (((_fetch_status(pod).get("state") or {}).get("terminated") or {}).get("exitCode")) == 0:
        return True
    worker = _container_status(pod)
    return any(k in (worker.get("state") or {}) for k in ("running", "terminated")) or \
        "terminated" in (worker.get("lastState") or {})


def _fetch_failure(pod: Mapping[str, Any]) -> str | None:
    """Why the pod's last download attempt failed (None: none did): the init container's termination with a
    non-zero exit code, now or as its last state while it backs off, or the pod's eviction."""
    init = _fetch_status(pod)
    state = init.get("state") or {}
    for terminated in (state.get("terminated"), (init.get("lastState") or {}).get("terminated")):
        if terminated and terminated.get("exitCode") != 0:
            return _pod_failure(pod, terminated)
    waiting = state.get("waiting") or {}
    if waiting.get("reason") == "CrashLoopBackOff":
        return _waiting(pod, state)
    if (pod.get("status") or {}).get("phase") == "Failed":
        return _pod_failure(pod, {})
    return None


def _downloaders(url: str, pods: Sequence[Mapping[str, Any]]) -> tuple[list[Mapping[str, Any]], bool,
                                                                           list[Mapping[str, Any]]]:
    """The pods that download `url` (oldest first), whether one has it, and those whose init container runs."""
    mine = sorted((p for p in pods if _fetches(p, url)), key=_created)
    running = [p for p in mine if "running" in (_fetch_status(p).get("state") or {})]
    return mine, any(_fetched(p) for p in mine), running


def fetching_pod(url: str, pods: Sequence[Mapping[str, Any]]) -> str | None:
    """The worker pod whose fetch-model log `init_state` reads progress from (None: a pod has the model, or none
    downloads it now)."""
    _, done, running = _downloaders(url, pods)
    return None if done or not running else str(running[-1]["metadata"]["name"])


def init_state(url: str, pods: Sequence[Mapping[str, Any]], log: str = "") -> ModelState:
    """Without spec.model.cache: the phase of `url`'s download by the worker pods' init containers (module
    docstring), from the pods and the log tail of `fetching_pod`'s init container."""
    return dataclasses.replace(_init_phase(url, pods, log), source=url)


def _init_phase(url: str, pods: Sequence[Mapping[str, Any]], log: str) -> ModelState:
    mine, done, running = _downloaders(url, pods)
    if done:
        return ModelState(READY, READY, f"a worker pod downloaded {url}")
    if running:
        pod = running[-1]
        progress = download_progress(log)
        before = _fetch_failure(pod)
        retrying = f" (after {int(_fetch_status(pod).get('restartCount') or 0)} failed attempt(s): {before})" \
            if before else ""
        return ModelState(DOWNLOADING, DOWNLOADING, _clip(
            f"downloading {url}" + (f": {progress}" if progress else "") + retrying))
    failed = [(p, line) for p in mine if (line := _fetch_failure(p))]
    if failed:
        pod, line = failed[-1]
        return ModelState(FAILED, failure_reason(line), _clip(
            f"{line} (pod {pod['metadata']['name']}, init container {FETCH_CONTAINER}; the kubelet retries it with "
            "back-off)"))
    if mine:
        return ModelState(PENDING, PENDING, _clip(f"the worker pod for {url} is not downloading yet: "
                                                  f"{_waiting(mine[-1], _fetch_status(mine[-1]).get('state') or {})}"))
    return ModelState(PENDING, PENDING, f"waiting for a worker pod to download {url}")


EVENTS = {PENDING: ("Normal", "ModelPending"), DOWNLOADING: ("Normal", "ModelDownloading"),
          READY: ("Normal", "ModelReady"), FAILED: ("Warning", "ModelFailed")}


def transition_event(previous_model: Mapping[str, Any] | None, previous_condition: Mapping[str, Any] | None,
                     url: str, state: ModelState) -> tuple[str, str, str] | None:
    """The event (type, reason, message) when the download's url, phase or failure reason changed since the status
    (`.status.model` and the ModelReady condition) was written; None when none did."""
    prev = previous_model or {}
    if (prev.get("url"), prev.get("phase"), (previous_condition or {}).get("reason")) == (url, state.phase,
                                                                                         state.reason):
        return None
    etype, reason = EVENTS[state.phase]
    return etype, reason, f"{state.reason}: {state.message}" if state.phase == FAILED else state.message
