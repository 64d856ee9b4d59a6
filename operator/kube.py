"""A small synchronous Kubernetes REST client over raw dicts.

It takes its credentials from the `kubernetes` package's config loaders (in-cluster service account
or kubeconfig, including exec plugins and token refresh) and speaks plain JSON: get, create, merge
patch, delete. Working with dicts keeps the operator's pure functions free of client model classes,
and an explicit JSON merge patch behaves the same on every client version.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote, urlencode

import urllib3

from hetero_infer.contracts.kube import (  # noqa: F401  (shared with the router)
    SERVICE_ACCOUNT_TOKEN,
    authorization_header,
    in_cluster,
    load_configuration,
)
from hetero_infer.operator import constants as c

MERGE_PATCH = "application/merge-patch+json"
STATUS_WRITE_ATTEMPTS = 5


@dataclass(frozen=True)
class Kind:
    """One resource type: where it lives in the API and what it is called."""

    api_version: str
    kind: str
    plural: str
    namespaced: bool = True

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str | None = None) -> str:
        root = f"/api/{self.api_version}" if "/" not in self.api_version else f"/apis/{self.api_version}"
        if self.namespaced and namespace:
            root += f"/namespaces/{quote(namespace, safe='')}"
        root += f"/{self.plural}"
        if name:
            root += f"/{quote(name, safe='')}"
        if subresource:
            root += f"/{subresource}"
        return root


INFERENCE_DEPLOYMENT = Kind(c.API_VERSION, c.KIND, c.PLURAL)
DEPLOYMENT = Kind("apps/v1", "Deployment", "deployments")
SERVICE = Kind("v1", "Service", "services")
PDB = Kind("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets")
HPA = Kind("autoscaling/v2", "HorizontalPodAutoscaler", "horizontalpodautoscalers")
SERVICE_ACCOUNT = Kind("v1", "ServiceAccount", "serviceaccounts")
ROLE = Kind("rbac.authorization.k8s.io/v1", "Role", "roles")
ROLE_BINDING = Kind("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings")
INFERENCE_POOL = Kind("inference.networking.k8s.io/v1", "InferencePool", "inferencepools")
JOB = Kind("batch/v1", "Job", "jobs")
PVC = Kind("v1", "PersistentVolumeClaim", "persistentvolumeclaims")
POD = Kind("v1", "Pod", "pods")
INGRESS = Kind("networking.k8s.io/v1", "Ingress", "ingresses")
HTTP_ROUTE = Kind("gateway.networking.k8s.io/v1", "HTTPRoute", "httproutes")
CONFIG_MAP = Kind("v1", "ConfigMap", "configmaps")
KINDS_BY_NAME = {k.kind: k for k in (INFERENCE_DEPLOYMENT, DEPLOYMENT, SERVICE, PDB, HPA, SERVICE_ACCOUNT, ROLE,
                                     ROLE_BINDING, INFERENCE_POOL, JOB, PVC, POD, INGRESS, HTTP_ROUTE, CONFIG_MAP)}


def kind_of(manifest: Mapping[str, Any]) -> Kind:
    return KINDS_BY_NAME[manifest["kind"]]


class ApiError(Exception):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409


class Client(Protocol):
    """What the reconciler needs from the API server (a fake implements it in unit tests)."""

    def get(self, kind: Kind, namespace: str, name: str) -> dict[str, Any] | None: ...

    def create(self, kind: Kind, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]: ...

    def patch(self, kind: Kind, namespace: str, name: str, patch: Mapping[str, Any],
              subresource: str | None = None) -> dict[str, Any]: ...

    def delete(self, kind: Kind, namespace: str, name: str) -> bool: ...

    # Used only while a model is downloaded: the download Job's pods (spec.model.cache) or, a url without a cache,
    # the worker pods, and the downloading one's progress.
    def list(self, kind: Kind, namespace: str, label_selector: str) -> list[dict[str, Any]]: ...

    def log(self, namespace: str, pod: str, container: str, tail_lines: int) -> str: ...


class RestClient:
    """`Client` against a real (or emulated) API server."""

    def __init__(self, configuration: Any, timeout: float = 30.0) -> None:
        self._cfg = configuration
        kwargs: dict[str, Any] = {"num_pools": 4, "maxsize": 8}
        if configuration.host.startswith("https"):
            kwargs["cert_reqs"] = "CERT_REQUIRED" if configuration.verify_ssl else "CERT_NONE"
            if configuration.ssl_ca_cert:
                kwargs["ca_certs"] = configuration.ssl_ca_cert
            if configuration.cert_file:
                kwargs["cert_file"] = configuration.cert_file
            if configuration.key_file:
                kwargs["key_file"] = configuration.key_file
            if not configuration.verify_ssl:
                urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
        proxy = getattr(configuration, "proxy", None)
        self._http = urllib3.ProxyManager(proxy, **kwargs) if proxy else urllib3.PoolManager(**kwargs)
        self._timeout = timeout

    @classmethod
    def from_environment(cls) -> RestClient:
        return cls(load_configuration())

    def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": "hetero-infer-operator"}
        if content_type:
            headers["Content-Type"] = content_type
        token = authorization_header(self._cfg)
        if token:
            headers["Authorization"] = token
        return headers

    def _send(self, method: str, path: str, body: Any = None, content_type: str | None = None,
              query: Mapping[str, str] | None = None) -> str:
        url = self._cfg.host.rstrip("/") + path + (f"?{urlencode(query)}" if query else "")
        data = json.dumps(body).encode() if body is not None else None
        if data is not None and content_type is None:
            content_type = "application/json"
        rsp = self._http.request(method, url, body=data, headers=self._headers(content_type),
                                 timeout=self._timeout, retries=False)
        text = rsp.data.decode("utf-8", "replace")
        if rsp.status >= 400:
            try:
                payload = json.loads(text) if text else {}
            except ValueError:
                payload = {}
            payload = payload if isinstance(payload, dict) else {}
            raise ApiError(rsp.status, str(payload.get("reason", rsp.reason)), str(payload.get("message", text)))
        return text

    def request(self, method: str, path: str, body: Any = None, content_type: str | None = None,
                query: Mapping[str, str] | None = None) -> dict[str, Any]:
        text = self._send(method, path, body, content_type, query)
        try:
            return json.loads(text) if text else {}
        except ValueError:
            return {"message": text}

    def get(self, kind: Kind, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.request("GET", kind.path(namespace, name))
        except ApiError as e:
            if e.not_found:
                return None
            raise

    def create(self, kind: Kind, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return self.request("POST", kind.path(namespace), body)

    def patch(self, kind: Kind, namespace: str, name: str, patch: Mapping[str, Any],
              subresource: str | None = None) -> dict[str, Any]:
        return self.request("PATCH", kind.path(namespace, name, subresource), patch, MERGE_PATCH)

    def delete(self, kind: Kind, namespace: str, name: str) -> bool:
        try:
            self.request("DELETE", kind.path(namespace, name), query={"propagationPolicy": "Background"})
            return True
        except ApiError as e:
            if e.not_found:
                return False
            raise

    def list(self, kind: Kind, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        return list(self.request("GET", kind.path(namespace), query={"labelSelector": label_selector})
                    .get("items") or [])

    def log(self, namespace: str, pod: str, container: str, tail_lines: int) -> str:
        """The last lines of a container's log ("" when it has none yet)."""
        return self._send("GET", POD.path(namespace, pod, "log"),
                          query={"container": container, "tailLines": str(tail_lines)})


def patch_status(client: Client, kind: Kind, body: Mapping[str, Any],
                 compute: Callable[[Mapping[str, Any]], Mapping[str, Any] | None],
                 attempts: int = STATUS_WRITE_ATTEMPTS) -> dict[str, Any] | None:
    """Read-modify-write of `.status` under optimistic concurrency (client-go's RetryOnConflict).

    `compute(obj)` returns the status merge patch for that version of the object, or None when there
    is nothing to write. The patch carries the version's `metadata.resourceVersion`, which the API
    server treats as a precondition: if anyone wrote the object since it was read, the write fails
    with 409 Conflict, the object is read again and `compute` runs on the new version. So a writer
    that replaces a list (a merge patch replaces `status.conditions` whole) never drops an entry
    another writer added after its read. Returns the status written, or None (nothing to write, or
    the object is gone). The last 409 is raised when every attempt conflicted.
    """
    meta = body.get("metadata") or {}
    name, ns = meta["name"], meta.get("namespace") or "default"
    for attempt in range(attempts):
        status = compute(body)
        if status is None:
            return None
        version = (body.get("metadata") or {}).get("resourceVersion")
        patch: dict[str, Any] = {"status": dict(status)}
        if version:
            patch["metadata"] = {"resourceVersion": version}
        try:
            client.patch(kind, ns, name, patch, subresource="status")
            return dict(status)
        except ApiError as e:
            if not e.conflict or attempt == attempts - 1:
                raise
        latest = client.get(kind, ns, name)
        if latest is None:
            return None
        body = latest
    return None  # not reached: the loop returns or raises
