"""One reconciliation pass: spec -> children on the server -> status (no kopf in here).

`reconcile` is idempotent: it creates what is missing, patches what drifted from the spec, removes
an HPA that the spec no longer asks for, and writes its status fields only when they changed
(status.py says which are its own; the write is retried on a conflict, kube.patch_status). It never
raises for a bad spec (that becomes a Degraded condition); API failures are reported in the outcome
so the caller can retry with backoff.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from hetero_infer.operator import constants as c
from hetero_infer.operator import kube
from hetero_infer.operator.diff import differences, merge_patch, owned_by, strip_none, with_fingerprint
from hetero_infer.operator.manifests import (
    Owner,
    WorkerDefaults,
    cache_claim,
    cache_claim_name,
    cache_key,
    children,
    download_job,
    endpoint,
    fetch_job_name,
    fetch_source,
    router_name,
    selector_string,
    stale_optional_children,
)
from hetero_infer.operator.manifests.adapters import adapters_config_map, adapters_name
from hetero_infer.operator.manifests.cache import adapter_source
from hetero_infer.operator.manifests.common import common_labels, selector_labels
from hetero_infer.operator.manifests.worker import downloads_per_pod
from hetero_infer.operator.model_state import (
    FETCH_CONTAINER,
    READY,
    ModelState,
    fetching_pod,
    init_state,
    model_state,
    transition_event,
)
from hetero_infer.operator.served_adapters import loaded_replicas, scrape_served
from hetero_infer.operator.spec import InferenceSpec, SpecError, parse_spec
from hetero_infer.operator.status import Observed, compute_status, invalid_spec_status, status_changed
from hetero_infer.operator.worker_pods import worker_failure

# record(type, reason, message): posts a Kubernetes event on the InferenceDeployment.
Recorder = Callable[[str, str, str], None]


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")  # noqa: UP017 (py3.10)


@dataclass
class ChildResult:
    kind: str
    name: str
    action: str  # created | updated | unchanged | conflict
    live: dict[str, Any] | None
    detail: str = ""


@dataclass
class Outcome:
    status: dict[str, Any] | None
    results: list[ChildResult] = field(default_factory=list)
    invalid: list[str] = field(default_factory=list)  # spec problems (no retry helps)
    errors: list[str] = field(default_factory=list)  # API failures (retry later)


_READ = object()


def apply_child(client: kube.Client, desired: Mapping[str, Any], owner_uid: str, live: Any = _READ) -> ChildResult:
    """Create the child or bring the fields the operator owns back to `desired` (`live`: the object as just read,
    when the caller has it)."""
    desired = with_fingerprint(desired)
    kind = kube.kind_of(desired)
    meta = desired["metadata"]
    ns, name = meta["namespace"], meta["name"]
    if live is _READ:
        live = client.get(kind, ns, name)
    if live is None:
        try:
            return ChildResult(kind.kind, name, "created", client.create(kind, ns, strip_none(desired)))
        except kube.ApiError as e:
            if not e.conflict:
                raise
            live = client.get(kind, ns, name)  # created concurrently: compare with that one
            if live is None:
                raise
    if not owned_by(live, owner_uid):
        return ChildResult(kind.kind, name, "conflict", live,
                           f"{kind.kind} {ns}/{name} exists but is not owned by this InferenceDeployment; "
                           "rename or delete it")
    changed = differences(desired, live)
    if not changed:
        return ChildResult(kind.kind, name, "unchanged", live)
    patched = client.patch(kind, ns, name, merge_patch(desired, live))
    shown = ", ".join(p.lstrip(".") for p in changed[:4]) + (" ..." if len(changed) > 4 else "")
    return ChildResult(kind.kind, name, "updated", patched, shown)


def delete_owned(client: kube.Client, kind: kube.Kind, namespace: str, name: str, owner_uid: str) -> bool:
    """Delete a child if it exists and belongs to the owner; True when something was deleted."""
    live = client.get(kind, namespace, name)
    if live is None or not owned_by(live, owner_uid):
        return False
    return client.delete(kind, namespace, name)


def record_result(record: Recorder, ns: str, result: ChildResult) -> None:
    if result.action == "created":
        record("Normal", "Created", f"created {result.kind} {ns}/{result.name}")
    elif result.action == "updated":
        record("Normal", "Updated", f"updated {result.kind} {ns}/{result.name} to match the spec "
                                    f"(changed: {result.detail})")
    elif result.action == "conflict":
        record("Warning", "ChildConflict", result.detail)


FETCH_LOG_LINES = 40  # of the running download container's log, for its last progress line


def _fetch_log(client: kube.Client, ns: str, pod: str) -> str:
    """The download container's last log lines ("" when it has none yet, or the pod just went: the phase says
    enough)."""
    try:
        return client.log(ns, pod, FETCH_CONTAINER, FETCH_LOG_LINES)
    except kube.ApiError:
        return ""


@dataclass
class CacheStep:
    """Where spec.model.cache stands after a pass: the download's state (None: not read, an API error) and the
    cache folder the workers serve from (the model's once it is in the cache, else the one they serve now)."""

    state: ModelState | None
    cached: str | None
    stale_job: str | None = None  # the download Job of the revision the workers leave


def _job_done(job: Mapping[str, Any], *how: str) -> bool:
    """Whether the Job finished (`how`: only these ways, of Complete and Failed)."""
    st = job.get("status") or {}
    how = how or ("Complete", "Failed")
    return ("Complete" in how and int(st.get("succeeded") or 0) > 0) or any(
        cd.get("type") in how and cd.get("status") == "True" for cd in st.get("conditions") or [])


def _job_pods(client: kube.Client, job: Mapping[str, Any]) -> tuple[list[dict[str, Any]], str]:
    """The Job's pods (by the selector the Job controller gave it) and the running one's log tail."""
    labels = ((job.get("spec") or {}).get("selector") or {}).get("matchLabels") or {
        "batch.kubernetes.io/job-name": job["metadata"]["name"]}
    ns = job["metadata"].get("namespace") or "default"
    pods = client.list(kube.POD, ns, ",".join(f"{k}={v}" for k, v in sorted(labels.items())))
    running = sorted((p for p in pods if (p.get("status") or {}).get("phase") == "Running"),
                     key=lambda p: str(p["metadata"].get("creationTimestamp") or ""))
    return pods, _fetch_log(client, ns, running[-1]["metadata"]["name"]) if running else ""


def sync_cache(client: kube.Client, owner: Owner, spec: InferenceSpec, defaults: WorkerDefaults,
               workers: Mapping[str, Any] | None, outcome: Outcome, record: Recorder) -> CacheStep:
    """spec.model.cache: the claim (when the operator creates it) and the model's download Job; `workers` is the
    live worker Deployment, whose annotation says which cache folder its pods read."""
    source, ns = fetch_source(spec, defaults).name, owner.namespace
    key = cache_key(source)
    annotations = ((workers or {}).get("metadata") or {}).get("annotations") or {}
    served = annotations.get(c.MODEL_CACHE_KEY_ANNOTATION) if workers and owned_by(workers, owner.uid) else None
    claim = cache_claim_name(owner, spec)
    try:
        claim_missing = None
        wanted_claim = cache_claim(owner, spec)
        if wanted_claim is not None:
            result = apply_child(client, wanted_claim, owner.uid)
            outcome.results.append(result)
            record_result(record, ns, result)
        elif client.get(kube.PVC, ns, claim) is None:
            claim_missing = claim
        job = None if claim_missing else _ensure_job(client, download_job(owner, spec, defaults, claim), owner,
                                                      outcome, record)
        # A failed Job's pods say why (their termination messages); a complete one's are of no interest.
        pods, log = _job_pods(client, job) if job is not None and not _job_done(job, "Complete") else ([], "")
        state = model_state(source, job, pods, log, claim_missing)
    except kube.ApiError as e:
        outcome.errors.append(f"model cache for {source}: {e}")
        return CacheStep(None, served)
    stale = fetch_job_name(owner, served, spec.model.cache.claim_name) if state.ready and served and served != key \
        else None
    return CacheStep(state, key if state.ready else served, stale)


def sync_adapters(client: kube.Client, owner: Owner, spec: InferenceSpec, defaults: WorkerDefaults,
                  outcome: Outcome, record: Recorder, had_adapters: bool) -> tuple[tuple[str, ModelState], ...] | None:
    """spec.adapters: a download Job per hf:// or s3:// adapter into the model cache (the Jobs of adapters the spec
    dropped deleted; their files stay), the ConfigMap that lists the ready ones to the workers
    (manifests/adapters.py), and each adapter's state for status.adapters; None without adapters or on an API error
    (in `outcome`). `had_adapters`: the status lists adapters (without spec.adapters, their Jobs and ConfigMap go)."""
    if spec.adapters is None and not had_adapters:
        return None
    ns, claim = owner.namespace, cache_claim_name(owner, spec)
    states: list[tuple[str, ModelState]] = []
    try:
        _drop_adapter_jobs(client, owner, spec, record)
        claim_missing = None
        if spec.model.cache is not None and spec.model.cache.claim_name and any(
                a.downloaded for a in spec.adapters or ()) and client.get(kube.PVC, ns, claim) is None:
            claim_missing = claim
        for adapter in spec.adapters or ():
            if not adapter.downloaded:  # on a claim the workers mount: nothing to fetch
                states.append((adapter.name, ModelState(READY, READY, "read from its claim", adapter.url)))
                continue
            job = None if claim_missing else _ensure_job(
                client, download_job(owner, spec, defaults or WorkerDefaults(), claim, adapter_source(adapter)),
                owner, outcome, record)
            pods, log = _job_pods(client, job) if job is not None and not _job_done(job, "Complete") else ([], "")
            states.append((adapter.name, model_state(adapter.url, job, pods, log, claim_missing)))
        config_map = adapters_config_map(owner, spec, [name for name, state in states if state.ready])
        if config_map is not None:
            result = apply_child(client, config_map, owner.uid)
            outcome.results.append(result)
            record_result(record, ns, result)
        elif delete_owned(client, kube.CONFIG_MAP, ns, adapters_name(owner.name), owner.uid):
            record("Normal", "Deleted", f"deleted ConfigMap {ns}/{adapters_name(owner.name)} (no spec.adapters)")
    except kube.ApiError as e:
        outcome.errors.append(f"LoRA adapters of {ns}/{owner.name}: {e}")
        return None
    return tuple(states) if spec.adapters is not None else None


def _drop_adapter_jobs(client: kube.Client, owner: Owner, spec: InferenceSpec, record: Recorder) -> None:
    """Delete this InferenceDeployment's adapter download Jobs that no adapter of the spec needs any more."""
    wanted = {cache_key(a.url) for a in spec.adapters or () if a.downloaded}
    selector = ",".join(f"{k}={v}" for k, v in sorted(common_labels(owner.name, c.COMPONENT_MODEL_CACHE).items()))
    for job in client.list(kube.JOB, owner.namespace, selector):
        annotations = job["metadata"].get("annotations") or {}
        if c.ADAPTER_ANNOTATION not in annotations or annotations.get(c.MODEL_CACHE_KEY_ANNOTATION) in wanted:
            continue
        name = job["metadata"]["name"]
        if delete_owned(client, kube.JOB, owner.namespace, name, owner.uid):
            record("Normal", "Deleted", f"deleted Job {owner.namespace}/{name} (the LoRA adapter "
                                        f"{annotations[c.ADAPTER_ANNOTATION]} left spec.adapters)")


def pod_downloads(client: kube.Client, owner: Owner, spec: InferenceSpec, outcome: Outcome) -> ModelState | None:
    """Without spec.model.cache: how far the worker pods' init containers got with spec.model.url, from the pods
    and the downloading one's log (None: an API error, in `outcome`)."""
    url, ns = spec.model.url, owner.namespace
    assert url is not None
    try:
        pods = client.list(kube.POD, ns, selector_string(owner.name))
        fetching = fetching_pod(url, pods)
        log = _fetch_log(client, ns, fetching) if fetching else ""
    except kube.ApiError as e:
        outcome.errors.append(f"worker pods of {ns}/{owner.name} (downloading {url}): {e}")
        return None
    return init_state(url, pods, log)


def _same_download(live: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """Whether `live` fetches the same source into the same folder of the same claim as `desired` would."""
    keys = (c.MODEL_CACHE_KEY_ANNOTATION, c.MODEL_CACHE_CLAIM_ANNOTATION)
    have = (live.get("metadata") or {}).get("annotations") or {}
    want = desired["metadata"]["annotations"]
    return all(have.get(k) is not None and have.get(k) == want.get(k) for k in keys)


def _ensure_job(client: kube.Client, desired: Mapping[str, Any], owner: Owner, outcome: Outcome,
                record: Recorder) -> dict[str, Any] | None:
    """The download Job as it is: created when missing; one whose spec changed (a Job's pod template is
    immutable) replaced unless it completed, so that a new credentials Secret or image, or resources.gpus that the
    model splits over (after CannotSplit), gets a fresh attempt, a failed Job's too."""
    desired = with_fingerprint(desired)
    name, ns = desired["metadata"]["name"], owner.namespace
    live = client.get(kube.JOB, ns, name)
    if live is not None and not owned_by(live, owner.uid) and _same_download(live, desired):
        return live  # another InferenceDeployment's Job fills this folder of the shared claim: wait on it
    if live is not None and not owned_by(live, owner.uid):
        result = ChildResult("Job", name, "conflict", live, f"Job {ns}/{name} exists but is not owned by this "
                                                             "InferenceDeployment; rename or delete it")
        outcome.results.append(result)
        record("Warning", "ChildConflict", result.detail)
        return None
    if live is not None and not _job_done(live, "Complete") and differences(desired["metadata"]["annotations"],
                                                                  live["metadata"].get("annotations") or {}):
        client.delete(kube.JOB, ns, name)
        record("Normal", "Replaced", f"deleted the download Job {ns}/{name}: its spec changed")
        live = None
    if live is None:
        try:
            live = client.create(kube.JOB, ns, strip_none(desired))
        except kube.ApiError as e:
            if e.conflict:  # the replaced one is still going: the next pass creates it
                return None
            raise
        outcome.results.append(ChildResult("Job", name, "created", live))
        record("Normal", "Created", f"created Job {ns}/{name} (downloads "
                                    f"{desired['metadata']['annotations'][c.MODEL_URL_ANNOTATION]})")
    return live


def _identity(body: Mapping[str, Any]) -> tuple[str, str, str, int | None]:
    meta = body.get("metadata") or {}
    return meta["name"], meta.get("namespace") or "default", meta.get("uid") or "", meta.get("generation")


def write_status(client: kube.Client, body: Mapping[str, Any],
                 status_for: Callable[[Mapping[str, Any]], dict[str, Any]]) -> dict[str, Any] | None:
    """Write `status_for(previous status)` over the object's latest version (kube.patch_status); the status
    written, or None when nothing was.

    Only while the spec is the one this pass reconciled: after a spec change, the pass for the
    new generation writes the status.
    """
    generation = _identity(body)[3]

    def compute(latest: Mapping[str, Any]) -> dict[str, Any] | None:
        if (latest.get("metadata") or {}).get("generation") != generation:
            return None
        previous = latest.get("status") or {}
        status = status_for(previous)
        return status if status_changed(previous, status) else None

    return kube.patch_status(client, kube.INFERENCE_DEPLOYMENT, body, compute)


def reconcile(body: Mapping[str, Any], client: kube.Client, record: Recorder,
              defaults: WorkerDefaults | None = None, now: str | None = None) -> Outcome:
    """Make the children match the InferenceDeployment `body` and refresh its status."""
    now = now or utc_now()
    name, ns, uid, generation = _identity(body)
    previous = body.get("status") or {}
    selector = selector_string(name)

    def rejected(e: SpecError) -> Outcome:
        def invalid(prev: Mapping[str, Any]) -> dict[str, Any]:
            return invalid_spec_status(previous=prev, generation=generation, problems=e.problems,
                                       selector=selector, now=now)

        status = invalid(previous)
        if status_changed(previous, status):
            record("Warning", "InvalidSpec", f"spec rejected, children left as they are: {e}")
            write_status(client, body, invalid)
        return Outcome(status=status, invalid=e.problems)

    try:
        spec = parse_spec(body.get("spec"), name=name)
        children(Owner(name, ns, uid), spec, defaults, "-")  # what only rendering finds (spec.jsonPatches)
    except SpecError as e:
        return rejected(e)

    owner = Owner(name, ns, uid)
    outcome = Outcome(status=None)
    live: dict[tuple[str, str], dict[str, Any] | None] = {}
    workers_live: Any = _READ
    cache = None
    if spec.model.cache is not None:
        try:
            workers_live = client.get(kube.DEPLOYMENT, ns, name)
        except kube.ApiError as e:
            outcome.errors.append(f"Deployment {ns}/{name}: {e}")
            return _finish(client, record, body, spec, owner, outcome, live, set(), None, previous, now)
        defaults = defaults or WorkerDefaults()
        cache = sync_cache(client, owner, spec, defaults, workers_live, outcome, record)
    wanted = children(owner, spec, defaults, cache.cached if cache else None)
    if wanted.deployment is None and workers_live is not None and owned_by(workers_live, uid):
        live["Deployment", name] = workers_live  # an earlier Deployment serves on until the model is in the cache
    # The Service users call records which optional children (router, InferencePool) were rendered: those the
    # spec dropped are deleted before the Service is switched, so a failed deletion is retried next pass.
    service_live: Any = _READ
    skip_service = False
    try:
        service_live = client.get(kube.SERVICE, ns, name)
        owned = service_live if service_live is not None and owned_by(service_live, uid) else None
        for kind_name, child in stale_optional_children(owned, wanted):
            if delete_owned(client, kube.KINDS_BY_NAME[kind_name], ns, child, uid):
                record("Normal", "Deleted", f"deleted {kind_name} {ns}/{child} (no longer in the spec)")
    except kube.ApiError as e:
        outcome.errors.append(f"removing children the spec dropped in {ns}: {e}")
        skip_service = True
    for manifest in wanted.all():
        if manifest is wanted.service and skip_service:
            continue
        known = service_live if manifest is wanted.service else workers_live if manifest is wanted.deployment \
            else _READ
        try:
            result = apply_child(client, manifest, uid, known)
        except kube.ApiError as e:
            outcome.errors.append(f"{manifest['kind']} {ns}/{manifest['metadata']['name']}: {e}")
            continue
        outcome.results.append(result)
        live[result.kind, result.name] = result.live
        record_result(record, ns, result)
    if cache is not None and cache.stale_job and live.get(("Deployment", name)) is not None:
        try:  # the workers moved to the new revision: its predecessor's Job is done with (its files stay)
            if delete_owned(client, kube.JOB, ns, cache.stale_job, uid):
                record("Normal", "Deleted", f"deleted Job {ns}/{cache.stale_job} (the workers left its revision)")
        except kube.ApiError as e:
            outcome.errors.append(f"Job {ns}/{cache.stale_job}: {e}")
    if wanted.router is not None and wanted.router.pdb is None:
        try:
            if delete_owned(client, kube.PDB, ns, router_name(name), uid):
                record("Normal", "Deleted", f"deleted PodDisruptionBudget {ns}/{router_name(name)} (one router "
                                            "replica: a budget cannot keep it up through a drain)")
        except kube.ApiError as e:
            outcome.errors.append(f"PodDisruptionBudget {ns}/{router_name(name)}: {e}")
    if wanted.hpa is None:
        try:
            if delete_owned(client, kube.HPA, ns, name, uid):
                record("Normal", "Deleted", f"deleted HorizontalPodAutoscaler {ns}/{name} "
                                            "(autoscaling is off or not in hpa mode)")
        except kube.ApiError as e:
            outcome.errors.append(f"HorizontalPodAutoscaler {ns}/{name}: {e}")

    model = cache.state if cache else pod_downloads(client, owner, spec, outcome) if downloads_per_pod(spec) else None
    adapters = sync_adapters(client, owner, spec, defaults or WorkerDefaults(), outcome, record,
                             previous.get("adapters") is not None)
    workers = live.get(("Deployment", name))
    workers = workers if workers and owned_by(workers, uid) else None
    failure = workers_failing(client, owner, spec, workers, outcome)
    loaded = adapters_loaded(client, owner, [n for n, _ in adapters or ()], workers, outcome)
    return _finish(client, record, body, spec, owner, outcome, live,
                   {router_name(name)} if wanted.router else set(), model, previous, now, adapters, failure, loaded)


def adapters_loaded(client: kube.Client, owner: Owner, adapters: list[str], workers: Mapping[str, Any] | None,
                    outcome: Outcome) -> dict[str, int] | None:
    """spec.adapters: how many ready worker pods serve each adapter (served_adapters.py: their /metrics, read at
    once); None without adapters or when the pods could not be listed. The pods are read only while the worker
    Deployment has ready replicas."""
    if not adapters:
        return None
    if not int(((workers or {}).get("status") or {}).get("readyReplicas") or 0):
        return loaded_replicas(adapters, [])
    try:
        pods = client.list(kube.POD, owner.namespace, selector_string(owner.name))
    except kube.ApiError as e:
        outcome.errors.append(f"worker pods of {owner.namespace}/{owner.name}: {e}")
        return None
    return loaded_replicas(adapters, scrape_served(pods, selector_labels(owner.name)))


def workers_failing(client: kube.Client, owner: Owner, spec: InferenceSpec, workers: Mapping[str, Any] | None,
                    outcome: Outcome) -> str | None:
    """While the worker Deployment has fewer ready replicas than the spec asks for: why a worker pod exited
    (worker_pods.worker_failure; a worker that refuses to start says why last). The pods are read only then."""
    ready = int(((workers or {}).get("status") or {}).get("readyReplicas") or 0)
    if workers is None or spec.replicas == 0 or ready >= spec.replicas:
        return None
    try:
        return worker_failure(client.list(kube.POD, owner.namespace, selector_string(owner.name)))
    except kube.ApiError as e:
        outcome.errors.append(f"worker pods of {owner.namespace}/{owner.name}: {e}")
        return None


def _model_event(record: Recorder, previous: Mapping[str, Any], state: ModelState) -> None:
    before = next((cd for cd in previous.get("conditions") or [] if cd.get("type") == c.COND_MODEL_READY), None)
    event = transition_event(previous.get("model"), before, state.source, state)
    if event is not None:
        record(*event)


def _finish(client: kube.Client, record: Recorder, body: Mapping[str, Any], spec: InferenceSpec, owner: Owner,
            outcome: Outcome, live: Mapping[tuple[str, str], dict[str, Any] | None], routers: set[str],
            model: ModelState | None, previous: Mapping[str, Any], now: str,
            adapters: tuple[tuple[str, ModelState], ...] | None = None,
            failure: str | None = None, loaded: Mapping[str, int] | None = None) -> Outcome:
    """The status from what the pass saw, written when it changed."""
    name, generation = owner.name, _identity(body)[3]
    conflicts = [r.detail for r in outcome.results if r.action == "conflict"]
    foreign = {(r.kind, r.name) for r in outcome.results if r.action == "conflict"}

    def owned(kind: str, child: str) -> dict[str, Any] | None:
        return None if (kind, child) in foreign else live.get((kind, child))

    observed = Observed(
        generation=generation,
        deployment=owned("Deployment", name),
        router=owned("Deployment", router_name(name)) if router_name(name) in routers else None,
        hpa=live.get(("HorizontalPodAutoscaler", name)),
        problems=conflicts + outcome.errors,
        problem_reason="ChildConflict" if conflicts else "ReconcileFailed",
        model=model,
        adapters=adapters,
        adapters_loaded=loaded,
        worker_failure=failure,
    )
    selector = selector_string(name)

    over: list[Mapping[str, Any]] = []  # the status each computation started from: the last one was written over

    def current(prev: Mapping[str, Any]) -> dict[str, Any]:
        over.append(prev)
        return compute_status(spec=spec, observed=observed, previous=prev, selector=selector,
                              endpoint=endpoint(owner, spec), now=now)

    outcome.status = current(previous)
    if status_changed(previous, outcome.status) and write_status(client, body, current) is not None and model:
        # An event for the model's transition as written: of passes that race, only the one that wrote it posts.
        _model_event(record, over[-1], model)
    return outcome
