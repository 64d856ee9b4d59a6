"""spec.router.flowControl of an InferenceDeployment: parsed from the CRD's one definition, rendered into the
per-model router's command line only when enabled (a spec without it renders the router as before), and refused
where the router would refuse it."""

from __future__ import annotations

import pytest

from hetero_infer.operator.manifests import Owner
from hetero_infer.operator.manifests.router import router_args
from hetero_infer.operator.spec import SpecError, parse_spec
from hetero_infer.router.cli import resolve_options


def args(router: dict) -> list[str]:
    spec = parse_spec({"model": {"name": "m"}, "router": {"enabled": True, **router}}, "m")
    return router_args(Owner("m", "ns", "uid"), spec)


def test_flow_control_from_the_spec_reaches_the_router():
    rendered = args({"flowControl": {"enabled": True, "maxQueued": 16, "queueTimeoutSeconds": 10,
                                     "tenantHeader": "X-Tenant"}})
    options = resolve_options(rendered[1:], {})
    assert options.flow_control and options.max_queued == 16 and options.queue_timeout_s == 10
    assert options.tenant_header == "X-Tenant"


def test_without_it_or_disabled_the_router_is_rendered_as_before():
    before = args({})
    assert "--flow-control" not in before
    assert args({"flowControl": {"enabled": False, "maxQueued": 3}}) == before
    assert args({"flowControl": {"enabled": True}})[len(before):] == ["--flow-control"]  # the router's defaults


@pytest.mark.parametrize("flow", [{"tenantHeader": "X Tenant"}, {"maxQueued": -1}, {"queueTimeoutSeconds": 0},
                                  {"enabled": "yes"}, {"quota": 3}])
def test_bad_values_are_refused(flow):
    with pytest.raises(SpecError):
        args({"flowControl": {"enabled": True, **flow}})


def test_priority_classes_and_tenant_limits_from_the_spec_reach_the_router():
    rendered = args({"flowControl": {"enabled": True, "priorityClassHeader": "X-Priority-Class",
                                     "priorityClasses": [{"name": "interactive", "priority": 0},
                                                         {"name": "batch", "priority": 10}],
                                     "tenantLimits": [{"tenant": "team-a", "maxInFlight": 2}]}})
    options = resolve_options(rendered[1:], {})
    assert options.priority_classes == {"interactive": 0, "batch": 10}
    assert options.priority_class_header == "X-Priority-Class" and options.tenant_limits == {"team-a": 2}


@pytest.mark.parametrize("flow, problem", [
    ({"priorityClasses": [{"name": "batch", "priority": 10}]}, "priorityClassHeader"),
    ({"priorityClassHeader": "X-C", "priorityClasses": [{"name": "b", "priority": 1}, {"name": "b", "priority": 2}]},
     "priorityClasses\\[1\\].name"),
    ({"tenantLimits": [{"tenant": "a", "maxInFlight": 0}]}, "tenantLimits\\[0\\].maxInFlight"),
    ({"tenantLimits": [{"tenant": "a"}]}, "tenantLimits\\[0\\].maxInFlight"),
])
def test_bad_classes_and_limits_are_refused_with_their_paths(flow, problem):
    with pytest.raises(SpecError, match=problem):
        args({"flowControl": {"enabled": True, **flow}})
