"""The router's Deployment (spec.router): `hetero-infer router` over the workers it discovers."""

from __future__ import annotations

from typing import Any

from hetero_infer.contracts.options import to_flags
from hetero_infer.contracts.router_options import RouterOptions
from hetero_infer.operator import constants as c
from hetero_infer.operator.diff import spec_keys
from hetero_infer.operator.manifests.common import (
    Owner,
    WorkerDefaults,
    common_labels,
    image_pull_secrets,
    metadata,
    probe,
    router_name,
    scrape_annotations,
    selector_labels,
    workers_service_name,
)
from hetero_infer.operator.manifests.worker import pod_security
from hetero_infer.operator.spec import InferenceSpec

ROUTER_CPU = "500m"
ROUTER_MEMORY = "512Mi"
# Stopping: the preStop keeps the router serving while endpoints drop it; then SIGTERM, and it finishes what it
# holds and streams (--shutdown-grace-s, as long as a request may be held) before the kubelet's SIGKILL.
ROUTER_PRESTOP_SECONDS = 5
ROUTER_GRACE_MARGIN_SECONDS = 10
API_KEY_ENV = "HETERO_INFER_ROUTER_API_KEY"  # RouterOptions.api_key: what the router's clients must present
WORKER_API_KEY_ENV = "HETERO_INFER_ROUTER_WORKER_API_KEY"  # RouterOptions.worker_api_key (spec.apiKey)


def scales_from_zero(spec: InferenceSpec) -> bool:
    """minReplicas 0 under the operator's autoscaler: the router asks for the first replica itself
    (--scale-target), through the scale subresource its Role lets it get and patch (rbac.py)."""
    return spec.router.enabled and spec.autoscaling.by_operator and spec.autoscaling.min_replicas == 0


def router_args(owner: Owner, spec: InferenceSpec) -> list[str]:
    """The `hetero-infer router ...` command line, rendered from the RouterOptions it parses: workers discovered
    from the worker Service's EndpointSlices. spec.router.cors and .tokenizer only where they differ from the
    router's defaults: a spec without them (or with the defaults written out, as the API server fills them)
    renders the same Deployment as before they existed, so it does not roll. --scale-target only with scale to
zero (scales_from_zero)."""
    r, cors = spec.router, spec.router.cors
    return ["router", *to_flags(RouterOptions, {
        "host": "0.0.0.0",
        "port": c.WORKER_PORT,
        "policy": r.policy,
        "discover_service": workers_service_name(owner.name),
        "namespace": owner.namespace,
        "scale_target": owner.name if scales_from_zero(spec) else None,
        "hold_timeout_s": r.hold_timeout_seconds,
        "shutdown_grace_s": r.hold_timeout_seconds,
        "block_size": spec.engine.block_size,
        "allowed_origins": cors.allowed_origins,
        "allowed_methods": _unless_default("allowed_methods", list(cors.allowed_methods)),
        "allowed_headers": _unless_default("allowed_headers", list(cors.allowed_headers)),
        "allow_credentials": cors.allow_credentials or None,
        "tokenizer": _unless_default("tokenizer", r.tokenizer),
        # spec.router.flowControl: only when enabled, so that a spec without it renders the Deployment as before
        "flow_control": True if r.flow.enabled else None,
        "max_queued": _unless_default("max_queued", r.flow.max_queued) if r.flow.enabled else None,
        "queue_timeout_s": _unless_default("queue_timeout_s", r.flow.queue_timeout_seconds) if r.flow.enabled else None,
        "tenant_header": r.flow.tenant_header if r.flow.enabled else None,
        "priority_class": [f"{n}={v}" for n, v in r.flow.priority_classes] or None if r.flow.enabled else None,
        "priority_class_header": r.flow.priority_class_header if r.flow.enabled else None,
        "tenant_limit": [f"{n}={v}" for n, v in r.flow.tenant_limits] or None if r.flow.enabled else None,
    })]


_ROUTER_DEFAULTS = RouterOptions()


def _unless_default(option: str, value: Any) -> Any:
    return None if value == getattr(_ROUTER_DEFAULTS, option) else value


def router_env(spec: InferenceSpec) -> list[dict[str, Any]]:
    """The keys come from Secrets (spec.apiKey, spec.router.apiKey), never on the command line."""
    env = [{"name": "HOME", "value": "/tmp"}, {"name": "PYTHONUNBUFFERED", "value": "1"}]
    if spec.api_key is not None:
        env.append(spec.api_key.env(WORKER_API_KEY_ENV))
    if spec.router.api_key is not None:
        env.append(spec.router.api_key.env(API_KEY_ENV))
    return env


def grace_period(spec: InferenceSpec) -> int:
    """Covers the preStop and a request held for the whole hold time-out after SIGTERM."""
    return ROUTER_PRESTOP_SECONDS + spec.router.hold_timeout_seconds + ROUTER_GRACE_MARGIN_SECONDS


def pod_disruption_budget(owner: Owner) -> dict[str, Any]:
    """One router pod at a time: with the default two replicas a node drain never takes the endpoint offline."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(owner, router_name(owner.name), c.COMPONENT_ROUTER),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector_labels(owner.name, c.COMPONENT_ROUTER)},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def spread_over_nodes(owner: Owner) -> dict[str, Any]:
    """Without spec.router.affinity: prefer a node without another router of this InferenceDeployment, so that one
    node's failure or drain does not take every replica (preferred: a one-node cluster still runs them all)."""
    return {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
        "weight": 100,
        "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                            "labelSelector": {"matchLabels": selector_labels(owner.name, c.COMPONENT_ROUTER)}},
    }]}}


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
        "env": router_env(spec),
        "resources": {"requests": {"cpu": cpu, "memory": memory}, "limits": {"memory": memory}},
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
        "livenessProbe": probe("/healthz", period=10, failures=3),
        # Ready whenever it runs, with or without a ready worker: requests are held, not refused.
        "readinessProbe": probe("/readyz", period=5, failures=2),
        "lifecycle": {"preStop": {"sleep": {"seconds": ROUTER_PRESTOP_SECONDS}}},  # needs no sleep binary
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    labels = {**r.pod.labels, **common_labels(owner.name, c.COMPONENT_ROUTER)}
    meta = metadata(owner, name, c.COMPONENT_ROUTER)
    meta["annotations"] = {c.SPEC_KEYS_ANNOTATION: spec_keys({
        "spec.template.metadata.labels": r.pod.labels, "spec.template.metadata.annotations": r.pod.annotations,
        "spec.template.spec.nodeSelector": r.pod.node_selector})}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": r.replicas,
            "selector": {"matchLabels": selector_labels(owner.name, c.COMPONENT_ROUTER)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "revisionHistoryLimit": 3,
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {**scrape_annotations(), **r.pod.annotations},
                },
                "spec": {
                    "serviceAccountName": name,
                    "automountServiceAccountToken": True,  # it watches EndpointSlices
                    "enableServiceLinks": False,
                    "containers": [container],
                    "volumes": [{"name": "tmp", "emptyDir": {}}],
                    "terminationGracePeriodSeconds": grace_period(spec),
                    "imagePullSecrets": image_pull_secrets(spec, defaults),
                    "securityContext": pod_security(spec, fs_group=False),
                    "nodeSelector": dict(r.pod.node_selector) or None,
                    "tolerations": [dict(t) for t in r.pod.tolerations] or None,
                    "affinity": r.pod.affinity if r.pod.affinity is not None else spread_over_nodes(owner),
                    "topologySpreadConstraints": [dict(t) for t in r.pod.topology_spread_constraints] or None,
                    "priorityClassName": r.pod.priority_class_name,
                },
            },
        },
    }
