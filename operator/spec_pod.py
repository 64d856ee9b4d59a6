"""The pod-level settings of an InferenceDeployment (pure): what a real cluster needs of its worker pods beyond the
model (pull secrets, identity, scheduling, extra metadata and volumes) and how long they may start and stop.

Every one is optional and rendered only when given (manifests/worker.py), so adding these fields to the CRD
changes no existing pod. Types, bounds and defaults are the CRD's (operator/crd.py, read through Reader.field).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hetero_infer.operator import constants as c
from hetero_infer.operator.crd import OWN_MOUNT_PATHS, OWN_VOLUMES, SCHEMA
from hetero_infer.operator.spec_reader import DNS1123_SUBDOMAIN, Reader, string_map, type_name

PRESTOP_SLEEP_SECONDS = 10  # the pod stays up this long after it is marked terminating: endpoints drop it first
DEFAULT_DRAIN_SECONDS = SCHEMA.at("spec.drainSeconds").default  # the worker's --shutdown-grace
DRAIN_MARGIN_SECONDS = 5  # between the worker's drain and the kubelet's SIGKILL
DEFAULT_STARTUP_TIMEOUT_SECONDS = SCHEMA.at("spec.startupTimeoutSeconds").default  # model loading takes minutes
STARTUP_PROBE_PERIOD_SECONDS = SCHEMA.at("spec.startupTimeoutSeconds").minimum  # the window is whole periods


@dataclass(frozen=True)
class SecretKeyRef:
    """One key of a Secret in the InferenceDeployment's namespace (a core/v1 SecretKeySelector)."""

    name: str
    key: str

    def env(self, variable: str) -> dict[str, Any]:
        return {"name": variable, "valueFrom": {"secretKeyRef": {"name": self.name, "key": self.key}}}


@dataclass(frozen=True)
class PodSpec:
    image_pull_secrets: tuple[str, ...] = ()
    service_account_name: str | None = None
    priority_class_name: str | None = None
    runtime_class_name: str | None = None
    topology_spread_constraints: tuple[dict[str, Any], ...] = ()
    annotations: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    volumes: tuple[dict[str, Any], ...] = ()
    volume_mounts: tuple[dict[str, Any], ...] = ()
    startup_timeout_seconds: int = DEFAULT_STARTUP_TIMEOUT_SECONDS
    drain_seconds: int = DEFAULT_DRAIN_SECONDS
    termination_grace_period_seconds: int = PRESTOP_SLEEP_SECONDS + DEFAULT_DRAIN_SECONDS + DRAIN_MARGIN_SECONDS

    @property
    def startup_failure_threshold(self) -> int:
        """The startup probe's failureThreshold that gives the window (period 10 s, rounded up)."""
        return -(-self.startup_timeout_seconds // STARTUP_PROBE_PERIOD_SECONDS)


def parse_secret_key_ref(r: Reader, raw: Any, path: str) -> SecretKeyRef | None:
    """`{secretKeyRef: {name, key}}`, the shape of a core/v1 env var's valueFrom."""
    if raw is None:
        return None
    outer = r.obj(raw, path, r.keys(path), required=("secretKeyRef",))
    if outer.get("secretKeyRef") is None:
        return None
    p = f"{path}.secretKeyRef"
    ref = r.obj(outer["secretKeyRef"], p, r.keys(p), required=("name", "key"))
    name = r.string(ref, "name", p, pattern=DNS1123_SUBDOMAIN, what="a Secret's name")
    key = r.string(ref, "key", p)
    return SecretKeyRef(name, key) if name and key else None


def parse_pod(r: Reader, spec: Mapping[str, Any]) -> PodSpec:
    """The pod-level fields of `spec` (at its top level)."""
    p = "spec"
    names = {key: parse_name(r, spec, key, p) for key in ("serviceAccountName", "priorityClassName",
                                                           "runtimeClassName")}
    drain = r.field(spec, "drainSeconds", p)
    least_grace = PRESTOP_SLEEP_SECONDS + drain
    bounds = SCHEMA.at(f"{p}.terminationGracePeriodSeconds")
    grace = r.integer(spec, "terminationGracePeriodSeconds", p, least_grace + DRAIN_MARGIN_SECONDS,
                      minimum=bounds.minimum, maximum=bounds.maximum)
    if grace < least_grace:
        r.bad(f"{p}.terminationGracePeriodSeconds", f"must be at least {least_grace} (the preStop's "
              f"{PRESTOP_SLEEP_SECONDS} s plus drainSeconds {drain}), got {grace}")
    volumes, mounts = parse_volumes(r, spec, p, OWN_VOLUMES, OWN_MOUNT_PATHS)
    labels = parse_labels(r, spec.get("podLabels"), f"{p}.podLabels")
    spread = parse_spread(r, spec.get("topologySpreadConstraints"), f"{p}.topologySpreadConstraints")
    return PodSpec(
        image_pull_secrets=_pull_secrets(r, spec.get("imagePullSecrets"), f"{p}.imagePullSecrets"),
        service_account_name=names["serviceAccountName"],
        priority_class_name=names["priorityClassName"],
        runtime_class_name=names["runtimeClassName"],
        topology_spread_constraints=spread,
        annotations=string_map(r, spec.get("podAnnotations"), f"{p}.podAnnotations"),
        labels=labels,
        volumes=volumes,
        volume_mounts=mounts,
        startup_timeout_seconds=r.field(spec, "startupTimeoutSeconds", p),
        drain_seconds=drain,
        termination_grace_period_seconds=grace,
    )


def parse_spread(r: Reader, raw: Any, path: str) -> tuple[dict[str, Any], ...]:
    """core/v1 TopologySpreadConstraints (their labelSelector is the user's to give)."""
    spread = _objects(r, raw, path, required=("maxSkew", "topologyKey", "whenUnsatisfiable"))
    for i, item in enumerate(spread):
        q = f"{path}[{i}]"
        for key in ("maxSkew", "topologyKey", "whenUnsatisfiable"):
            r.field(item, key, q)
    return tuple(spread)


def _objects(r: Reader, raw: Any, path: str, required: tuple[str, ...]) -> list[dict[str, Any]]:
    """An array of objects (core/v1 types the API server validates in full), each with its required keys."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        r.bad(path, f"must be an array, got {type_name(raw)}")
        return []
    out = []
    for i, item in enumerate(raw):
        if not isinstance(item, Mapping):
            r.bad(f"{path}[{i}]", f"must be an object, got {type_name(item)}")
            continue
        for key in required:
            if item.get(key) is None:
                r.bad(f"{path}[{i}].{key}", "required field is missing")
        out.append(dict(item))
    return out


def _pull_secrets(r: Reader, raw: Any, path: str) -> tuple[str, ...]:
    names = []
    for i, item in enumerate(_objects(r, raw, path, required=("name",))):
        name = r.string(item, "name", f"{path}[{i}]", pattern=DNS1123_SUBDOMAIN, what="a Secret's name")
        if name:
            names.append(name)
    return tuple(names)


def parse_volumes(r: Reader, data: Mapping[str, Any], p: str, own_volumes: tuple[str, ...],
                  own_mount_paths: tuple[str, ...]) -> tuple[tuple[dict[str, Any], ...], tuple[dict[str, Any], ...]]:
    """`p`.volumes and `p`.volumeMounts (extra core/v1 ones, beside the operator's own names and paths)."""
    volumes = _objects(r, data.get("volumes"), f"{p}.volumes", required=("name",))
    mounts = _objects(r, data.get("volumeMounts"), f"{p}.volumeMounts", required=("name", "mountPath"))
    names = [v.get("name") for v in volumes]
    for i, name in enumerate(names):
        if name in own_volumes:
            r.bad(f"{p}.volumes[{i}].name", f"{name!r} is the operator's own volume")
        elif names.index(name) != i:
            r.bad(f"{p}.volumes[{i}].name", f"{name!r} is given twice")
    for i, mount in enumerate(mounts):
        if mount.get("name") is not None and mount.get("name") not in names:
            r.bad(f"{p}.volumeMounts[{i}].name", f"{mount.get('name')!r} names no volume of {p}.volumes")
        path = str(mount.get("mountPath") or "").rstrip("/")
        if path in own_mount_paths:
            r.bad(f"{p}.volumeMounts[{i}].mountPath", f"{path!r} is the operator's own mount")
    return tuple(volumes), tuple(mounts)


def parse_labels(r: Reader, raw: Any, path: str) -> dict[str, str]:
    """Extra pod labels: not the ones the operator selects its pods by."""
    labels = string_map(r, raw, path)
    for key in sorted(set(labels) & {c.LABEL_OWNER, c.LABEL_COMPONENT, c.LABEL_NAME, c.LABEL_INSTANCE,
                                     c.LABEL_MANAGED_BY}):
        r.bad(f"{path}.{key}", "is set by the operator (it selects the pods)")
    return labels


def parse_name(r: Reader, data: Mapping[str, Any], key: str, path: str) -> str | None:
    """The name of a ServiceAccount, PriorityClass or RuntimeClass."""
    return r.string(data, key, path, pattern=DNS1123_SUBDOMAIN, what="a DNS-1123 subdomain name")
