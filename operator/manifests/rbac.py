"""The router's identity and rights: a ServiceAccount, a Role that reads EndpointSlices, their binding."""

from __future__ import annotations

from typing import Any

from hetero_infer.operator import constants as c
from hetero_infer.operator.manifests.common import Owner, metadata, router_name


def router_service_account(owner: Owner) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": metadata(owner, router_name(owner.name), c.COMPONENT_ROUTER)}

DISCOVERY_RULES = [{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                    "verbs": ["get", "list", "watch"]}]


def router_role(owner: Owner) -> dict[str, Any]:
    """Least privilege: read EndpointSlices in this namespace, nothing else (their names are generated, so
    resourceNames cannot narrow it further; the router filters by the kubernetes.io/service-name label)."""
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": metadata(owner, router_name(owner.name), c.COMPONENT_ROUTER),
            "rules": [dict(rule) for rule in DISCOVERY_RULES]}


def router_role_binding(owner: Owner) -> dict[str, Any]:
    name = router_name(owner.name)
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": metadata(owner, name, c.COMPONENT_ROUTER),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": owner.namespace}]}
