"""Spec -> child manifests (pure), one module per child: the worker Deployment and its PodDisruptionBudget
(`worker`), the Services (`service`), the HPA (`hpa`); with spec.router the router's Deployment (`router`), its
ServiceAccount, Role and RoleBinding (`rbac`) and the worker Service it discovers workers through (the Service
users call then selects the router); with spec.router.inferencePool an InferencePool (`pool`). What they share
(owner, names, labels, defaults): `common`. This module puts them together (`children`).

Every function takes typed input and returns plain dicts ready for the API server. Optional fields that the
operator manages but the spec leaves unset are emitted as ``None``: a JSON merge patch then removes them from a
live object, and `children.apply` strips them on create.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hetero_infer.operator import constants as c
from hetero_infer.operator.manifests.cache import FetchSource, cache_claim, download_job, fetch_source
from hetero_infer.operator.manifests.common import (
    WORKER_UID,
    Owner,
    WorkerDefaults,
    cache_claim_name,
    cache_key,
    common_labels,
    endpoint,
    fetch_job_name,
    owner_reference,
    router_name,
    selector_labels,
    selector_string,
    workers_service_name,
)
from hetero_infer.operator.manifests.exposure import HTTP_ROUTE_API_VERSION, http_route, ingress
from hetero_infer.operator.manifests.hpa import horizontal_pod_autoscaler, quantity
from hetero_infer.operator.manifests.pool import INFERENCE_POOL_API_VERSION, inference_pool
from hetero_infer.operator.manifests.rbac import (
    DISCOVERY_RULES,
    router_role,
    router_role_binding,
    router_service_account,
)
from hetero_infer.operator.manifests.router import ROUTER_CPU, ROUTER_MEMORY, router_args, router_deployment
from hetero_infer.operator.manifests.router import pod_disruption_budget as router_pdb
from hetero_infer.operator.manifests.service import service, workers_service
from hetero_infer.operator.manifests.worker import (
    CACHE_DIR,
    MODEL_MOUNT,
    PRESTOP_SLEEP_SECONDS,
    SHUTDOWN_GRACE_SECONDS,
    TERMINATION_GRACE_SECONDS,
    cached_model_path,
    command_line,
    deployment,
    model_path,
    pod_disruption_budget,
    rollout_strategy,
    worker_args,
)
from hetero_infer.operator.spec import InferenceSpec

__all__ = [
    "CACHE_DIR", "DISCOVERY_RULES", "HTTP_ROUTE_API_VERSION", "INFERENCE_POOL_API_VERSION", "MODEL_MOUNT", "PRESTOP_SLEEP_SECONDS",
    "ROUTER_CPU", "ROUTER_MEMORY", "SHUTDOWN_GRACE_SECONDS", "TERMINATION_GRACE_SECONDS", "WORKER_UID", "Children",
    "FetchSource", "cache_claim", "cache_claim_name", "cache_key", "cached_model_path", "download_job",
    "fetch_job_name", "fetch_source",
    "Owner", "RouterChildren", "WorkerDefaults", "children", "command_line", "common_labels", "deployment",
    "endpoint", "horizontal_pod_autoscaler", "http_route", "inference_pool", "ingress", "model_path", "owner_reference",
    "pod_disruption_budget", "quantity", "rollout_strategy", "router_args", "router_child_names",
    "router_deployment", "router_name", "selector_labels", "selector_string", "service",
    "stale_optional_children", "worker_args", "workers_service", "workers_service_name",
]


@dataclass(frozen=True)
class RouterChildren:
    """What spec.router adds: the router pods, their discovery RBAC and the worker Service they watch."""

    deployment: dict[str, Any]
    workers_service: dict[str, Any]
    service_account: dict[str, Any]
    role: dict[str, Any]
    role_binding: dict[str, Any]
    pdb: dict[str, Any] | None  # None with one replica: no budget that pretends to keep the only router up

    def all(self) -> list[dict[str, Any]]:
        # RBAC before the pods that use it.
        return [m for m in (self.service_account, self.role, self.role_binding, self.workers_service,
                            self.deployment, self.pdb) if m is not None]


@dataclass(frozen=True)
class Children:
    deployment: dict[str, Any] | None  # None: with spec.model.cache, no revision of the model is downloaded yet
    service: dict[str, Any]  # the Service users call: the router's with spec.router, else the workers'
    pdb: dict[str, Any]
    hpa: dict[str, Any] | None  # None: there must be no HPA (autoscaling off or not in hpa mode)
    router: RouterChildren | None = None  # None: there must be no router children
    inference_pool: dict[str, Any] | None = None
    ingress: dict[str, Any] | None = None  # spec.service.ingress
    http_route: dict[str, Any] | None = None  # spec.service.httpRoute

    def all(self) -> list[dict[str, Any]]:
        # The worker Deployment first: a size change (the autoscaler's, or a router scaling from zero) reaches
        # the pods before the other children are read and compared.
        router = self.router.all() if self.router is not None else []
        return [m for m in (self.deployment, *router, self.service, self.pdb, self.hpa, self.inference_pool,
                            self.ingress, self.http_route) if m is not None]


def router_child_names(name: str) -> list[tuple[str, str]]:
    """(kind, name) of every child spec.router adds, for deleting them when the router is turned off."""
    r = router_name(name)
    return [("Deployment", r), ("PodDisruptionBudget", r), ("Service", workers_service_name(name)),
            ("RoleBinding", r), ("Role", r), ("ServiceAccount", r)]


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
    if c.OPTIONAL_INGRESS in had and wanted.ingress is None:
        stale.append(("Ingress", name))
    if c.OPTIONAL_HTTP_ROUTE in had and wanted.http_route is None:
        stale.append(("HTTPRoute", name))
    return stale


def router_children(owner: Owner, spec: InferenceSpec, defaults: WorkerDefaults) -> RouterChildren:
    return RouterChildren(
        deployment=router_deployment(owner, spec, defaults),
        workers_service=workers_service(owner),
        service_account=router_service_account(owner),
        role=router_role(owner, spec),
        role_binding=router_role_binding(owner),
        pdb=router_pdb(owner) if spec.router.replicas > 1 else None,
    )


def children(owner: Owner, spec: InferenceSpec, defaults: WorkerDefaults | None = None,
             cached: str | None = None) -> Children:
    """Everything one InferenceDeployment owns, as the operator wants it to be (`cached`: with spec.model.cache,
    the cache folder the workers serve from; none yet, no worker Deployment). The cache's claim and download Job
    are rendered apart (manifests.cache): what the workers get depends on how far the download is."""
    defaults = defaults or WorkerDefaults()
    waiting = spec.model.cache is not None and cached is None
    return Children(
        deployment=None if waiting else deployment(owner, spec, defaults, cached),
        service=service(owner, spec),
        pdb=pod_disruption_budget(owner),
        hpa=horizontal_pod_autoscaler(owner, spec) if spec.autoscaling.hpa else None,
        router=router_children(owner, spec, defaults) if spec.router.enabled else None,
        inference_pool=inference_pool(owner, spec),
        ingress=ingress(owner, spec),
        http_route=http_route(owner, spec),
    )
