"""Scale from zero in the router's children (pure, and one reconcile pass each way): with minReplicas 0 under the
operator's autoscaler the router gets `--scale-target <its InferenceDeployment>` and its Role gets get/patch on
that one object's scale subresource, nothing more; otherwise both are exactly as before (nothing rolls)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from test_helm_chart import _rules, render
from test_operator_reconcile import FakeClient, infd, run

from hetero_infer.operator import constants as c
from hetero_infer.operator.diff import strip_none
from hetero_infer.operator.manifests import DISCOVERY_RULES, Owner, children
from hetero_infer.operator.spec import parse_spec
from hetero_infer.router.cli import resolve_options

OWNER = Owner("smol", "models", "0000-1111")
ROUTER = {"enabled": True}
TO_ZERO = {"enabled": True, "minReplicas": 0, "maxReplicas": 2}


def spec(**raw: Any) -> Any:
    return parse_spec({"model": {"name": "smollm2"}, **raw})


def granted(role: dict[str, Any]) -> set[tuple[str, str, str, tuple[str, ...]]]:
    return {(g, r, v, tuple(rule.get("resourceNames") or ())) for rule in role["rules"] for g in rule["apiGroups"]
            for r in rule["resources"] for v in rule["verbs"]}


DISCOVERY = {(g, r, v, ()) for rule in DISCOVERY_RULES for g in rule["apiGroups"] for r in rule["resources"]
             for v in rule["verbs"]}


def test_scale_to_zero_gives_the_router_its_target_and_the_scale_of_that_one_object() -> None:
    r = children(OWNER, spec(router=ROUTER, autoscaling=TO_ZERO)).router
    assert r is not None
    args = r.deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    options = resolve_options(args[1:], {})  # the router's own parser reads what the operator writes
    assert (options.scale_target, options.namespace) == ("smol", "models")
    assert granted(r.role) == DISCOVERY | {(c.GROUP, f"{c.PLURAL}/scale", v, ("smol",)) for v in ("get", "patch")}
    for version in ("1.30.0", kubernetes_validate.latest_version()):
        kubernetes_validate.validate(strip_none(r.role), version, strict=True)


@pytest.mark.parametrize("autoscaling", [None, {"enabled": True, "minReplicas": 1, "maxReplicas": 2},
                                         {"enabled": False, "minReplicas": 0, "maxReplicas": 2}],
                         ids=["no autoscaling", "minReplicas 1", "autoscaling off"])
def test_without_scale_to_zero_nothing_changes(autoscaling: dict[str, Any] | None) -> None:
    raw = {"router": ROUTER, **({"autoscaling": autoscaling} if autoscaling else {})}
    r = children(OWNER, spec(**raw)).router
    plain = children(OWNER, spec(router=ROUTER)).router
    assert r is not None and plain is not None
    assert "--scale-target" not in r.deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert r.deployment == plain.deployment and r.role == plain.role  # the same as before the feature: no roll
    assert granted(r.role) == DISCOVERY


def test_reconcile_grants_and_withdraws_the_right_with_min_replicas() -> None:
    client = FakeClient()
    body = infd(client, router=ROUTER, autoscaling=TO_ZERO)
    run(client)
    role = client.objects[("Role", "ns", "smol-router")]
    assert (c.GROUP, f"{c.PLURAL}/scale", "patch", ("smol",)) in granted(role)
    body["spec"]["autoscaling"] = {**TO_ZERO, "minReplicas": 1}
    body["metadata"]["generation"] = 2
    run(client)
    assert granted(client.objects[("Role", "ns", "smol-router")]) == DISCOVERY
    args = client.objects[("Deployment", "ns", "smol-router")]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--scale-target" not in args


def test_the_operator_holds_what_it_grants_the_router(helm_bin: Path) -> None:
    """The API server lets the operator create a Role only with rights it holds itself (RBAC escalation check)."""
    have = {(g, r, v) for _, g, r, v in _rules(render(helm_bin))}
    r = children(OWNER, spec(router=ROUTER, autoscaling=TO_ZERO)).router
    assert r is not None
    wanted = {(g, res, v) for g, res, v, _ in granted(r.role)}
    assert wanted <= have, wanted - have
