"""spec.router.cors and spec.router.tokenizer: the CRD schema, the operator's parsing, the router flags they
render (read back by `hetero-infer router`'s own parser), and no change for specs without them."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from crd_validation import defaulted, validate
from test_helm_chart import render

from hetero_infer.contracts import cors
from hetero_infer.contracts.router_options import RouterOptions
from hetero_infer.operator import constants as c
from hetero_infer.operator.diff import fingerprint
from hetero_infer.operator.manifests import Owner, children, router_args
from hetero_infer.operator.spec import RouterCorsSpec, SpecError, parse_spec
from hetero_infer.router.cli import resolve_options

OWNER = Owner("smol", "models", "0000-1111")


def resource(**router: Any) -> dict[str, Any]:
    return {"apiVersion": c.API_VERSION, "kind": c.KIND, "metadata": {"name": "smol", "namespace": "models"},
            "spec": {"model": {"name": "smollm2"}, "router": {"enabled": True, **copy.deepcopy(router)}}}


def spec(**router: Any) -> Any:
    return parse_spec(resource(**router)["spec"])


BROWSER_APP = {"allowedOrigins": ["https://app.example.com", "http://localhost:5173"],
               "allowedMethods": ["GET", "POST"], "allowedHeaders": ["Authorization", "Content-Type"],
               "allowCredentials": True}


def test_cors_and_tokenizer_are_parsed() -> None:
    r = spec(cors=BROWSER_APP, tokenizer="none").router
    assert r.cors == RouterCorsSpec(("https://app.example.com", "http://localhost:5173"), ("GET", "POST"),
                                    ("Authorization", "Content-Type"), True)
    assert r.tokenizer == "none"
    plain = spec().router
    assert plain.tokenizer == "workers"
    assert plain.cors == RouterCorsSpec((), ("*",), ("*",), False)


def test_operator_defaults_are_the_routers_and_the_crds(crd: dict[str, Any]) -> None:
    """Flags are left out where the spec holds the defaults: right only if they are the router's own."""
    router, d = RouterOptions(), spec().router
    assert (list(d.cors.allowed_origins), list(d.cors.allowed_methods), list(d.cors.allowed_headers),
            d.cors.allow_credentials, d.tokenizer) == (router.allowed_origins, router.allowed_methods,
                                                       router.allowed_headers, router.allow_credentials,
                                                       router.tokenizer)
    filled = defaulted(crd, resource(cors={}))["spec"]["router"]
    assert filled["tokenizer"] == d.tokenizer
    assert filled["cors"] == {"allowedMethods": list(d.cors.allowed_methods),
                              "allowedHeaders": list(d.cors.allowed_headers),
                              "allowCredentials": d.cors.allow_credentials}


BAD = {
    "credentials with any origin": ({"cors": {"allowedOrigins": ["*"], "allowCredentials": True}},
                                    "allowCredentials"),
    "origin without a scheme": ({"cors": {"allowedOrigins": ["app.example.com"]}}, "allowedOrigins"),
    "origins not an array": ({"cors": {"allowedOrigins": "https://app.example.com"}}, "allowedOrigins"),
    "origin not a string": ({"cors": {"allowedOrigins": [443]}}, "allowedOrigins"),
    "too many origins": ({"cors": {"allowedOrigins": [f"https://a{i}.example.com" for i in range(65)]}},
                         "allowedOrigins"),
    "origin too long": ({"cors": {"allowedOrigins": ["https://" + "a" * 250 + ".com"]}}, "allowedOrigins"),
    "no methods": ({"cors": {"allowedMethods": []}}, "allowedMethods"),
    "blank header": ({"cors": {"allowedHeaders": ["  "]}}, "allowedHeaders"),
    "too many methods": ({"cors": {"allowedMethods": ["GET"] * 17}}, "allowedMethods"),
    "credentials not a boolean": ({"cors": {"allowCredentials": "yes"}}, "allowCredentials"),
    "unknown cors field": ({"cors": {"exposeHeaders": ["X-Request-Id"]}}, "exposeHeaders"),
    "unknown tokenizer": ({"tokenizer": "default"}, "tokenizer"),
    "tokenizer not a string": ({"tokenizer": True}, "tokenizer"),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_schema_rejects_bad_cors_and_tokenizer(crd: dict[str, Any], case: str) -> None:
    router, needle = BAD[case]
    errors = validate(crd, resource(**router))
    assert errors, f"the CRD schema accepted {case}"
    assert any(needle in e for e in errors), errors


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_operator_rejects_the_same_with_the_fields_path(case: str) -> None:
    router, needle = BAD[case]
    with pytest.raises(SpecError) as info:
        spec(**router)
    assert any(p.startswith("spec.router.") and needle in p for p in info.value.problems), info.value.problems


def test_the_good_specs_are_accepted_by_schema_and_operator(crd: dict[str, Any]) -> None:
    for router in ({"cors": BROWSER_APP, "tokenizer": "none"}, {"cors": {"allowedOrigins": ["*"]}},
                   {"cors": {"allowedOrigins": []}}, {"tokenizer": "workers"}, {"cors": {}}):
        assert validate(crd, resource(**router)) == [], router
        spec(**router)


ORIGIN_CASES = [
    (["*"], True), (["*"], False), (["https://a.example.com", "*"], True), (["https://a.example.com"], True),
    ([], True), (["a.example.com"], False), ([""], False), (["http://localhost:8080"], True),
]


@pytest.mark.parametrize(("origins", "credentials"), ORIGIN_CASES)
def test_schema_and_operator_refuse_exactly_what_the_router_refuses(crd: dict[str, Any], origins: list[str],
                                                                     credentials: bool) -> None:
    """The CRD's pattern and CEL rule mirror worker/server/cors.check_options, which the router runs."""
    router_refuses = cors.check_options(origins, ["*"], ["*"], credentials) is not None
    router_cors = {"allowedOrigins": origins, "allowCredentials": credentials}
    assert bool(validate(crd, resource(cors=router_cors))) == router_refuses
    try:
        spec(cors=router_cors)
        operator_refuses = False
    except SpecError:
        operator_refuses = True
    assert operator_refuses == router_refuses


def test_rendered_flags() -> None:
    args = router_args(OWNER, spec(cors=BROWSER_APP, tokenizer="none"))
    assert args[args.index("--shutdown-grace-s") + 2:] == [
        "--allowed-origins", "https://app.example.com", "--allowed-origins", "http://localhost:5173",
        "--allowed-methods", "GET", "--allowed-methods", "POST",
        "--allowed-headers", "Authorization", "--allowed-headers", "Content-Type",
        "--allow-credentials", "--tokenizer", "none",
    ]


@pytest.mark.parametrize("router", [{"cors": BROWSER_APP, "tokenizer": "none"},
                                    {"cors": {"allowedOrigins": ["*"], "allowedHeaders": ["content-type"]}},
                                    {"cors": {"allowedMethods": ["POST"]}, "tokenizer": "workers"}])
def test_the_router_cli_reads_the_rendered_flags_as_the_spec(router: dict[str, Any]) -> None:
    """Contract with `hetero-infer router`: its own parser (and its option checks) reads what the operator
    writes, and gets the spec's values."""
    r = spec(**router).router
    options = resolve_options(router_args(OWNER, spec(**router))[1:], environ={})
    assert options.allowed_origins == list(r.cors.allowed_origins)
    assert options.allowed_methods == list(r.cors.allowed_methods)
    assert options.allowed_headers == list(r.cors.allowed_headers)
    assert options.allow_credentials is r.cors.allow_credentials
    assert options.tokenizer == r.tokenizer


# `hetero-infer router ...` for spec.router {enabled: true}: as rendered before cors and tokenizer existed, plus
# the drain bound (--shutdown-grace-s) that came with the router's preStop and grace period (issue 27).
ARGS_BEFORE = ["router", "--host", "0.0.0.0", "--port", str(c.WORKER_PORT), "--policy", "prefix",
               "--discover-service", "smol-workers", "--namespace", "models", "--hold-timeout-s", "300",
               "--shutdown-grace-s", "300"]


def test_specs_without_the_new_fields_render_the_router_as_before(crd: dict[str, Any]) -> None:
    """No rollout on upgrade: absent fields, the defaults written out and the API server's defaulting of
    them (the stored object, read back through the new CRD) all render the Deployment written before."""
    assert router_args(OWNER, spec()) == ARGS_BEFORE
    before = children(OWNER, spec()).router
    assert before is not None
    for router in ({"cors": {}}, {"tokenizer": "workers"},
                   {"cors": {"allowedOrigins": [], "allowedMethods": ["*"], "allowedHeaders": ["*"],
                             "allowCredentials": False}, "tokenizer": "workers"}):
        for raw in (resource(**router), defaulted(crd, resource(**router)), defaulted(crd, resource())):
            after = children(OWNER, parse_spec(raw["spec"])).router
            assert after is not None
            assert after.deployment == before.deployment, router
            assert fingerprint(after.deployment) == fingerprint(before.deployment)


def test_the_crd_the_chart_installs_takes_the_new_fields(helm_bin: Path, repo_root: Path) -> None:
    docs = render(helm_bin, "--include-crds")
    chart_crd = next(d for d in docs if d.get("kind") == "CustomResourceDefinition"
                     and d["metadata"]["name"] == c.CRD_NAME)
    assert chart_crd == yaml.safe_load((repo_root / "crds" / f"{c.CRD_NAME}.yaml").read_text())
    assert validate(chart_crd, resource(cors=BROWSER_APP, tokenizer="none")) == []
    assert validate(chart_crd, resource(cors={"allowedOrigins": ["*"], "allowCredentials": True}))


def test_the_operator_still_imports_without_torch() -> None:
    """spec.py takes the CORS rules from the worker package: that import must stay torch-free (the operator
    image has no torch)."""
    probe = ("import sys; import hetero_infer.operator.cli, hetero_infer.operator.handlers; "
             "print(sorted(m for m in ('torch', 'transformers', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"
