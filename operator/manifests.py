"""Spec -> child manifests (pure): the worker Deployment, its Service, PodDisruptionBudget and HPA.

Every function here takes typed input and returns plain dicts ready for the API server. Optional
fields that the operator manages but the spec leaves unset are emitted as ``None``: a JSON merge
patch then removes them from a live object, and `children.apply` strips them on create.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

from hetero_infer.operator import constants as c
from hetero_infer.operator.spec import InferenceSpec

MODEL_MOUNT = "/models"
CACHE_DIR = "/var/cache/hetero-infer"
TERMINATION_GRACE_SECONDS = 60  # the worker drains in-flight requests on SIGTERM within this
PRESTOP_SLEEP_SECONDS = 10  # lets endpoints drop the pod before SIGTERM arrives
SHUTDOWN_GRACE_SECONDS = TERMINATION_GRACE_SECONDS - PRESTOP_SLEEP_SECONDS - 5  # worker's drain, within the pod's
WORKER_UID = 10001
SHM_SIZE = "1Gi"
DEFAULT_CPU = {False: "1", True: "4"}  # by "has a GPU"
DEFAULT_MEMORY = {False: "4Gi", True: "24Gi"}


@dataclass(frozen=True)
class WorkerDefaults:
    """Operator-wide settings that are not part of a spec (set by the operator's flags)."""

    image: str = c.DEFAULT_WORKER_IMAGE
    gpu_image: str = c.DEFAULT_WORKER_GPU_IMAGE
    image_pull_policy: str | None = None  # None: Kubernetes' default for the tag


@dataclass(frozen=True)
class Owner:
    """The InferenceDeployment the children belong to."""

    name: str
    namespace: str
    uid: str


@dataclass(frozen=True)
class Children:
    deployment: dict[str, Any]
    service: dict[str, Any]
    pdb: dict[str, Any]
    hpa: dict[str, Any] | None  # None: there must be no HPA (autoscaling off or not in hpa mode)

    def all(self) -> list[dict[str, Any]]:
        return [m for m in (self.deployment, self.service, self.pdb, self.hpa) if m is not None]


def selector_labels(name: str) -> dict[str, str]:
    return {c.LABEL_OWNER: name, c.LABEL_COMPONENT: c.COMPONENT_WORKER}


def selector_string(name: str) -> str:
    """`.status.selector` for the scale subresource (what an HPA counts pods with)."""
    return ",".join(f"{k}={v}" for k, v in sorted(selector_labels(name).items()))


def common_labels(name: str) -> dict[str, str]:
    return {
        c.LABEL_NAME: c.APP_NAME,
        c.LABEL_INSTANCE: name,
        c.LABEL_MANAGED_BY: c.MANAGED_BY,
        **selector_labels(name),
    }


def owner_reference(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": c.API_VERSION,
        "kind": c.KIND,
        "name": owner.name,
        "uid": owner.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _metadata(owner: Owner) -> dict[str, Any]:
    return {
        "name": owner.name,
        "namespace": owner.namespace,
        "labels": common_labels(owner.name),
        "ownerReferences": [owner_reference(owner)],
    }


def endpoint(owner: Owner, spec: InferenceSpec) -> str:
    """The in-cluster base URL of the OpenAI-compatible API behind the Service."""
    port = "" if spec.service.port == 80 else f":{spec.service.port}"
    return f"http://{owner.name}.{owner.namespace}.svc{port}/v1"


def model_path(spec: InferenceSpec) -> str | None:
    """`--model` for the worker; None lets the image's default model serve."""
    m = spec.model
    source = m.pvc or m.host_path
    if source is not None:
        return f"{MODEL_MOUNT}/{source.sub_path}" if source.sub_path else MODEL_MOUNT
    return m.path


def _fmt(value: float) -> str:
    return f"{value:g}"


def worker_args(spec: InferenceSpec) -> list[str]:
    """The `hetero-infer serve ...` command line (ARCHITECTURE.md: command line)."""
    gpu = spec.resources.gpus > 0
    args = [
        "serve", "--host", "0.0.0.0", "--port", str(c.WORKER_PORT),
        "--served-model-name", spec.model.name,
        "--executor", spec.executor,
        "--device", "cuda" if gpu else "cpu",
        "--shutdown-grace", str(SHUTDOWN_GRACE_SECONDS),
    ]
    path = model_path(spec)
    if path is not None:
        args += ["--model", path]
    e = spec.engine
    flags: list[tuple[str, Any]] = [
        ("--dtype", e.dtype),
        ("--quantization", e.quantization),
        ("--block-size", e.block_size),
        ("--max-num-seqs", e.max_num_seqs),
        ("--max-model-len", e.max_model_len),
        ("--max-num-batched-tokens", e.max_num_batched_tokens),
        ("--memory-threshold", e.memory_threshold),
        ("--gpu-memory-utilization", e.gpu_memory_utilization),
    ]
    for flag, value in flags:
        if value is not None:
            args += [flag, _fmt(value) if isinstance(value, float) else str(value)]
    return args


def command_line(spec: InferenceSpec) -> str:
    """The worker's command line as one shell-quoted string (for events and docs)."""
    return shlex.join(["hetero-infer", *worker_args(spec)])


def _probe(path: str, period: int, failures: int, timeout: int = 3) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": c.WORKER_PORT_NAME},
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "failureThreshold": failures,
    }


def _volumes(spec: InferenceSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    volumes: list[dict[str, Any]] = [
        {"name": "tmp", "emptyDir": {}},
        {"name": "cache", "emptyDir": {}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "cache", "mountPath": CACHE_DIR},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    m = spec.model
    if m.pvc is not None:
        volumes.append({"name": "model", "persistentVolumeClaim": {"claimName": m.pvc.claim_name,
                                                                   "readOnly": m.pvc.read_only}})
        mounts.append({"name": "model", "mountPath": MODEL_MOUNT, "readOnly": m.pvc.read_only})
    elif m.host_path is not None:
        volumes.append({"name": "model", "hostPath": {"path": m.host_path.path, "type": "Directory"}})
        mounts.append({"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True})
    return volumes, mounts


def _resources(spec: InferenceSpec) -> dict[str, Any]:
    gpu = spec.resources.gpus > 0
    cpu = spec.resources.cpu or DEFAULT_CPU[gpu]
    memory = spec.resources.memory or DEFAULT_MEMORY[gpu]
    requests: dict[str, Any] = {"cpu": cpu, "memory": memory}
    limits: dict[str, Any] = {"memory": memory}  # no CPU limit: throttling hurts latency more than it saves
    if gpu:
        requests[c.GPU_RESOURCE] = str(spec.resources.gpus)
        limits[c.GPU_RESOURCE] = str(spec.resources.gpus)
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
    user = {e["name"] for e in spec.env}
    return [e for e in ours if e["name"] not in user] + [dict(e) for e in spec.env]


def _tolerations(spec: InferenceSpec) -> list[dict[str, Any]] | None:
    tolerations = [dict(t) for t in spec.tolerations]
    if spec.resources.gpus > 0 and not any(t.get("key") == c.GPU_RESOURCE for t in tolerations):
        tolerations.append({"key": c.GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"})
    return tolerations or None


def rollout_strategy(spec: InferenceSpec) -> dict[str, Any]:
    """The Deployment strategy (spec.rollout, defaults by pool in spec.py); rollingUpdate None with Recreate
    so that a merge patch removes it (the API server rejects it beside Recreate)."""
    r = spec.rollout
    if r.strategy == "Recreate":
        return {"type": "Recreate", "rollingUpdate": None}
    return {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": r.max_surge, "maxUnavailable": r.max_unavailable}}


def deployment(owner: Owner, spec: InferenceSpec, defaults: WorkerDefaults) -> dict[str, Any]:
    gpu = spec.resources.gpus > 0
    image = spec.image or (defaults.gpu_image if gpu else defaults.image)
    volumes, mounts = _volumes(spec)
    container: dict[str, Any] = {
        "name": "worker",
        "image": image,
        "imagePullPolicy": defaults.image_pull_policy,
        "command": ["hetero-infer"],
        "args": worker_args(spec),
        "ports": [{"name": c.WORKER_PORT_NAME, "containerPort": c.WORKER_PORT, "protocol": "TCP"}],
        "env": _env(spec),
        "resources": _resources(spec),
        "volumeMounts": mounts,
        # Model loading can take minutes: the startup probe holds liveness off until the process serves.
        "startupProbe": _probe("/healthz", period=10, failures=90),
        "livenessProbe": _probe("/healthz", period=10, failures=3),
        "readinessProbe": _probe("/readyz", period=5, failures=2),
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRESTOP_SLEEP_SECONDS)]}}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    labels = common_labels(owner.name)
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "volumes": volumes,
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": WORKER_UID,
            "runAsGroup": WORKER_UID,
            "fsGroup": WORKER_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "nodeSelector": dict(spec.node_selector) or None,
        "tolerations": _tolerations(spec),
        "affinity": spec.affinity,
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(owner),
        "spec": {
            "replicas": spec.replicas,
            "selector": {"matchLabels": selector_labels(owner.name)},
            "strategy": rollout_strategy(spec),
            "revisionHistoryLimit": 3,
            "progressDeadlineSeconds": 1200,
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(c.WORKER_PORT),
                        "prometheus.io/path": "/metrics",
                        "kubectl.kubernetes.io/default-container": "worker",
                    },
                },
                "spec": pod_spec,
            },
        },
    }


def service(owner: Owner, spec: InferenceSpec) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(owner),
        "spec": {
            "type": spec.service.type,
            "selector": selector_labels(owner.name),
            "ports": [{
                "name": c.WORKER_PORT_NAME,
                "port": spec.service.port,
                "targetPort": c.WORKER_PORT_NAME,
                "protocol": "TCP",
            }],
        },
    }


def pod_disruption_budget(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(owner),
        "spec": {
            # One pod at a time: voluntary disruptions (drains, upgrades) never take all replicas at once.
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector_labels(owner.name)},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def quantity(value: float) -> str:
    """A metric target as a Kubernetes quantity: whole numbers plain, fractions in milli-units."""
    if float(value).is_integer():
        return str(int(value))
    return f"{round(value * 1000)}m"


def horizontal_pod_autoscaler(owner: Owner, spec: InferenceSpec) -> dict[str, Any]:
    """An autoscaling/v2 HPA that scales the InferenceDeployment itself through its scale subresource."""
    a = spec.autoscaling
    assert a.max_replicas is not None  # parse_spec guarantees it when autoscaling is enabled

    def pods_metric(name: str, target: float) -> dict[str, Any]:
        return {"type": "Pods", "pods": {"metric": {"name": name},
                                         "target": {"type": "AverageValue", "averageValue": quantity(target)}}}

    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": _metadata(owner),
        "spec": {
            "scaleTargetRef": {"apiVersion": c.API_VERSION, "kind": c.KIND, "name": owner.name},
            "minReplicas": a.min_replicas,
            "maxReplicas": a.max_replicas,
            "metrics": [
                pods_metric(c.METRIC_KV_CACHE_USAGE, a.target_kv_cache_usage),
                pods_metric(c.METRIC_REQUESTS_WAITING, a.target_queue_depth),
            ],
            "behavior": {
                "scaleUp": {"stabilizationWindowSeconds": a.scale_up_stabilization_seconds},
                "scaleDown": {"stabilizationWindowSeconds": a.scale_down_stabilization_seconds},
            },
        },
    }


def children(owner: Owner, spec: InferenceSpec, defaults: WorkerDefaults | None = None) -> Children:
    """Everything one InferenceDeployment owns, as the operator wants it to be."""
    defaults = defaults or WorkerDefaults()
    return Children(
        deployment=deployment(owner, spec, defaults),
        service=service(owner, spec),
        pdb=pod_disruption_budget(owner),
        hpa=horizontal_pod_autoscaler(owner, spec) if spec.autoscaling.hpa else None,
    )
