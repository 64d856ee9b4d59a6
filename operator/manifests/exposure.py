"""How the Service users call is reached from outside the cluster besides its own type: an Ingress
(spec.service.ingress) or a Gateway API HTTPRoute (spec.service.httpRoute), each to that Service's port, named as
the InferenceDeployment. Pure: the spec in, the manifest (or None: there must be none) out."""

from __future__ import annotations

from typing import Any

from hetero_infer.operator import constants as c
from hetero_infer.operator.diff import spec_keys
from hetero_infer.operator.manifests.common import Owner, metadata
from hetero_infer.operator.spec import InferenceSpec

HTTP_ROUTE_API_VERSION = "gateway.networking.k8s.io/v1"


def ingress(owner: Owner, spec: InferenceSpec) -> dict[str, Any] | None:
    ing = spec.service.ingress
    if ing is None:
        return None
    meta = metadata(owner)
    # the spec's annotations, and which keys are the spec's, so that a key it drops is removed (as the Service's)
    annotations = {**ing.annotations, c.SPEC_KEYS_ANNOTATION: spec_keys({"metadata.annotations": ing.annotations})}
    meta["annotations"] = {k: v for k, v in annotations.items() if v is not None} or None
    backend = {"service": {"name": owner.name, "port": {"number": spec.service.port}}}
    rule: dict[str, Any] = {"http": {"paths": [{"path": ing.path, "pathType": "Prefix", "backend": backend}]}}
    if ing.host is not None:
        rule["host"] = ing.host
    body: dict[str, Any] = {"rules": [rule]}
    if ing.class_name is not None:
        body["ingressClassName"] = ing.class_name
    if ing.tls_secret_name is not None:
        body["tls"] = [{"secretName": ing.tls_secret_name, **({"hosts": [ing.host]} if ing.host else {})}]
    return {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": meta, "spec": body}


def http_route(owner: Owner, spec: InferenceSpec) -> dict[str, Any] | None:
    route = spec.service.http_route
    if route is None:
        return None
    parents = [{"name": p.name, **({"namespace": p.namespace} if p.namespace else {}),
                **({"sectionName": p.section_name} if p.section_name else {})} for p in route.parent_refs]
    body: dict[str, Any] = {
        "parentRefs": parents,
        "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": route.path}}],
                   "backendRefs": [{"name": owner.name, "port": spec.service.port}]}],
    }
    if route.hostnames:
        body["hostnames"] = list(route.hostnames)
    return {"apiVersion": HTTP_ROUTE_API_VERSION, "kind": "HTTPRoute", "metadata": metadata(owner), "spec": body}
