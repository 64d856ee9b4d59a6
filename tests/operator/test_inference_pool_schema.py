"""The InferencePool the operator renders (spec.router.inferencePool) against the real upstream CRD.

fixtures/ holds the `inferencepools.inference.networking.k8s.io` CRD of kubernetes-sigs/gateway-api-inference-extension
as released (each file's header names the tag, commit, path and the upstream file's sha256): v1.0.0, the first
`inference.networking.k8s.io/v1` release (endpointPickerRef required there), and v1.6.0, the newest at the time of
writing. The pool is validated the way kube-apiserver would (crd_validation.py: structural defaults, the OpenAPI
schema with unknown fields rejected, the CEL rules), as the operator sends it; and what that server's defaulting
adds must not read as drift (or every resync would patch the pool).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from crd_validation import defaulted, validate

from hetero_infer.operator import constants as c
from hetero_infer.operator import kube
from hetero_infer.operator.diff import differences, strip_none, with_fingerprint
from hetero_infer.operator.manifests import Owner, children
from hetero_infer.operator.spec import MAX_NAME_LENGTH, MAX_NAME_LENGTH_WITH_ROUTER, parse_spec

FIXTURES = sorted((Path(__file__).with_name("fixtures")).glob("inferencepools.inference.networking.k8s.io-*.yaml"))
RELEASES = [p.stem.rsplit("-", 1)[1] for p in FIXTURES]


HEADER = re.compile(r"# tag (?P<tag>\S+), commit (?P<commit>[0-9a-f]{40}),\n# path (?P<path>\S+)\n"
                    r"# sha256 of the upstream file: (?P<sha256>[0-9a-f]{64})\n")


def upstream(path: Path) -> tuple[dict[str, str], str]:
    """(tag, commit, path and sha256 from the header, the upstream file's text as released)."""
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    header = "".join(line for line in lines[:5] if line.startswith("#"))
    found = HEADER.search(header)
    assert found is not None, f"{path.name}: no header naming the tag, commit, path and sha256"
    return found.groupdict(), text[len(header):]


@pytest.fixture(scope="module", params=RELEASES)
def pool_crd(request: pytest.FixtureRequest) -> dict[str, Any]:
    _, body = upstream(FIXTURES[RELEASES.index(request.param)])
    return yaml.safe_load(body)


def test_the_vendored_crds_are_the_released_files_unedited() -> None:
    assert RELEASES == ["v1.0.0", "v1.6.0"]
    for path, release in zip(FIXTURES, RELEASES, strict=True):
        facts, body = upstream(path)
        assert facts["tag"] == release and len(facts["commit"]) == 40
        assert facts["path"] == "config/crd/bases/inference.networking.k8s.io_inferencepools.yaml"
        assert hashlib.sha256(body.encode()).hexdigest() == facts["sha256"]
        assert f"bundle-version: {release}" in body


def test_the_operator_addresses_the_kind_the_crd_defines(pool_crd: dict[str, Any]) -> None:
    spec = pool_crd["spec"]
    version = next(v for v in spec["versions"] if v["storage"])
    assert kube.INFERENCE_POOL.api_version == f"{spec['group']}/{version['name']}" and version["served"]
    assert (kube.INFERENCE_POOL.kind, kube.INFERENCE_POOL.plural) == (spec["names"]["kind"], spec["names"]["plural"])
    assert kube.INFERENCE_POOL.namespaced == (spec["scope"] == "Namespaced")


@pytest.mark.parametrize("version", ["1.30.0", kubernetes_validate.latest_version()])
def test_the_vendored_crd_is_a_valid_customresourcedefinition(pool_crd: dict[str, Any], version: str) -> None:
    kubernetes_validate.validate(pool_crd, version, strict=True)  # so the validation below runs on a real schema


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
    assert live != pool  # the defaulting did add something (appProtocol, the picker's group), so this compares
    assert differences(pool, live) == []


def test_the_pool_selects_the_worker_pods_on_their_port_and_fails_closed() -> None:
    pool = rendered("smol", {"inferencePool": {"endpointPicker": "epp"}})["spec"]
    assert pool["selector"]["matchLabels"] == {c.LABEL_OWNER: "smol", c.LABEL_COMPONENT: c.COMPONENT_WORKER}
    assert pool["targetPorts"] == [{"number": c.WORKER_PORT}]  # the EPP scrapes /metrics on it, too
    assert pool["endpointPickerRef"] == {"kind": "Service", "name": "epp", "port": {"number": 9002},
                                         "failureMode": "FailClose"}


def _with(pool: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {**pool, "spec": {**pool["spec"], **spec}}


BAD = {
    "a target port twice": lambda p: _with(p, targetPorts=[{"number": 3000}, {"number": 3000}]),
    "a Service picker without a port": lambda p: _with(p, endpointPickerRef={"name": "epp"}),
    "an unknown failure mode": lambda p: _with(p, endpointPickerRef={**p["spec"]["endpointPickerRef"],
                                                                     "failureMode": "FailSoft"}),
    "the v1alpha2 shape": lambda p: _with(p, targetPortNumber=3000, extensionRef={"name": "epp"}),
    "a label value that is not one": lambda p: _with(p, selector={"matchLabels": {"app": "-worker-"}}),
    "a port out of range": lambda p: _with(p, targetPorts=[{"number": 70000}]),
    "no selector": lambda p: {**p, "spec": {k: v for k, v in p["spec"].items() if k != "selector"}},
}


@pytest.mark.parametrize("case", list(BAD))
def test_the_real_schema_is_enforced(pool_crd: dict[str, Any], case: str) -> None:
    """Controls: the same validation refuses pools the API server would refuse, so an accepted one means something."""
    assert validate(pool_crd, BAD[case](rendered("smol", {"inferencePool": {"endpointPicker": "epp"}}))) != []
