"""kopf handlers: thin wrappers that call `reconcile` and report through kopf.

Triggers for a reconciliation pass of an InferenceDeployment:
- it is created, its spec changes, or the operator starts (resume);
- one of its children changes or disappears (so edits and deletions are undone at once);
- a periodic resync (catches anything missed while the operator was down).

In autoscaling mode `operator`, a worker per InferenceDeployment scrapes its workers every
`intervalSeconds` and sets `spec.replicas` (autoscale/loop.py); the spec change then reconciles as above.

No finalizer: the resync and the autoscaler run as plain tasks (loops.py), not as kopf timers or
daemons, and there is no delete handler. The children carry a controller ownerReference, so the
garbage collector deletes them with the InferenceDeployment, whether the operator runs or not;
deleting an InferenceDeployment or its namespace never waits for the operator. The finalizer name
stays configured so that kopf removes it from objects an older operator version marked.

The child watches ask the API server only for the operator's own objects (a label selector on the
watch request, and the same `labels=` filter on the handlers), so unrelated Deployments, Services,
PDBs and HPAs of the cluster never reach the operator.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import logging
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from hetero_infer.operator import constants as c
from hetero_infer.operator import kube, loops, peering
from hetero_infer.operator.autoscale import loop as autoscale_loop
from hetero_infer.operator.manifests import WorkerDefaults
from hetero_infer.operator.reconcile import Outcome, Recorder, reconcile

log = logging.getLogger("hetero_infer.operator")

RESOURCE = (c.GROUP, c.VERSION, c.PLURAL)
CHILD_RESOURCES = (
    ("apps", "v1", "deployments"),
    ("", "v1", "services"),
    ("policy", "v1", "poddisruptionbudgets"),
    ("autoscaling", "v2", "horizontalpodautoscalers"),
    ("batch", "v1", "jobs"),  # spec.model.cache: a finished download starts or rolls the workers at once
    ("", "v1", "persistentvolumeclaims"),
    ("", "v1", "configmaps"),  # spec.adapters: the list the workers follow
)
CHILD_SELECTOR = f"{c.LABEL_MANAGED_BY}={c.MANAGED_BY}"
RETRY_DELAY_SECONDS = 10.0


@dataclass(frozen=True)
class OperatorOptions:
    defaults: WorkerDefaults = field(default_factory=WorkerDefaults)
    resync_seconds: float = 60.0
    scrape_timeout: float = 2.0  # per worker /metrics request (autoscaling mode operator)
    client_factory: Callable[[], kube.Client] = kube.RestClient.from_environment
    peering: peering.Peering | None = None  # None: standalone (always active)


def make_settings(settings: kopf.OperatorSettings | None = None) -> kopf.OperatorSettings:
    """kopf settings: bookkeeping in annotations (the status schema is ours), quiet events, child watches
    limited to the operator's own objects on the server side."""
    settings = settings or kopf.OperatorSettings()
    # No handler needs a finalizer; kopf removes one by this name left by an older version.
    settings.persistence.finalizer = f"{c.GROUP}/operator"
    for group, _, plural in CHILD_RESOURCES:
        settings.watching.label_selectors[group, plural] = CHILD_SELECTOR
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=c.KOPF_ANNOTATION_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=c.KOPF_ANNOTATION_PREFIX, key="last-handled-configuration")
    settings.posting.level = logging.WARNING  # our own events say what happened; kopf adds only problems
    settings.execution.max_workers = 8
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    return settings


def event_recorder(body: Mapping[str, Any]) -> Recorder:
    def record(etype: str, reason: str, message: str) -> None:
        kopf.event(dict(body), type=etype, reason=reason, message=message[:1000])

    return record


_passes: dict[str, threading.Lock] = collections.defaultdict(threading.Lock)


def run_reconcile(body: Mapping[str, Any], client: kube.Client, options: OperatorOptions,
                  logger: logging.Logger | logging.LoggerAdapter) -> Outcome:
    """One pass over the object as the API server has it now, one pass at a time per object: kopf runs handlers
    in a thread pool, and a child's event, the spec's and the resync can coincide; a pass that saw a download Job
    still running must not write its status after one that saw it complete, and a pass that waited must not start
    from the status as it was before the others wrote theirs."""
    meta = body.get("metadata") or {}
    with _passes[meta.get("uid") or ""]:
        latest = client.get(kube.INFERENCE_DEPLOYMENT, meta.get("namespace") or "default", meta["name"])
        if latest is None or (latest.get("metadata") or {}).get("uid") != meta.get("uid"):
            return Outcome(status=None)  # deleted meanwhile (or another object by the same name)
        outcome = reconcile(latest, client, event_recorder(latest), options.defaults)
    for result in outcome.results:
        if result.action != "unchanged":
            logger.info(f"{result.action} {result.kind} {result.name} {result.detail}".rstrip())
    if outcome.invalid:
        logger.warning(f"invalid spec (Degraded): {'; '.join(outcome.invalid)}")
    if outcome.errors:
        raise kopf.TemporaryError("; ".join(outcome.errors), delay=RETRY_DELAY_SECONDS)
    return outcome


def connection_info(cfg: Any, trust_env: bool = False) -> kopf.ConnectionInfo:
    """kopf's credentials from a kubernetes client Configuration (the same ones RestClient uses)."""
    header = kube.authorization_header(cfg)
    parts = header.split(" ", 1) if header else []
    scheme, token = (None, None) if not parts else (None, parts[0]) if len(parts) == 1 else (parts[0], parts[1])
    return kopf.ConnectionInfo(
        server=cfg.host,
        ca_path=cfg.ssl_ca_cert,
        insecure=not cfg.verify_ssl,
        username=cfg.username or None,
        password=cfg.password or None,
        scheme=scheme,
        token=token,
        certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file,
        trust_env=trust_env,
    )


def _controller_ref(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for ref in (body.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == c.KIND and ref.get("apiVersion", "").startswith(f"{c.GROUP}/"):
            return ref
    return None


def sharing_a_download(job: Mapping[str, Any], bodies: Iterable[Mapping[str, Any]],
                       owner_uid: str) -> list[Mapping[str, Any]]:
    """The InferenceDeployments other than the Job's owner that may wait on a shared download Job (`job`: one
    with a model-cache claim): those in its namespace whose model is not Ready yet. A Job event reaches only its
    controller; these learn of it here (else only at the next resync)."""
    meta = job.get("metadata") or {}
    if c.MODEL_CACHE_CLAIM_ANNOTATION not in (meta.get("annotations") or {}):
        return []
    namespace = meta.get("namespace") or "default"
    return [b for b in bodies
            if (b.get("metadata") or {}).get("namespace", "default") == namespace
            and (b.get("metadata") or {}).get("uid") != owner_uid
            and not (b.get("metadata") or {}).get("deletionTimestamp")
            and ((b.get("status") or {}).get("model") or {}).get("phase") in ("Pending", "Downloading")]


def autoscaled_by_operator(spec: Mapping[str, Any], **_: Any) -> bool:
    """Whether the autoscaler task runs for a spec: while autoscaling is enabled in mode operator."""
    a = (spec or {}).get("autoscaling") or {}
    return a.get("enabled") is True and (a.get("mode") or "operator") == "operator"


async def resync_all(supervisor: loops.Supervisor, client: kube.Client, options: OperatorOptions,
                     is_active: Callable[[], Awaitable[bool]]) -> None:
    """One resync pass over every InferenceDeployment the operator knows (from its watch)."""
    if not await is_active():
        return
    for body in list(supervisor.bodies.values()):
        try:
            await asyncio.to_thread(run_reconcile, copy.deepcopy(body), client, options, log)
        except Exception as e:  # one resource's failure (a refused write, a timeout) does not stop the pass
            meta = body.get("metadata") or {}
            log.warning(f"resync of {meta.get('namespace')}/{meta.get('name')} failed: {e}")


def build_registry(options: OperatorOptions) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(settings: kopf.OperatorSettings, **_: Any) -> kopf.ConnectionInfo:
        # In-cluster service account or the kubeconfig, read anew whenever kopf (re)authenticates.
        return connection_info(kube.load_configuration(), trust_env=settings.networking.trust_env)

    @kopf.on.startup(registry=registry)
    async def startup(memo: kopf.Memo, logger: logging.Logger, **_: Any) -> None:
        client = memo.client = options.client_factory()

        async def is_active() -> bool:
            return await asyncio.to_thread(peering.active, client, options.peering)

        async def autoscale(stopper: loops.Stopper, body: dict[str, Any]) -> None:
            await autoscale_loop.run(stopper, body, client, event_recorder(body), options.scrape_timeout, active=is_active)

        # As a kopf filter would: the autoscaler runs while autoscaling is enabled in mode operator, and
        # stops when that changes or the object goes away.
        memo.loops = loops.Supervisor({"autoscaler": loops.Worker(
            lambda body: autoscaled_by_operator(body.get("spec") or {}), autoscale)})
        memo.resync = lambda: resync_all(memo.loops, client, options, is_active)
        logger.info(f"worker images: {options.defaults.image} (CPU), {options.defaults.gpu_image} (GPU)")

    @kopf.on.cleanup(registry=registry)
    async def shutdown(memo: kopf.Memo, **_: Any) -> None:
        if hasattr(memo, "loops"):
            await memo.loops.stop()

    @kopf.on.resume(*RESOURCE, registry=registry)
    @kopf.on.create(*RESOURCE, registry=registry)
    @kopf.on.update(*RESOURCE, field="spec", registry=registry)
    def apply_spec(body: kopf.Body, memo: kopf.Memo, logger: logging.Logger, **_: Any) -> None:
        run_reconcile(body, memo.client, options, logger)

    @kopf.on.event(*RESOURCE, registry=registry, id="loops")
    async def track(event: Mapping[str, Any], body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
        if hasattr(memo, "loops"):
            # Started here, not at startup: kopf's event posting (Kubernetes events) works only in
            # tasks started from resource handlers.
            memo.loops.start_periodic(lambda: options.resync_seconds, memo.resync)
            memo.loops.observe(event.get("type"), copy.deepcopy(dict(body)))
        if event.get("type") == "DELETED":
            _passes.pop((body.get("metadata") or {}).get("uid") or "", None)  # a pass still running keeps its own

    def child_changed(event: Mapping[str, Any], body: kopf.Body, memo: kopf.Memo, logger: logging.Logger,
                      **_: Any) -> None:
        if event.get("type") is None:
            return  # the initial listing: resume handlers cover it
        ref = _controller_ref(body)
        if ref is None or not hasattr(memo, "client"):
            return
        namespace = body.get("metadata", {}).get("namespace") or "default"
        owner = memo.client.get(kube.INFERENCE_DEPLOYMENT, namespace, ref["name"])
        if owner is None or owner["metadata"].get("uid") != ref.get("uid"):
            return
        if owner["metadata"].get("deletionTimestamp"):
            return
        if event.get("type") == "DELETED" and body.get("kind") != "Job":  # old revisions' Jobs are deleted on purpose
            kind = body.get("kind") or "child"
            event_recorder(owner)("Normal", "Restoring", f"{kind} {namespace}/{body['metadata']['name']} "
                                                         "was deleted; recreating it")
        waiting = []
        if body.get("kind") == "Job" and c.MODEL_CACHE_CLAIM_ANNOTATION in (body["metadata"].get("annotations") or {}):
            try:
                waiting = sharing_a_download(body, memo.client.list(kube.INFERENCE_DEPLOYMENT, namespace, ""),
                                             ref.get("uid"))
            except kube.ApiError as e:
                logger.warning(f"listing the InferenceDeployments of {namespace} failed: {e}")
        for target in (owner, *waiting):
            try:
                run_reconcile(target, memo.client, options, logger)
            except kopf.TemporaryError as e:
                logger.warning(f"reconciling {namespace}/{target['metadata']['name']} after a child change failed: {e}")

    for group, version, plural in CHILD_RESOURCES:
        kopf.on.event(group, version, plural, labels={c.LABEL_MANAGED_BY: c.MANAGED_BY},
                      registry=registry, id=f"child-{plural}")(child_changed)

    return registry
