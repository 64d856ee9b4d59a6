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
