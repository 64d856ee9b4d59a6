"""The cluster router (`--discover-inference-deployments`): one endpoint for every InferenceDeployment of its
namespace (or those matching `--selector`), found through the API.

The router lists and watches the InferenceDeployments; for each it serves `spec.model.name` (routing by model:
docs/router.md), takes the workers from the EndpointSlices of the Service over its worker pods
(`<name>-workers` with its own router, else `<name>`; discovery.py), and, where its autoscaling goes down to
zero replicas, asks its scale subresource for one replica when a request for its model is held (scale.py). A
model is served (listed, and held rather than refused while it has no ready worker) from the moment its
InferenceDeployment exists; when it is deleted, its workers leave the pool and its model is no longer served.
The per-model routers (spec.router.enabled) stay available beside it.

RBAC (the chart's cluster-router Role): get/list/watch on inferencedeployments and on endpointslices, get/patch
on inferencedeployments/scale, in its namespace.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from hetero_infer.contracts import kube
from hetero_infer.router.discovery import EndpointSliceWatcher, ListWatcher, Membership
from hetero_infer.router.kube_api import ApiAccess, api_access, in_cluster_namespace
from hetero_infer.router.scale import ScaleFromZero

if TYPE_CHECKING:
    from hetero_infer.router.app import Router

logger = logging.getLogger("hetero_infer.router.cluster")


@dataclass(frozen=True)
class Fronted:
    """What the router needs of one InferenceDeployment."""

    name: str
    model: str
    service: str  # the Service over its worker pods
    scale_from_zero: bool  # autoscaling down to 0 replicas: a held request asks for one


def fronted(obj: Mapping[str, Any]) -> Fronted | None:
    """An InferenceDeployment as the router fronts it; None when it names no model (the operator refuses it)."""
    name = (obj.get("metadata") or {}).get("name")
    spec = obj.get("spec") or {}
    model = (spec.get("model") or {}).get("name")
    if not isinstance(name, str) or not isinstance(model, str) or not name or not model:
        return None
    router = spec.get("router") or {}
    autoscaling = spec.get("autoscaling") or {}
    to_zero = bool(autoscaling.get("enabled")) and autoscaling.get("minReplicas") == 0
    return Fronted(name, model, kube.workers_service(name, bool(router.get("enabled"))), to_zero)


class Member:
    """One fronted InferenceDeployment's watch, pool membership and scale target."""

    def __init__(self, router: Router, access: ApiAccess, namespace: str, spec: Fronted) -> None:
        self.spec = spec
        self.membership = Membership(router.pool)
        self.watcher = EndpointSliceWatcher(access, namespace, spec.service, self.membership.apply,
                                            router.options.discover_port)
        self.task = asyncio.create_task(self.watcher.run())
        self.scaler: ScaleFromZero | None = None
        if spec.scale_from_zero:
            self.scaler = ScaleFromZero(spec.name, namespace, access, on_result=lambda result:
                                        router.metrics.scale_from_zero.labels(result).inc())

    async def stop(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        await self.membership.forget()
        if self.scaler is not None:
            await self.scaler.stop()


def selects(selector: str | None, labels: Mapping[str, str]) -> bool:
    """Whether equality-based `selector` (`k=v`, `k==v`, `k!=v`, `k`, `!k`, comma-separated) selects `labels`: the
    API server filters the list and the watch by it; this checks again what arrives (a server that ignores it)."""
    for term in (t.strip() for t in (selector or "").split(",")):
        if not term:
            continue
        if "!=" in term:
            key, value = (x.strip() for x in term.split("!=", 1))
            ok = labels.get(key) != value
        elif "=" in term:
            key, value = (x.strip() for x in term.replace("==", "=").split("=", 1))
            ok = labels.get(key) == value
        elif term.startswith("!"):
            ok = term[1:].strip() not in labels
        else:
            ok = term in labels
        if not ok:
            return False
    return True


class InferenceDeploymentWatcher(ListWatcher):
    def __init__(self, access: ApiAccess, namespace: str, selector: str | None, cluster: Cluster) -> None:
        super().__init__(access, f"/apis/{kube.GROUP}/{kube.VERSION}/namespaces/{quote(namespace, safe='')}/"
                         f"{kube.PLURAL}", selector, f"the InferenceDeployments of {namespace}")
        self.cluster = cluster

    def wanted(self, obj: Mapping[str, Any]) -> bool:
        return selects(self.selector, (obj.get("metadata") or {}).get("labels") or {})

    def changed(self) -> None:
        self.cluster.apply(self.objects)


class Cluster:
    """The InferenceDeployments the router fronts (see the module docstring)."""

    def __init__(self, router: Router, namespace: str | None = None, selector: str | None = None,
                 access: ApiAccess | None = None) -> None:
        self.router = router
        self.namespace = namespace or in_cluster_namespace() or "default"
        self.selector = selector
        self.access = access
        self.members: dict[str, Member] = {}
        self.watcher: InferenceDeploymentWatcher | None = None
        self.task: asyncio.Task[None] | None = None
        self._stopping: set[asyncio.Task[None]] = set()

    def apply(self, objects: Mapping[str, Mapping[str, Any]]) -> None:
        """Front exactly these InferenceDeployments: start the new (or changed) ones, stop those gone."""
        assert self.access is not None
        wanted = {f.name: f for f in map(fronted, objects.values()) if f is not None}
        for name in sorted(set(self.members) - set(wanted)) + sorted(
                n for n, f in wanted.items() if n in self.members and self.members[n].spec != f):
            self._stop(self.members.pop(name))
        for name, spec in sorted(wanted.items()):
            if name not in self.members:
                logger.info("fronting InferenceDeployment %s/%s: model %s, workers of Service %s", self.namespace,
                            name, spec.model, spec.service)
                member = self.members[name] = Member(self.router, self.access, self.namespace, spec)
                if member.scaler is not None:
                    self.router.scalers[spec.model] = member.scaler
                    asyncio.get_running_loop().create_task(member.scaler.start())
        self.router.declared = {m.spec.model: name for name, m in self.members.items()}
        self.router.pool.wake()

    def _stop(self, member: Member) -> None:
        logger.info("no longer fronting InferenceDeployment %s/%s (model %s)", self.namespace, member.spec.name,
                    member.spec.model)
        if self.router.scalers.get(member.spec.model) is member.scaler:
            self.router.scalers.pop(member.spec.model, None)
        task = asyncio.get_running_loop().create_task(member.stop())
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    async def start(self) -> None:
        self.access = self.access or api_access()
        self.watcher = InferenceDeploymentWatcher(self.access, self.namespace, self.selector, self)
        logger.info("fronting the InferenceDeployments of %s%s", self.namespace,
                    f" matching {self.selector}" if self.selector else "")
        self.task = asyncio.create_task(self.watcher.run())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        members = list(self.members.values())
        self.members.clear()
        await asyncio.gather(*(m.stop() for m in members), *self._stopping, return_exceptions=True)
