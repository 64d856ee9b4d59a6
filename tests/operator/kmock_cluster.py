"""A KMock API server that behaves enough like kube-apiserver for kopf and kubectl.

KMock 0.8 stores objects and streams watch events but leaves out what a real server adds. This
subclass closes the gaps the operator tests run into:

- stamps `metadata.uid`, `creationTimestamp`, `resourceVersion` (monotonic) and `generation`
  (bumped when anything but metadata/status changes) on create, patch and delete;
- applies the API server's defaults (api_defaults.py) to Deployments, Services, PDBs and HPAs
  after every create and merge patch, so the operator sees what a real server returns;
- honours `labelSelector` on lists and watches (equality- and set-based);
- garbage-collects like kube-controller-manager: deleting an object deletes its dependents
  (ownerReferences); `delete_namespace` deletes what is in a namespace (objects with finalizers
  are only marked, and stay until their finalizers go);
- a merge patch carrying `metadata.resourceVersion` is refused with 409 Conflict unless the object
  is still at that version (optimistic concurrency); a JSON patch's failed `test` op is a 409 too;
- `/status` patches change only `.status`, and main-resource patches leave `.status` alone
  for resources with a status subresource (as the real server does);
- watches honour `?resourceVersion=` (no replay of objects the client listed already);
- lists carry `kind`/`apiVersion`, and answer kubectl's `as=Table` with the CRD's printer columns;
- the `scale` subresource of InferenceDeployments is served (GET and merge PATCH), and pods' `log` subresource
  (text from `pod_logs`, what a container printed; `tailLines` honoured);
- discovery knows the resources the operator uses.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import datetime
import itertools
import json
import re
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import attrs
import kmock
from api_defaults import BY_KIND as DEFAULTS
from kmock._internal import dicts, dsl, enums, rendering

from hetero_infer.operator import constants as c

INFD = kmock.resource(c.GROUP, c.VERSION, c.PLURAL)
DEPLOYMENTS = kmock.resource("apps", "v1", "deployments")
SERVICES = kmock.resource("", "v1", "services")
PDBS = kmock.resource("policy", "v1", "poddisruptionbudgets")
HPAS = kmock.resource("autoscaling", "v2", "horizontalpodautoscalers")
EVENTS = kmock.resource("", "v1", "events")
PEERINGS = kmock.resource("kopf.dev", "v1", "clusterkopfpeerings")
NAMESPACES = kmock.resource("", "v1", "namespaces")
ENDPOINT_SLICES = kmock.resource("discovery.k8s.io", "v1", "endpointslices")
SERVICE_ACCOUNTS = kmock.resource("", "v1", "serviceaccounts")
ROLES = kmock.resource("rbac.authorization.k8s.io", "v1", "roles")
ROLE_BINDINGS = kmock.resource("rbac.authorization.k8s.io", "v1", "rolebindings")
JOBS = kmock.resource("batch", "v1", "jobs")
PVCS = kmock.resource("", "v1", "persistentvolumeclaims")
PODS = kmock.resource("", "v1", "pods")
CONFIG_MAPS = kmock.resource("", "v1", "configmaps")

_VERBS = {"get", "list", "watch", "create", "patch", "update", "delete"}
RESOURCES: dict[kmock.resource, kmock.ResourceInfo] = {
    INFD: kmock.ResourceInfo(kind=c.KIND, singular=c.SINGULAR, namespaced=True, verbs=_VERBS,
                             shortnames={c.SHORT_NAME}, categories={"all"}, subresources={"status", "scale"}),
    DEPLOYMENTS: kmock.ResourceInfo(kind="Deployment", singular="deployment", namespaced=True, verbs=_VERBS,
                                    shortnames={"deploy"}, subresources={"status", "scale"}),
    SERVICES: kmock.ResourceInfo(kind="Service", singular="service", namespaced=True, verbs=_VERBS,
                                 shortnames={"svc"}, subresources={"status"}),
    PDBS: kmock.ResourceInfo(kind="PodDisruptionBudget", singular="poddisruptionbudget", namespaced=True,
                             verbs=_VERBS, shortnames={"pdb"}, subresources={"status"}),
    HPAS: kmock.ResourceInfo(kind="HorizontalPodAutoscaler", singular="horizontalpodautoscaler",
                             namespaced=True, verbs=_VERBS, shortnames={"hpa"}, subresources={"status"}),
    EVENTS: kmock.ResourceInfo(kind="Event", singular="event", namespaced=True, verbs=_VERBS, shortnames={"ev"}),
    PEERINGS: kmock.ResourceInfo(kind="ClusterKopfPeering", singular="clusterkopfpeering", namespaced=False,
                                 verbs=_VERBS),
    NAMESPACES: kmock.ResourceInfo(kind="Namespace", singular="namespace",
                                                               namespaced=False, verbs=_VERBS, shortnames={"ns"}),
    ENDPOINT_SLICES: kmock.ResourceInfo(kind="EndpointSlice", singular="endpointslice", namespaced=True,
                                        verbs=_VERBS),
    SERVICE_ACCOUNTS: kmock.ResourceInfo(kind="ServiceAccount", singular="serviceaccount", namespaced=True,
                                         verbs=_VERBS, shortnames={"sa"}),
    ROLES: kmock.ResourceInfo(kind="Role", singular="role", namespaced=True, verbs=_VERBS),
    ROLE_BINDINGS: kmock.ResourceInfo(kind="RoleBinding", singular="rolebinding", namespaced=True, verbs=_VERBS),
    JOBS: kmock.ResourceInfo(kind="Job", singular="job", namespaced=True, verbs=_VERBS, subresources={"status"}),
    PVCS: kmock.ResourceInfo(kind="PersistentVolumeClaim", singular="persistentvolumeclaim", namespaced=True,
                             verbs=_VERBS, shortnames={"pvc"}, subresources={"status"}),
    PODS: kmock.ResourceInfo(kind="Pod", singular="pod", namespaced=True, verbs=_VERBS, shortnames={"po"},
                             subresources={"status", "log"}),
    CONFIG_MAPS: kmock.ResourceInfo(kind="ConfigMap", singular="configmap", namespaced=True, verbs=_VERBS,
                                    shortnames={"cm"}),
    kmock.resource("apiextensions.k8s.io", "v1", "customresourcedefinitions"): kmock.ResourceInfo(
        kind="CustomResourceDefinition", singular="customresourcedefinition", namespaced=False, verbs=_VERBS,
        shortnames={"crd"}),
}


def _fast_membership() -> None:
    """KMock picks the reaction for a request with `request in view`, which walks the whole request history
    through the view's filters: for every reaction, on every request, so a request costs tens to hundreds of
    milliseconds once kopf has run for a while (and the emulator, not the operator, sets the pace of the tests
    that time it). For filters and priorities over the root, which is all the emulator registers, membership
    is the request's own criteria and its presence in the root's history: the same answer without the walk.
    Other views (slices, groups, exclusions) keep KMock's own."""
    walk = dsl.View.__contains__

    def contains(self: dsl.View, item: Any) -> bool:
        if isinstance(item, rendering.Request):
            if type(self) is dsl.Filter:
                return bool(self.criteria(item)) and item in self._source
            if type(self) is dsl.Priority:
                return item in self._source
            if isinstance(self, dsl.Root) and type(self).__iter__ is dsl.Root.__iter__:
                return any(request is item for request in reversed(self._requests))
        return walk(self, item)

    dsl.View.__contains__ = contains  # type: ignore[method-assign]


_fast_membership()


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")  # noqa: UP017


def _rv(obj: Mapping[str, Any]) -> int:
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or 0)
    except (TypeError, ValueError):
        return 0


def _pointer(obj: Any, pointer: str) -> Any:
    for part in pointer.strip("/").split("/") if pointer.strip("/") else []:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(obj, Mapping):
            obj = obj.get(part)
        elif isinstance(obj, list) and part.isdigit() and int(part) < len(obj):
            obj = obj[int(part)]
        else:
            return None
    return obj


def _merge_diff(current: Mapping[str, Any], target: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch that turns `current` into `target` (what KMock applies as the new version)."""
    out: dict[str, Any] = {k: None for k in current if k not in target}
    for key, value in target.items():
        old = current.get(key)
        if isinstance(value, Mapping) and isinstance(old, Mapping):
            sub = _merge_diff(old, value)
            if sub:
                out[key] = sub
        elif key not in current or old != value:
            out[key] = copy.deepcopy(value)
    return out


def _content(obj: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


def _split_selector(selector: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(selector):
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(selector[start:i])
            start = i + 1
    parts.append(selector[start:])
    return [p.strip() for p in parts if p.strip()]


def selector_matches(selector: str, labels: Mapping[str, str]) -> bool:
    """A Kubernetes label selector (`a=b,c!=d,e,!f,g in (h,i),j notin (k)`) against labels."""
    for req in _split_selector(selector):
        set_based = re.match(r"^([^\s!=]+)\s+(in|notin)\s+\((.*)\)$", req)
        if set_based:
            key, op, values = set_based.group(1), set_based.group(2), {v.strip() for v in set_based.group(3).split(",")}
            if (op == "in") != (key in labels and labels[key] in values):
                return False
        elif "!=" in req:
            key, value = (x.strip() for x in req.split("!=", 1))
            if labels.get(key) == value:
                return False
        elif "=" in req:
            key, value = (x.strip() for x in req.replace("==", "=").split("=", 1))
            if labels.get(key) != value:
                return False
        elif req.startswith("!"):
            if req[1:].strip() in labels:
                return False
        elif req not in labels:
            return False
    return True


def _labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


_FILTERED = re.compile(r'^(\w+)\[\?\(@\.(\w+)=="([^"]*)"\)\]$')  # list[?(@.key=="value")], as in printer columns


def _jsonpath(obj: Any, path: str) -> Any:
    for part in re.findall(r'(?:[^.\[]|\[[^\]]*\])+', path):
        if not isinstance(obj, Mapping):
            return None
        filtered = _FILTERED.match(part)
        if filtered is None:
            obj = obj.get(part)
            continue
        key, field, value = filtered.groups()
        obj = next((item for item in obj.get(key) or [] if isinstance(item, Mapping) and item.get(field) == value),
                   None)
    return obj


@attrs.define(kw_only=True)
class ClusterEmulator(kmock.KubernetesEmulator):
    printer_columns: list[dict[str, Any]] = attrs.field(factory=list)
    _counter: Any = attrs.field(factory=lambda: itertools.count(1000), init=False)
    watch_events: collections.Counter[str] = attrs.field(factory=collections.Counter, init=False)
    # The same events by (plural, namespace of the object): which objects reached a watcher.
    watch_events_in: collections.Counter[tuple[str, str | None]] = attrs.field(
        factory=collections.Counter, init=False)
    received: list[tuple[str, str, str]] = attrs.field(factory=list, init=False)  # (method, path, JSON body)
    _collected: set[Any] = attrs.field(factory=set, init=False)
    _gc_tasks: set[Any] = attrs.field(factory=set, init=False)
    _update_lock: asyncio.Lock = attrs.field(factory=asyncio.Lock, init=False)
    pod_logs: dict[tuple[str, str], str] = attrs.field(factory=dict, init=False)  # (namespace, pod) -> its log

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        for res, info in RESOURCES.items():
            self.resources[res] = info
        # Served before the generic fallbacks: the scale subresource of InferenceDeployments.
        self[kmock.subresource("scale")] << self._serve_scale
        self[kmock.subresource("log")] << self._serve_log

    def _info(self, resource: Any) -> kmock.ResourceInfo | None:
        for res, info in RESOURCES.items():
            if res == resource:
                return info
        return None

    def _key(self, request: rendering.Request) -> Any:
        return (request.resource, request.namespace, request.name)

    def _stamp(self, request: rendering.Request) -> None:
        info = self._info(request.resource)
        rv = str(next(self._counter))
        if request.action == enums.action.CREATE and isinstance(request.data, dict):
            meta = request.data.setdefault("metadata", {})
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", _now())
            meta["resourceVersion"] = rv
            meta.setdefault("generation", 1)
            if request.namespace and not meta.get("namespace"):
                meta["namespace"] = request.namespace
            default = DEFAULTS.get(request.resource.plural)
            if default is not None:
                default(request.data)
        elif request.action == enums.action.UPDATE and isinstance(request.data, list):
            key = self._key(request)
            if key not in self.objects or self.objects[key].deleted:
                return
            self._stamp_json_patch(request, info, self.objects[key].raw, rv)
        elif request.action == enums.action.UPDATE and isinstance(request.data, dict):
            key = self._key(request)
            if key not in self.objects or self.objects[key].deleted:
                return
            current = self.objects[key].raw
            data = request.data
            self._check_precondition(request, current)
            if request.subresource == "status":
                for k in list(data):
                    if k != "status":
                        del data[k]
            elif request.subresource == "scale":
                replicas = (data.get("spec") or {}).get("replicas")
                data.clear()
                data["spec"] = {"replicas": replicas}
                data["metadata"] = {"generation": int((current.get("metadata") or {}).get("generation") or 1) + 1}
            elif request.subresource is None and info is not None and "status" in info.subresources:
                data.pop("status", None)
            if request.subresource is None:
                # What the object becomes, with the server's defaults; KMock stores it through a merge
                # patch, so the request's body is replaced by the patch from the current object to it.
                target = copy.deepcopy(dict(dicts.merge_patch_dict(copy.deepcopy(current), data)))
                default = DEFAULTS.get(request.resource.plural)
                if default is not None:
                    default(target)
                data.clear()
                data.update(_merge_diff(current, target))
                changed = _content(target) != _content(current)
            else:
                changed = False
            meta = data.setdefault("metadata", {})
            meta["resourceVersion"] = rv
            if changed:
                meta["generation"] = int((current.get("metadata") or {}).get("generation") or 1) + 1
        elif request.action == enums.action.DELETE and request.name is not None:
            key = self._key(request)
            if key in self.objects and not self.objects[key].deleted:
                self.objects[key].patch({"metadata": {"resourceVersion": rv}})

    @staticmethod
    def _check_precondition(request: rendering.Request, current: Mapping[str, Any]) -> None:
        """A merge patch that names a resourceVersion applies only to that version, as on a real server
        (the patched object keeps the given version, and the store refuses a stale one)."""
        wanted = (request.data.get("metadata") or {}).get("resourceVersion")
        if wanted and str(wanted) != str((current.get("metadata") or {}).get("resourceVersion")):
            raise kmock.KubernetesError(status=409, reason="Conflict", message=(
                f"Operation cannot be fulfilled on {request.resource.plural} {request.name!r}: the object has "
                "been modified; please apply your changes to the latest version and try again"))

    def _stamp_json_patch(self, request: rendering.Request, info: Any, current: dict[str, Any], rv: str) -> None:
        ops: list[dict[str, Any]] = request.data
        for op in ops:  # optimistic concurrency: a failed test is a 409 Conflict, as on a real server
            if op.get("op") == "test" and _pointer(current, op.get("path", "")) != op.get("value"):
                raise kmock.KubernetesError(status=409, reason="Conflict",
                                            message=f"test of {op.get('path')} failed")
        if request.subresource == "status":
            ops[:] = [op for op in ops if op.get("path", "").startswith("/status")]
        elif request.subresource is None and info is not None and "status" in info.subresources:
            ops[:] = [op for op in ops if not op.get("path", "").startswith("/status")]
        if "metadata" not in current:
            ops.append({"op": "add", "path": "/metadata", "value": {}})
        ops.append({"op": "add", "path": "/metadata/resourceVersion", "value": rv})
        if request.subresource is None and any(op.get("op") != "test" and not op.get("path", "").startswith(
                ("/metadata", "/status")) for op in ops):
            gen = int((current.get("metadata") or {}).get("generation") or 1) + 1
            ops.append({"op": "add", "path": "/metadata/generation", "value": gen})

    async def _serve_list(self, request: rendering.Request) -> Any:
        payload = await super()._serve_list(request)
        info = self._info(request.resource)
        group_version = (f"{request.resource.group}/{request.resource.version}" if request.resource.group
                         else request.resource.version)
        kind = info.kind if info and info.kind else "Object"
        selector = request.params.get("labelSelector")
        if selector:
            payload["items"] = [item for item in payload["items"] if selector_matches(selector, _labels(item))]
        for item in payload["items"]:
            item.setdefault("apiVersion", group_version)
            item.setdefault("kind", kind)
        payload["metadata"] = {"resourceVersion": str(next(self._counter))}
        accept = request.headers.get("Accept", "")
        if "as=Table" in accept and request.resource == INFD and self.printer_columns:
            return self._table(payload["items"])
        return {"apiVersion": group_version, "kind": f"{kind}List", **payload}

    def _table(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        columns = [{"name": "Name", "type": "string", "format": "name", "description": "Name", "priority": 0}]
        columns += [{"name": col["name"], "type": col["type"], "format": "", "description": col.get("description", ""),
                     "priority": col.get("priority", 0)} for col in self.printer_columns]
        rows = []
        for item in items:
            cells = [item["metadata"]["name"]] + [_jsonpath(item, col["jsonPath"]) for col in self.printer_columns]
            partial = {"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                       "metadata": item["metadata"]}
            rows.append({"cells": cells, "object": partial})
        return {"apiVersion": "meta.k8s.io/v1", "kind": "Table", "metadata": {"resourceVersion": "1"},
                "columnDefinitions": columns, "rows": rows}

    async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[Any]:
        since = int(request.params.get("resourceVersion") or 0) if str(
            request.params.get("resourceVersion") or "0").isdigit() else 0
        selector = request.params.get("labelSelector")
        async for event in super()._serve_watch(request):
            if isinstance(event, dict):
                if since and _rv(event.get("object") or {}) <= since:
                    continue
                if selector and not selector_matches(selector, _labels(event.get("object") or {})):
                    continue
                self.watch_events[request.resource.plural] += 1
                namespace = ((event.get("object") or {}).get("metadata") or {}).get("namespace")
                self.watch_events_in[request.resource.plural, namespace] += 1
            yield event

    async def _handle(self, request: rendering.Request) -> Any:
        if request.resource is not None:
            if request.data is not None:  # as the client sent it, before the server's defaults
                self.received.append((request.method.value, request.url.path, json.dumps(request.data)))
            if request.action == enums.action.UPDATE:
                # Check the preconditions and store as one step: another write may not come in between.
                async with self._update_lock:
                    self._stamp(request)
                    try:
                        return await super()._handle(request)
                    finally:
                        self._collect_garbage(request)
            self._stamp(request)
        try:
            return await super()._handle(request)
        finally:
            if request.resource is not None and request.action in (enums.action.DELETE, enums.action.UPDATE):
                self._collect_garbage(request)

    def _collect_garbage(self, request: rendering.Request) -> None:
        """After an object is gone: delete its dependents and, for a Namespace, its contents."""
        key = self._key(request)
        obj = self.objects[key] if key in self.objects else None
        if obj is None or not obj.deleted or not obj.history:
            return
        gone = next((v.raw for v in reversed(obj.history) if v is not None and v.raw), {})
        uid = (gone.get("metadata") or {}).get("uid")
        if not uid or uid in self._collected:
            return
        self._collected.add(uid)
        doomed = []
        for (res, ns, name), child in list(self.objects.items()):
            if child.deleted or (child.raw.get("metadata") or {}).get("deletionTimestamp"):
                continue
            refs = (child.raw.get("metadata") or {}).get("ownerReferences") or []
            if any(ref.get("uid") == uid for ref in refs):
                doomed.append(self._path(res, ns, name))
        if doomed:
            task = asyncio.get_running_loop().create_task(self._delete_all(doomed))
            self._gc_tasks.add(task)
            task.add_done_callback(self._gc_tasks.discard)

    async def add_many(self, resource: Any, objs: list[dict[str, Any]]) -> None:
        """Store objects and announce them to watchers as a create would, without an HTTP request each
        (KMock matches every request against its whole request history: thousands of requests are slow)."""
        default = DEFAULTS.get(resource.plural)
        for obj in objs:
            meta = obj.setdefault("metadata", {})
            meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now(), generation=1,
                        resourceVersion=str(next(self._counter)))
            if default is not None:
                default(obj)
            key = (resource, meta.get("namespace"), meta["name"])
            async with self._lock:
                self._objects[key] = obj
                await self._buses[resource].put({"type": "ADDED", "object": self._objects[key].raw})

    async def delete_namespace(self, namespace: str) -> None:
        """What the namespace controller does (KMock cannot route /api/v1/namespaces/NAME itself):
        delete every object in it through the API, where finalizers hold objects as usual."""
        await self._delete_all([self._path(res, ns, name) for (res, ns, name), obj in list(self.objects.items())
                                if ns == namespace and not obj.deleted and res != EVENTS])

    @staticmethod
    def _path(res: Any, ns: str | None, name: str) -> str:
        root = f"/apis/{res.group}/{res.version}" if res.group else f"/api/{res.version}"
        return f"{root}{f'/namespaces/{ns}' if ns else ''}/{res.plural}/{name}"

    async def _delete_all(self, paths: list[str]) -> None:
        for path in paths:
            await self.delete(path)

    async def _serve_scale(self, request: rendering.Request) -> Any:
        # A PATCH was already applied to .spec.replicas by _stamp + the emulator; render the Scale.
        key = (request.resource, request.namespace, request.name)
        if request.resource != INFD or key not in self.objects or self.objects[key].deleted:
            raise kmock.KubernetesNotFoundError()
        obj = copy.deepcopy(self.objects[key].raw)
        return {
            "apiVersion": "autoscaling/v1", "kind": "Scale",
            "metadata": {k: obj["metadata"].get(k) for k in ("name", "namespace", "uid", "resourceVersion")},
            "spec": {"replicas": (obj.get("spec") or {}).get("replicas", 0)},
            "status": {"replicas": (obj.get("status") or {}).get("replicas", 0),
                       "selector": (obj.get("status") or {}).get("selector", "")},
        }


    def _serve_log(self, request: rendering.Request) -> bytes:
        key = (request.resource, request.namespace, request.name)
        if request.resource != PODS or key not in self.objects or self.objects[key].deleted:
            raise kmock.KubernetesNotFoundError()
        lines = self.pod_logs.get((request.namespace or "", request.name or ""), "").splitlines(keepends=True)
        tail = request.params.get("tailLines")
        return "".join(lines[-int(tail):] if tail and tail.isdigit() else lines).encode()


async def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """Poll `predicate` until it returns something truthy (the event loop keeps serving meanwhile).

    The deadline is generous (a loaded 2-core machine stretches every step); it only bounds how long a
    failing test hangs. Poll for states that last, never for one that lasts a pass: a busy CPU skips it.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last_error: Exception | None = None
    while loop.time() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except (KeyError, ValueError, TypeError, AssertionError) as e:
            last_error = e
        await asyncio.sleep(0.05)
    suffix = f" (last error: {last_error!r})" if last_error else ""
    raise AssertionError(f"timed out after {timeout}s waiting for {what}{suffix}")
