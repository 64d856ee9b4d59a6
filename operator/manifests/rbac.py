"""The router's identity and rights: a ServiceAccount, a Role that reads EndpointSlices (and, with scale to zero,
gets and patches its InferenceDeployment's scale), their binding."""

from __future__ import annotations

from typing import Any

from hetero_infer.operator import constants as c
from hetero_infer.operator.manifests.common import Owner, metadata, router_name
from hetero_infer.operator.manifests.router import scales_from_zero
from hetero_infer.operator.spec import InferenceSpec


def router_service_account(owner: Owner) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": metadata(owner, router_name(owner.name), c.COMPONENT_ROUTER)}

DISCOVERY_RULES = [{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                    "verbs": ["get", "list", "watch"]}]


SCALE_VERBS = ["get", "patch"]  # read the Scale, then write replicas 1 at the version read (router/scale.py)


def scale_rule(owner: Owner) -> dict[str, Any]:
    """Scale from zero: the scale subresource of this one InferenceDeployment, nothing else of it."""
    return {"apiGroups": [c.GROUP], "resources": [f"{c.PLURAL}/scale"], "resourceNames": [owner.name],
            "verbs": list(SCALE_VERBS)}


def router_role(owner: Owner, spec: InferenceSpec) -> dict[str, Any]:
    """Least privilege: read EndpointSlices in this namespace (their names are generated, so resourceNames
    cannot narrow it further; the router filters by the kubernetes.io/service-name label) and, with scale to
    zero, get and patch the scale of its own InferenceDeployment only."""
    rules = [dict(rule) for rule in DISCOVERY_RULES]
    if scales_from_zero(spec):
        rules.append(scale_rule(owner))
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": metadata(owner, router_name(owner.name), c.COMPONENT_ROUTER),
            "rules": rules}


def router_role_binding(owner: Owner) -> dict[str, Any]:
    name = router_name(owner.name)
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": metadata(owner, name, c.COMPONENT_ROUTER),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": owner.namespace}]}
