"""The InferencePool the operator renders (spec.router.inferencePool) against the `inference.networking.k8s.io/v1`
API as released in gateway-api-inference-extension v1.0.0 (the first `v1`; endpointPickerRef required) and v1.6.0.

The API is our transcription (inference_pool_v1.py: schema and CEL rules; the repository holds no third-party
files). The pool is validated the way kube-apiserver would (crd_validation.py: structural defaults, the OpenAPI
schema with unknown fields rejected, the CEL rules), as the operator sends it; and what that server's defaulting
adds must not read as drift (or every resync would patch the pool). Controls: pools the API refuses are refused,
and where the two releases differ each is held to its own rules.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import kubernetes_validate
import pytest
from crd_validation import defaulted, validate
from inference_pool_v1 import RELEASES, crd

from hetero_infer.operator import constants as c
from hetero_infer.operator import kube
from hetero_infer.operator.diff import differences, strip_none, with_fingerprint
from hetero_infer.operator.manifests import Owner, children
from hetero_infer.operator.spec import MAX_NAME_LENGTH, MAX_NAME_LENGTH_WITH_ROUTER, parse_spec


@pytest.fixture(scope="module", params=RELEASES)
def release(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def pool_crd(release: str) -> dict[str, Any]:
    return crd(release)


def test_both_releases_are_transcribed() -> None:
    assert RELEASES == ("v1.0.0", "v1.6.0")


@pytest.mark.parametrize("version", ["1.30.0", kubernetes_validate.latest_version()])
def test_the_transcription_is_a_valid_customresourcedefinition(pool_crd: dict[str, Any], version: str) -> None:
    kubernetes_validate.validate(pool_crd, version, strict=True)  # so the validation below runs on a real schema


def _untyped(schema: Mapping[str, Any], path: str = "") -> list[str]:
    """Nodes without a type (a structural schema, which the server requires of a CRD, has none)."""
    found = [] if "type" in schema else [path or "<root>"]
    for key, sub in (schema.get("properties") or {}).items():
        found += _untyped(sub, f"{path}.{key}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), Mapping):
            found += _untyped(schema[key], f"{path}[{key}]")
    return found


def test_the_transcription_is_structural(pool_crd: dict[str, Any]) -> None:
    assert _untyped(pool_crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]) == []


def test_the_operator_addresses_the_kind_the_crd_defines(pool_crd: dict[str, Any]) -> None:
    spec = pool_crd["spec"]
    version = next(v for v in spec["versions"] if v["storage"])
    assert kube.INFERENCE_POOL.api_version == f"{spec['group']}/{version['name']}" and version["served"]
    assert (kube.INFERENCE_POOL.kind, kube.INFERENCE_POOL.plural) == (spec["names"]["kind"], spec["names"]["plural"])
    assert kube.INFERENCE_POOL.namespaced == (spec["scope"] == "Namespaced")


POOLS = {
    "defaults": ("smol", {"inferencePool": {"endpointPicker": "epp"}}),
    "with the router": ("smol", {"enabled": True, "inferencePool": {"endpointPicker": "llama-epp",
                                                                    "endpointPickerPort": 65535}}),
    "longest name, no router": ("n" * MAX_NAME_LENGTH, {"inferencePool": {"endpointPicker": "e" * 63,
                                                                          "endpointPickerPort": 1}}),
    "longest name with the router": ("r" * MAX_NAME_LENGTH_WITH_ROUTER,
                                     {"enabled": True, "inferencePool": {"endpointPicker": "a-1"}}),
}


def rendered(name: str, router: dict[str, Any]) -> dict[str, Any]:
    """The InferencePool exactly as the operator creates it (reconcile.apply_child)."""
    spec = parse_spec({"model": {"name": "m"}, "router": router}, name=name)
    pool = children(Owner(name, "models", "0000-1111"), spec).inference_pool
    assert pool is not None
    return strip_none(with_fingerprint(pool))


@pytest.mark.parametrize("case", list(POOLS))
def test_the_rendered_pool_is_accepted_and_server_defaults_are_not_drift(pool_crd: dict[str, Any], case: str) -> None:
    pool = rendered(*POOLS[case])
    assert validate(pool_crd, pool) == []
    live = defaulted(pool_crd, pool)  # what the API server stores and the operator reads back
    assert live != pool  # the defaulting did add something (the picker's group; appProtocol), so this compares
    assert differences(pool, live) == []


def test_the_pool_selects_the_worker_pods_on_their_port_and_fails_closed() -> None:
    pool = rendered("smol", {"inferencePool": {"endpointPicker": "epp"}})["spec"]
    assert pool["selector"]["matchLabels"] == {c.LABEL_OWNER: "smol", c.LABEL_COMPONENT: c.COMPONENT_WORKER}
    assert pool["targetPorts"] == [{"number": c.WORKER_PORT}]  # the EPP scrapes /metrics on it, too
    assert pool["endpointPickerRef"] == {"kind": "Service", "name": "epp", "port": {"number": 9002},
                                         "failureMode": "FailClose"}


Edit = Callable[[dict[str, Any]], dict[str, Any]]


def _with(**spec: Any) -> Edit:
    return lambda p: {**p, "spec": {**p["spec"], **spec}}


def _without(field: str) -> Edit:
    return lambda p: {**p, "spec": {k: v for k, v in p["spec"].items() if k != field}}


def _picker(**ref: Any) -> Edit:
    return lambda p: {**p, "spec": {**p["spec"], "endpointPickerRef": {**p["spec"]["endpointPickerRef"], **ref}}}


def _ports(*numbers: int) -> Edit:
    return _with(targetPorts=[{"number": n} for n in numbers])


BAD: dict[str, tuple[Edit, str]] = {  # edit of the rendered pool -> the field the refusal names
    "a target port twice": (_ports(3000, 3000), "targetPorts"),
    "a Service picker without a port": (_with(endpointPickerRef={"name": "epp"}), "endpointPickerRef"),
    "an unknown failure mode": (_picker(failureMode="FailSoft"), "failureMode"),
    "the v1alpha2 shape": (_with(targetPortNumber=3000, extensionRef={"name": "epp"}), "targetPortNumber"),
    "a label value that is not one": (_with(selector={"matchLabels": {"app": "-worker-"}}), "matchLabels"),
    "a label value too long": (_with(selector={"matchLabels": {"app": "w" * 64}}), "matchLabels"),
    "a port out of range": (_ports(70000), "targetPorts"),
    "port zero": (_ports(0), "targetPorts"),
    "no target port": (_ports(), "targetPorts"),
    "nine target ports": (_ports(*range(3000, 3009)), "targetPorts"),
    "a picker port out of range": (_picker(port={"number": 65536}), "endpointPickerRef"),
    "a picker group that is not a DNS name": (_picker(group="Gateway.Networking"), "group"),
    "a picker without a name": (_picker(name=""), "name"),
    "no selector": (_without("selector"), "selector"),
    "no target ports": (_without("targetPorts"), "targetPorts"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_what_the_api_refuses_is_refused(pool_crd: dict[str, Any], case: str) -> None:
    """Controls: the same validation refuses pools the API server would refuse, so an accepted one means something."""
    edit, field = BAD[case]
    errors = validate(pool_crd, edit(rendered("smol", {"inferencePool": {"endpointPicker": "epp"}})))
    assert errors and all(field in e for e in errors), errors


BY_RELEASE: dict[str, tuple[Edit, set[str]]] = {  # edit -> the releases that accept it
    "no endpoint picker": (_without("endpointPickerRef"), {"v1.6.0"}),
    "eight target ports": (_ports(*range(3000, 3008)), {"v1.6.0"}),
    "two ports": (_ports(3000, 3001), {"v1.6.0"}),
    "HTTP/2 without TLS": (_with(appProtocol="kubernetes.io/h2c"), {"v1.6.0"}),
    "HTTP/1.1 said out loud": (_with(appProtocol="http"), {"v1.6.0"}),
    "an empty selector": (_with(selector={"matchLabels": {}}), {"v1.0.0"}),
    "65 labels": (_with(selector={"matchLabels": {f"l{i}": "v" for i in range(65)}}), {"v1.0.0"}),
    "a picker of another kind without a port": (_with(endpointPickerRef={"group": "example.com", "kind": "Picker",
                                                                         "name": "epp"}), {"v1.0.0", "v1.6.0"}),
    "a failing-open picker": (_picker(failureMode="FailOpen"), {"v1.0.0", "v1.6.0"}),
    "an empty label value": (_with(selector={"matchLabels": {"app": ""}}), {"v1.0.0", "v1.6.0"}),
}


@pytest.mark.parametrize("case", list(BY_RELEASE))
def test_each_release_holds_to_its_own_rules(pool_crd: dict[str, Any], release: str, case: str) -> None:
    edit, accepted_by = BY_RELEASE[case]
    errors = validate(pool_crd, edit(rendered("smol", {"inferencePool": {"endpointPicker": "epp"}})))
    assert (errors == []) == (release in accepted_by), errors
