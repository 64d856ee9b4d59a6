"""The worker Deployment (`hetero-infer serve` over the model) and its PodDisruptionBudget.

Optional fields that the operator manages but the spec leaves unset are emitted as ``None``: a JSON merge
patch then removes them from a live object, and `children.apply` strips them on create.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import asdict
from decimal import Decimal
from typing import Any

from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.contracts.options import to_flags
from hetero_infer.contracts.server_options import ServerOptions
from hetero_infer.operator import constants as c
from hetero_infer.operator.diff import parse_quantity, spec_keys
from hetero_infer.operator.manifests.common import (
    WORKER_UID,
    Owner,
    WorkerDefaults,
    cache_claim_name,
    common_labels,
    image_pull_secrets,
    metadata,
    probe,
    scrape_annotations,
    selector_labels,
)
from hetero_infer.operator.spec import InferenceSpec, SpecError
from hetero_infer.operator.spec_overrides import DEFAULT_SHM_SIZE, ProbeTuning, shm_size
from hetero_infer.operator.spec_pod import PRESTOP_SLEEP_SECONDS, PodSpec

MODEL_MOUNT = "/models"
CACHE_DIR = "/var/cache/hetero-infer"
# Without spec.drainSeconds / terminationGracePeriodSeconds (operator/spec_pod.py): the worker drains running
# requests for 45 s after the preStop's 10 s, within a 60 s grace period.
SHUTDOWN_GRACE_SECONDS = PodSpec().drain_seconds
TERMINATION_GRACE_SECONDS = PodSpec().termination_grace_period_seconds
API_KEY_ENV = "HETERO_INFER_API_KEY"  # ServerOptions.api_key from the environment (spec.apiKey's Secret)
SHM_SIZE = DEFAULT_SHM_SIZE
DEFAULT_CPU = {False: "1", True: "4"}  # by "has a GPU"
DEFAULT_MEMORY = {False: "4Gi", True: "24Gi"}
# each GPU beyond the first: its tensor-parallel rank process (torch, its CUDA context, the weights' host staging)
# and its 1Gi of /dev/shm
RANK_MEMORY_GIB = 9


def cached_model_path(key: str) -> str:
    """Where the download Job links the model it fetched into the cache (`hetero-infer fetch --link`)."""
    return f"{MODEL_MOUNT}/{key}/model"


def downloads_per_pod(spec: InferenceSpec) -> bool:
    """A url without spec.model.cache: each pod's init container downloads it."""
    return spec.model.url is not None and spec.model.cache is None


def model_path(spec: InferenceSpec, cached: str | None = None) -> str | None:
    """`--model` for the worker; None lets the image's default model serve. `cached`: the cache folder (with
    spec.model.cache) whose model the workers serve."""
    m = spec.model
    if m.cache is not None:
        return cached_model_path(cached) if cached else None
    if m.url is not None:  # fetched by the init container into the download volume; read there offline
        return m.url
    source = m.pvc or m.host_path
    if source is not None:
        return f"{MODEL_MOUNT}/{source.sub_path}" if source.sub_path else MODEL_MOUNT
    return m.path


def worker_args(spec: InferenceSpec, cached: str | None = None) -> list[str]:
    """The `hetero-infer serve ...` command line (docs/contracts.md: command line), rendered from the option
    dataclasses `serve` parses (a spec field that names no option fails here, not in the pod); then
    spec.engine.extraArgs as given (checked against the same options in spec_overrides.py)."""
    gpu = spec.resources.gpus > 0
    return ["serve", *to_flags((ServerOptions, EngineConfig), {
        "host": "0.0.0.0",
        "port": c.WORKER_PORT,
        "served_model_name": spec.model.name,
        "executor": spec.executor,
        "device": "cuda" if gpu else "cpu",
        # several GPUs: the model split over them, one rank each (docs/tensor-parallel.md)
        "tensor_parallel_size": spec.resources.gpus if spec.resources.gpus > 1 else None,
        "shutdown_grace": spec.pod.drain_seconds,
        "model": model_path(spec, cached),
        **asdict(spec.engine),  # spec.engine's fields are EngineConfig's, unset ones None
        # spec.adapters: the list follows the ConfigMap (manifests/adapters.py), not the command line
        "enable_lora": True if spec.lora else None,
        "lora_modules_file": f"{c.ADAPTERS_CONFIG_DIR}/{c.ADAPTERS_KEY}" if spec.lora else None,
    }), *spec.overrides.extra_args]


def command_line(spec: InferenceSpec) -> str:
    """The worker's command line as one shell-quoted string (for events and docs)."""
    return shlex.join(["hetero-infer", *worker_args(spec)])


def _volumes(owner: Owner, spec: InferenceSpec, cached: str | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    volumes: list[dict[str, Any]] = [
        {"name": "tmp", "emptyDir": {}},
        {"name": "cache", "emptyDir": {}},
        {"name": "dshm", "emptyDir": {"medium": "Memory",
                                      "sizeLimit": shm_size(spec.overrides, spec.resources.gpus)}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "cache", "mountPath": CACHE_DIR},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    m = spec.model
    if m.cache is not None:  # filled by the download Job; the workers only read it, and only their model's folder
        volumes.append({"name": "model", "persistentVolumeClaim": {"claimName": cache_claim_name(owner, spec),
                                                                   "readOnly": True}})
        mounts.append({"name": "model", "mountPath": f"{MODEL_MOUNT}/{cached}" if cached else MODEL_MOUNT,
                       "subPath": cached, "readOnly": True})
    elif m.pvc is not None:
        volumes.append({"name": "model", "persistentVolumeClaim": {"claimName": m.pvc.claim_name,
                                                                   "readOnly": m.pvc.read_only}})
        mounts.append({"name": "model", "mountPath": MODEL_MOUNT, "readOnly": m.pvc.read_only})
    elif m.host_path is not None:
        volumes.append({"name": "model", "hostPath": {"path": m.host_path.path, "type": "Directory"}})
        mounts.append({"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True})
    elif m.url is not None:  # sized for the model: the download never evicts the pod for ephemeral storage
        volumes.append({"name": "model", "emptyDir": {"sizeLimit": m.download_size}})
        mounts.append({"name": "model", "mountPath": MODEL_MOUNT})
    if spec.lora:  # the adapters' list (optional: a pod may start before the operator wrote it) and their files
        volumes.append({"name": "lora-adapters", "configMap": {"name": owner.name + c.ADAPTERS_SUFFIX,
                                                               "optional": True}})
        mounts.append({"name": "lora-adapters", "mountPath": c.ADAPTERS_CONFIG_DIR, "readOnly": True})
        if m.cache is not None:  # the whole cache claim: every adapter's folder, present and future
            mounts.append({"name": "model", "mountPath": c.ADAPTERS_MOUNT, "readOnly": True})
    volumes += [dict(v) for v in spec.pod.volumes]
    mounts += [dict(m) for m in spec.pod.volume_mounts]
    return volumes, mounts


def worker_memory(spec: InferenceSpec) -> str:
    """spec.resources.memory (which holds the host KV tier: spec.py checks it does), else the default plus the tier."""
    if spec.resources.memory:
        return spec.resources.memory
    default = DEFAULT_MEMORY[spec.resources.gpus > 0]
    ranks = max(0, spec.resources.gpus - 1) * RANK_MEMORY_GIB
    tier = spec.engine.kv_offloading_size
    if not tier and not ranks:
        return default
    return f"{math.ceil((parse_quantity(default) + Decimal(str(tier or 0)) * 2**30 + ranks * 2**30) / 2**20)}Mi"


def _resources(spec: InferenceSpec) -> dict[str, Any]:
    gpu = spec.resources.gpus > 0
    cpu = spec.resources.cpu or DEFAULT_CPU[gpu]
    memory = worker_memory(spec)
    requests: dict[str, Any] = {"cpu": cpu, "memory": memory}
    if downloads_per_pod(spec):
        requests["ephemeral-storage"] = spec.model.download_size
    limits: dict[str, Any] = {"memory": memory}  # no CPU limit: throttling hurts latency more than it saves
    if gpu:
        requests[spec.resources.gpu_resource] = str(spec.resources.gpus)
        limits[spec.resources.gpu_resource] = str(spec.resources.gpus)
    return {"requests": requests, "limits": limits}


def _env(spec: InferenceSpec) -> list[dict[str, Any]]:
    ours = [
        {"name": "HOME", "value": "/tmp"},
        # Model conversions (e.g. a .gguf from a volume) and library caches go to a writable emptyDir.
        {"name": "HETERO_INFER_CACHE", "value": CACHE_DIR},
        {"name": "XDG_CACHE_HOME", "value": CACHE_DIR},
        {"name": "HF_HOME", "value": f"{CACHE_DIR}/huggingface"},
        {"name": "TRITON_CACHE_DIR", "value": f"{CACHE_DIR}/triton"},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
    ]
    if spec.api_key is not None:
        ours.append(spec.api_key.env(API_KEY_ENV))
    if downloads_per_pod(spec):
        ours = [e for e in ours if e["name"] != "HF_HOME"] + [
            *_download_env(), {"name": "HF_HUB_OFFLINE", "value": "1"}]  # the init container fetched it
    return _with_user_env(ours, spec)


def _with_user_env(ours: list[dict[str, Any]], spec: InferenceSpec) -> list[dict[str, Any]]:
    """`ours` with spec.env added; a variable spec.env also sets is the user's."""
    user = {e["name"] for e in spec.env}
    return [e for e in ours if e["name"] not in user] + [dict(e) for e in spec.env]


def _download_env(root: str = MODEL_MOUNT) -> list[dict[str, Any]]:
    """Where a fetched model lives (docs/models.md: caches), the same for the init container and the worker."""
    return [{"name": "HF_HOME", "value": f"{root}/huggingface"},
            {"name": "HETERO_INFER_MODEL_CACHE", "value": f"{root}/hetero-infer"}]


def credentials(spec: InferenceSpec) -> list[dict[str, Any]] | None:
    """The model's credentials Secret, whose keys are variable names (HF_TOKEN, AWS_ACCESS_KEY_ID, ...): as
    environment from the Secret, never inline in the pod spec."""
    secret = spec.model.credentials_secret
    return [{"secretRef": {"name": secret}}] if secret and spec.model.url is not None else None


def split_check(spec: InferenceSpec) -> tuple[str, ...]:
    """`hetero-infer fetch`'s option that checks, once the model is in place, that it splits over the worker's
    tensor-parallel ranks (resources.gpus > 1): a model that cannot fails the download with one line the operator
    reports as ModelReady False, reason CannotSplit (model_state.py), before any worker starts."""
    return ("--tensor-parallel-size", str(spec.resources.gpus)) if spec.resources.gpus > 1 else ()


def fetch_container(spec: InferenceSpec, image: str, defaults: WorkerDefaults,
                    security: dict[str, Any], cached: str | None = None, source: str | None = None,
                    options: tuple[str, ...] = ()) -> dict[str, Any]:
    """The container that downloads spec.model.url: the init container that fills the pod's model volume before
    the worker starts (an init container has no probes: a long download is never killed as a slow start; a
    failed one is retried by the kubelet with back-off), or, with `cached` (a cache folder), the download Job's,
    which fills that folder of the cache volume and links the model at cached_model_path (`source`: what it
    fetches, spec.model.url by default; `options`: more of `hetero-infer fetch`'s)."""
    root = f"{MODEL_MOUNT}/{cached}" if cached else MODEL_MOUNT
    link = ["--link", cached_model_path(cached)] if cached else []
    requests = {"cpu": "250m", "memory": "512Mi"}
    if not cached:  # the init container downloads into the pod's own storage
        requests["ephemeral-storage"] = spec.model.download_size
    return {
        "name": "fetch-model",
        "image": image,
        "imagePullPolicy": defaults.image_pull_policy,
        "command": ["hetero-infer", "fetch", source or spec.model.url, *link, *options],
        # spec.env too: a Hub mirror (HF_ENDPOINT) or an S3 endpoint set there is where the model comes from
        "env": _with_user_env([{"name": "HOME", "value": "/tmp"}, *_download_env(root),
                               {"name": "PYTHONUNBUFFERED", "value": "1"}], spec),
        "envFrom": credentials(spec),
        "resources": {"requests": requests, "limits": {"memory": "2Gi"}},
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}, {"name": "model", "mountPath": MODEL_MOUNT}],
        "terminationMessagePolicy": "FallbackToLogsOnError",  # the one-line reason shows in the pod's status
        "securityContext": security,
    }


def gpu_taints(resource: str) -> list[str]:
    """The NoSchedule taints GPU nodes commonly carry for `resource`: its own name (nvidia.com/gpu, amd.com/gpu),
    and nvidia.com/gpu for NVIDIA's other resources (MIG slices: the node is still tainted nvidia.com/gpu)."""
    return [resource] + ([c.GPU_RESOURCE] if resource.startswith("nvidia.com/") and resource != c.GPU_RESOURCE
                         else [])


def _tolerations(spec: InferenceSpec) -> list[dict[str, Any]] | None:
    tolerations = [dict(t) for t in spec.tolerations]
    if spec.resources.gpus > 0:
        for key in gpu_taints(spec.resources.gpu_resource):
            if not any(t.get("key") == key for t in tolerations):
                tolerations.append({"key": key, "operator": "Exists", "effect": "NoSchedule"})
    return tolerations or None


def rollout_strategy(spec: InferenceSpec) -> dict[str, Any]:
    """The Deployment strategy (spec.rollout, defaults by pool in spec.py); rollingUpdate None with Recreate
    so that a merge patch removes it (the API server rejects it beside Recreate)."""
    r = spec.rollout
    if r.strategy == "Recreate":
        return {"type": "Recreate", "rollingUpdate": None}
    return {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": r.max_surge, "maxUnavailable": r.max_unavailable}}


def worker_image(spec: InferenceSpec, defaults: WorkerDefaults) -> str:
    return spec.image or (defaults.gpu_image if spec.resources.gpus > 0 else defaults.image)


def container_security(spec: InferenceSpec | None = None) -> dict[str, Any]:
    """The "restricted" Pod Security Standard's container part; spec.securityContext's fields over it."""
    given = spec.overrides.security_context if spec is not None else None
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        **(given or {}),
    }


def pod_security(spec: InferenceSpec | None = None, fs_group: bool = True) -> dict[str, Any]:
    """The pods' security context: the image's user 10001 by default; spec.podSecurityContext instead when given
    (e.g. `{}` on OpenShift, whose restricted SCC assigns each namespace its own UIDs), with the restricted
    standard's runAsNonRoot and RuntimeDefault seccomp filled in where it says nothing."""
    given = spec.overrides.pod_security_context if spec is not None else None
    if given is not None:
        return {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}, **given}
    ours: dict[str, Any] = {"runAsNonRoot": True, "runAsUser": WORKER_UID, "runAsGroup": WORKER_UID}
    if fs_group:
        ours["fsGroup"] = WORKER_UID
    return {**ours, "seccompProfile": {"type": "RuntimeDefault"}}


def probes(spec: InferenceSpec) -> dict[str, Any]:
    """The worker's probes: startup holds liveness off while the model loads (startupTimeoutSeconds); liveness fails
    once the engine died (/healthz), readiness while loading, draining or failed (/readyz); spec.probes tunes them."""

    def tuned(path: str, t: ProbeTuning) -> dict[str, Any]:
        return probe(path, period=t.period_seconds, failures=t.failure_threshold, timeout=t.timeout_seconds)

    return {
        "startupProbe": probe("/healthz", period=10, failures=spec.pod.startup_failure_threshold),
        "livenessProbe": tuned("/healthz", spec.overrides.liveness),
        "readinessProbe": tuned("/readyz", spec.overrides.readiness),
    }


def apply_json_patches(spec: InferenceSpec, template: dict[str, Any]) -> dict[str, Any]:
    """spec.jsonPatches (RFC 6902) applied to the worker pod template; SpecError when one does not apply."""
    if not spec.overrides.json_patches:
        return template
    import jsonpatch

    try:
        return jsonpatch.apply_patch(template, list(spec.overrides.json_patches))
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as e:
        raise SpecError([f"spec.jsonPatches: does not apply to the worker pod template: {e}"]) from None


def deployment(owner: Owner, spec: InferenceSpec, defaults: WorkerDefaults, cached: str | None = None) -> dict[str, Any]:
    """The worker Deployment; with spec.model.cache, `cached` names the cache folder its pods serve from."""
    image = worker_image(spec, defaults)
    volumes, mounts = _volumes(owner, spec, cached)
    security = container_security(spec)
    container: dict[str, Any] = {
        "name": "worker",
        "image": image,
        "imagePullPolicy": defaults.image_pull_policy,
        "command": ["hetero-infer"],
        "args": worker_args(spec, cached),
        "ports": [{"name": c.WORKER_PORT_NAME, "containerPort": c.WORKER_PORT, "protocol": "TCP"}],
        "env": _env(spec),
        "envFrom": credentials(spec) if downloads_per_pod(spec) else None,  # with a cache, the Job alone has them
        "resources": _resources(spec),
        "volumeMounts": mounts,
        **probes(spec),
        # Kubernetes' own sleep action (1.30+): no `sleep` binary needed in the image
        "lifecycle": {"preStop": {"sleep": {"seconds": PRESTOP_SLEEP_SECONDS}}},
        "securityContext": security,
        # a worker stopped after its engine died exits 1 with the error last in its log: the pod's last state says it
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    pod = spec.pod
    pod_spec: dict[str, Any] = {
        "initContainers": [fetch_container(spec, image, defaults, dict(security), options=split_check(spec))]
        if downloads_per_pod(spec) else None,
        "containers": [container],
        "volumes": volumes,
        "terminationGracePeriodSeconds": pod.termination_grace_period_seconds,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": pod_security(spec),
        "nodeSelector": dict(spec.node_selector) or None,
        "tolerations": _tolerations(spec),
        "affinity": spec.affinity,
        # spec's pod-level fields, each only when given (a spec without them renders the pods as before)
        "imagePullSecrets": image_pull_secrets(spec, defaults),
        "serviceAccountName": pod.service_account_name,
        "priorityClassName": pod.priority_class_name,
        "runtimeClassName": pod.runtime_class_name,
        "topologySpreadConstraints": [dict(t) for t in pod.topology_spread_constraints] or None,
    }
    meta = metadata(owner)
    meta["annotations"] = {c.SPEC_KEYS_ANNOTATION: spec_keys({
        "spec.template.metadata.labels": pod.labels, "spec.template.metadata.annotations": pod.annotations,
        "spec.template.spec.nodeSelector": spec.node_selector})}
    if spec.model.cache is not None:
        meta["annotations"][c.MODEL_CACHE_KEY_ANNOTATION] = cached
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": spec.replicas,
            "selector": {"matchLabels": selector_labels(owner.name)},
            "strategy": rollout_strategy(spec),
            "revisionHistoryLimit": 3,
            "progressDeadlineSeconds": 1200,
            "template": apply_json_patches(spec, {
                "metadata": {
                    "labels": {**pod.labels, **common_labels(owner.name)},
                    "annotations": {**scrape_annotations(), "kubectl.kubernetes.io/default-container": "worker",
                                    **pod.annotations},
                },
                "spec": pod_spec,
            }),
        },
    }


def pod_disruption_budget(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(owner),
        "spec": {
            # One pod at a time: voluntary disruptions (drains, upgrades) never take all replicas at once.
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector_labels(owner.name)},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }
