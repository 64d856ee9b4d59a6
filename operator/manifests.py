"""Spec -> child manifests (pure): the worker Deployment, its Service, PodDisruptionBudget and HPA; with
spec.router the router's Deployment, ServiceAccount, Role and RoleBinding and the worker Service it discovers
workers through (the Service users call then selects the router); with spec.router.inferencePool an
InferencePool (Gateway API Inference Extension) over the workers.

Every function here takes typed input and returns plain dicts ready for the API server. Optional
fields that the operator manages but the spec leaves unset are emitted as ``None``: a JSON merge
patch then removes them from a live object, and `children.apply` strips them on create.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

from hetero_infer.operator import constants as c
from hetero_infer.operator.spec import (
    DEFAULT_CORS_HEADERS,
    DEFAULT_CORS_METHODS,
    DEFAULT_ROUTER_TOKENIZER,
    WORKERS_SERVICE_SUFFIX,
    InferenceSpec,
    RouterSpec,
)

MODEL_MOUNT = "/models"
CACHE_DIR = "/var/cache/hetero-infer"
TERMINATION_GRACE_SECONDS = 60  # the worker drains in-flight requests on SIGTERM within this
PRESTOP_SLEEP_SECONDS = 10  # lets endpoints drop the pod before SIGTERM arrives
SHUTDOWN_GRACE_SECONDS = TERMINATION_GRACE_SECONDS - PRESTOP_SLEEP_SECONDS - 5  # worker's drain, within the pod's
WORKER_UID = 10001
SHM_SIZE = "1Gi"
DEFAULT_CPU = {False: "1", True: "4"}  # by "has a GPU"
DEFAULT_MEMORY = {False: "4Gi", True: "24Gi"}
ROUTER_CPU = "500m"
ROUTER_MEMORY = "512Mi"
ROUTER_SUFFIX = "-router"
INFERENCE_POOL_API_VERSION = "inference.networking.k8s.io/v1"


@dataclass(frozen=True)
class WorkerDefaults:
    """Operator-wide settings that are not part of a spec (set by the operator's flags)."""

    image: str = c.DEFAULT_WORKER_IMAGE
    gpu_image: str = c.DEFAULT_WORKER_GPU_IMAGE
    image_pull_policy: str | None = None  # None: Kubernetes' default for the tag
    router_image: str = c.DEFAULT_ROUTER_IMAGE


@dataclass(frozen=True)
class Owner:
    """The InferenceDeployment the children belong to."""

    name: str
    namespace: str
    uid: str


@dataclass(frozen=True)
class RouterChildren:
    """What spec.router adds: the router pods, their discovery RBAC and the worker Service they watch."""

    deployment: dict[str, Any]
    workers_service: dict[str, Any]
    service_account: dict[str, Any]
    role: dict[str, Any]
    role_binding: dict[str, Any]

    def all(self) -> list[dict[str, Any]]:
        # RBAC before the pods that use it.
        return [self.service_account, self.role, self.role_binding, self.workers_service, self.deployment]


@dataclass(frozen=True)
class Children:
    deployment: dict[str, Any]
    service: dict[str, Any]  # the Service users call: the router's with spec.router, else the workers'
    pdb: dict[str, Any]
    hpa: dict[str, Any] | None  # None: there must be no HPA (autoscaling off or not in hpa mode)
    router: RouterChildren | None = None  # None: there must be no router children
    inference_pool: dict[str, Any] | None = None

    def all(self) -> list[dict[str, Any]]:
        router = self.router.all() if self.router is not None else []
        return [m for m in (*router, self.deployment, self.service, self.pdb, self.hpa, self.inference_pool)
                if m is not None]


def selector_labels(name: str, component: str = c.COMPONENT_WORKER) -> dict[str, str]:
    return {c.LABEL_OWNER: name, c.LABEL_COMPONENT: component}


def router_name(name: str) -> str:
    """The router's Deployment, ServiceAccount, Role and RoleBinding."""
    return name + ROUTER_SUFFIX


def workers_service_name(name: str) -> str:
    """With the router: the Service over the worker pods, whose EndpointSlices the router watches."""
    return name + WORKERS_SERVICE_SUFFIX


def router_child_names(name: str) -> list[tuple[str, str]]:
    """(kind, name) of every child spec.router adds, for deleting them when the router is turned off."""
    r = router_name(name)
    return [("Deployment", r), ("Service", workers_service_name(name)), ("RoleBinding", r), ("Role", r),
            ("ServiceAccount", r)]


def stale_optional_children(live_service: dict[str, Any] | None, wanted: Children) -> list[tuple[str, str]]:
    """(kind, name) of the optional children the live Service says were rendered and the spec no longer wants."""
    if live_service is None:
        return []
    meta = live_service.get("metadata") or {}
    had = set(((meta.get("annotations") or {}).get(c.OPTIONAL_CHILDREN_ANNOTATION) or "").split(","))
    name = meta.get("name") or ""
    stale = router_child_names(name) if c.OPTIONAL_ROUTER in had and wanted.router is None else []
    if c.OPTIONAL_INFERENCE_POOL in had and wanted.inference_pool is None:
        stale.append(("InferencePool", name))
    return stale


def selector_string(name: str) -> str:
    """`.status.selector` for the scale subresource (what an HPA counts pods with)."""
    return ",".join(f"{k}={v}" for k, v in sorted(selector_labels(name).items()))


def common_labels(name: str, component: str = c.COMPONENT_WORKER) -> dict[str, str]:
    return {
        c.LABEL_NAME: c.APP_NAME,
        c.LABEL_INSTANCE: name,
        c.LABEL_MANAGED_BY: c.MANAGED_BY,
        **selector_labels(name, component),
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


def _scrape_annotations() -> dict[str, str]:
    """Prometheus' pod annotations: workers and routers both serve /metrics on the same port."""
    return {"prometheus.io/scrape": "true", "prometheus.io/port": str(c.WORKER_PORT), "prometheus.io/path": "/metrics"}


def _metadata(owner: Owner, name: str | None = None, component: str = c.COMPONENT_WORKER) -> dict[str, Any]:
    return {
        "name": name or owner.name,
        "namespace": owner.namespace,
        "labels": common_labels(owner.name, component),
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
                    "annotations": {**_scrape_annotations(), "kubectl.kubernetes.io/default-container": "worker"},
                },
                "spec": pod_spec,
            },
        },
    }


def service(owner: Owner, spec: InferenceSpec) -> dict[str, Any]:
    """The Service users call (spec.service): it selects the router pods with spec.router, else the workers."""
    component = c.COMPONENT_ROUTER if spec.router.enabled else c.COMPONENT_WORKER
    optional = [c.OPTIONAL_ROUTER] if spec.router.enabled else []
    optional += [c.OPTIONAL_INFERENCE_POOL] if spec.router.inference_pool is not None else []
    metadata = _metadata(owner, component=component)
    metadata["annotations"] = {c.OPTIONAL_CHILDREN_ANNOTATION: ",".join(optional)} if optional else None
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata,
        "spec": {
            "type": spec.service.type,
            "selector": selector_labels(owner.name, component),
            "ports": [{
                "name": c.WORKER_PORT_NAME,
                "port": spec.service.port,
                "targetPort": c.WORKER_PORT_NAME,
                "protocol": "TCP",
            }],
        },
    }


def workers_service(owner: Owner) -> dict[str, Any]:
    """Headless Service over the worker pods: its EndpointSlices are what the router discovers workers from
    (ready endpoints only), and what a ServiceMonitor scrapes the workers' /metrics through."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(owner, workers_service_name(owner.name)),
        "spec": {
            "type": "ClusterIP",
            "clusterIP": "None",
            "selector": selector_labels(owner.name),
            "ports": [{"name": c.WORKER_PORT_NAME, "port": c.WORKER_PORT, "targetPort": c.WORKER_PORT_NAME,
                       "protocol": "TCP"}],
        },
    }


def router_args(owner: Owner, spec: InferenceSpec) -> list[str]:
    """The `hetero-infer router ...` command line: workers discovered from the worker Service's EndpointSlices."""
    r = spec.router
    args = [
        "router", "--host", "0.0.0.0", "--port", str(c.WORKER_PORT),
        "--policy", r.policy,
        "--discover-service", workers_service_name(owner.name), "--namespace", owner.namespace,
        "--hold-timeout-s", str(r.hold_timeout_seconds),
    ]
    if spec.engine.block_size is not None:
        args += ["--block-size", str(spec.engine.block_size)]
    return args + router_options_args(r)


def router_options_args(r: RouterSpec) -> list[str]:
    """spec.router.cors and .tokenizer as flags, only where they differ from the router's defaults: a spec
    without them (or with the defaults written out, as the API server fills them) renders the same
    Deployment as before they existed, so it does not roll."""
    cors = r.cors
    args = [arg for origin in cors.allowed_origins for arg in ("--allowed-origins", origin)]
    if cors.allowed_methods != DEFAULT_CORS_METHODS:
        args += [arg for method in cors.allowed_methods for arg in ("--allowed-methods", method)]
    if cors.allowed_headers != DEFAULT_CORS_HEADERS:
        args += [arg for header in cors.allowed_headers for arg in ("--allowed-headers", header)]
    if cors.allow_credentials:
        args.append("--allow-credentials")
    if r.tokenizer != DEFAULT_ROUTER_TOKENIZER:
        args += ["--tokenizer", r.tokenizer]
    return args


def router_deployment(owner: Owner, spec: InferenceSpec, defaults: WorkerDefaults) -> dict[str, Any]:
    r = spec.router
    name = router_name(owner.name)
    cpu, memory = r.cpu or ROUTER_CPU, r.memory or ROUTER_MEMORY
    container: dict[str, Any] = {
        "name": "router",
        "image": r.image or defaults.router_image,
        "imagePullPolicy": defaults.image_pull_policy,
        "command": ["hetero-infer"],
        "args": router_args(owner, spec),
        "ports": [{"name": c.WORKER_PORT_NAME, "containerPort": c.WORKER_PORT, "protocol": "TCP"}],
        "env": [{"name": "HOME", "value": "/tmp"}, {"name": "PYTHONUNBUFFERED", "value": "1"}],
        "resources": {"requests": {"cpu": cpu, "memory": memory}, "limits": {"memory": memory}},
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
        "livenessProbe": _probe("/healthz", period=10, failures=3),
        # Ready whenever it runs, with or without a ready worker: requests are held, not refused.
        "readinessProbe": _probe("/readyz", period=5, failures=2),
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    labels = common_labels(owner.name, c.COMPONENT_ROUTER)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(owner, name, c.COMPONENT_ROUTER),
        "spec": {
            "replicas": r.replicas,
            "selector": {"matchLabels": selector_labels(owner.name, c.COMPONENT_ROUTER)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "revisionHistoryLimit": 3,
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": _scrape_annotations(),
                },
                "spec": {
                    "serviceAccountName": name,
                    "automountServiceAccountToken": True,  # it watches EndpointSlices
                    "enableServiceLinks": False,
                    "containers": [container],
                    "volumes": [{"name": "tmp", "emptyDir": {}}],
                    "terminationGracePeriodSeconds": 30,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": WORKER_UID,
                        "runAsGroup": WORKER_UID,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                },
            },
        },
    }


def router_service_account(owner: Owner) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": _metadata(owner, router_name(owner.name), c.COMPONENT_ROUTER)}


DISCOVERY_RULES = [{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                    "verbs": ["get", "list", "watch"]}]


def router_role(owner: Owner) -> dict[str, Any]:
    """Least privilege: read EndpointSlices in this namespace, nothing else (their names are generated, so
    resourceNames cannot narrow it further; the router filters by the kubernetes.io/service-name label)."""
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": _metadata(owner, router_name(owner.name), c.COMPONENT_ROUTER),
            "rules": [dict(rule) for rule in DISCOVERY_RULES]}


def router_role_binding(owner: Owner) -> dict[str, Any]:
    name = router_name(owner.name)
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": _metadata(owner, name, c.COMPONENT_ROUTER),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": owner.namespace}]}


def router_children(owner: Owner, spec: InferenceSpec, defaults: WorkerDefaults) -> RouterChildren:
    return RouterChildren(
        deployment=router_deployment(owner, spec, defaults),
        workers_service=workers_service(owner),
        service_account=router_service_account(owner),
        role=router_role(owner),
        role_binding=router_role_binding(owner),
    )


def inference_pool(owner: Owner, spec: InferenceSpec) -> dict[str, Any] | None:
    """An InferencePool (inference.networking.k8s.io/v1) over the worker pods, for a gateway whose endpoint
    picker (spec.router.inferencePool.endpointPicker) routes to them directly."""
    pool = spec.router.inference_pool
    if pool is None:
        return None
    return {
        "apiVersion": INFERENCE_POOL_API_VERSION,
        "kind": "InferencePool",
        "metadata": _metadata(owner),
        "spec": {
            "selector": {"matchLabels": selector_labels(owner.name)},
            "targetPorts": [{"number": c.WORKER_PORT}],
            "endpointPickerRef": {"kind": "Service", "name": pool.endpoint_picker,
                                  "port": {"number": pool.endpoint_picker_port}, "failureMode": "FailClose"},
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
        router=router_children(owner, spec, defaults) if spec.router.enabled else None,
        inference_pool=inference_pool(owner, spec),
    )
