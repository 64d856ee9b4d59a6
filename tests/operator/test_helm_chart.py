"""charts/hetero-infer: `helm lint --strict`, and every rendered object validated against its schema."""

from __future__ import annotations

import json
import re
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from crd_validation import validate as validate_custom_resource

from hetero_infer.operator import constants as c
from hetero_infer.operator import kube
from hetero_infer.operator.cli import build_parser
from hetero_infer.operator.spec import parse_spec

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "hetero-infer"
VALUE_FILES = sorted((CHART / "ci").glob("*-values.yaml"))
K8S_VERSIONS = ["1.30.0", kubernetes_validate.latest_version()]

# prometheus-operator's ServiceMonitor, reduced to the fields this chart uses (no CRD ships offline).
SERVICE_MONITOR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {"type": "object", "required": ["name", "namespace"]},
        "spec": {
            "type": "object", "additionalProperties": False, "required": ["selector", "endpoints"],
            "properties": {
                "jobLabel": {"type": "string"},
                "selector": {"type": "object", "additionalProperties": False,
                             "properties": {"matchLabels": {"type": "object",
                                                            "additionalProperties": {"type": "string"}}}},
                "namespaceSelector": {"type": "object", "additionalProperties": False,
                                      "properties": {"any": {"type": "boolean"},
                                                     "matchNames": {"type": "array", "items": {"type": "string"}}}},
                "endpoints": {"type": "array", "minItems": 1, "items": {
                    "type": "object", "additionalProperties": False,
                    "properties": {"port": {"type": "string"}, "path": {"type": "string"},
                                   "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                                   "scrapeTimeout": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"}}}},
            },
        },
    },
}


def helm(binary: Path, *args: str) -> str:
    proc = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"helm {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def render(binary: Path, *args: str) -> list[dict[str, Any]]:
    out = helm(binary, "template", "rel", str(CHART), "--namespace", "infer", *args)
    return [doc for doc in yaml.safe_load_all(out) if doc]


def chart_crds() -> dict[str, dict[str, Any]]:
    docs = [d for p in sorted((CHART / "crds").glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]
    return {f"{d['spec']['group']}/{d['spec']['names']['kind']}": d for d in docs}


def validate_object(obj: dict[str, Any], crds: dict[str, dict[str, Any]]) -> None:
    group = obj["apiVersion"].split("/")[0] if "/" in obj["apiVersion"] else ""
    key = f"{group}/{obj['kind']}"
    if key in crds:
        assert validate_custom_resource(crds[key], obj) == [], obj
    elif obj["kind"] == "ServiceMonitor":
        jsonschema.validate(obj, SERVICE_MONITOR_SCHEMA)
    else:
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("values", [None, *VALUE_FILES], ids=lambda v: v.name if v else "defaults")
def test_helm_lint_strict(helm_bin: Path, values: Path | None) -> None:
    out = helm(helm_bin, "lint", "--strict", str(CHART), *(["-f", str(values)] if values else []))
    assert "0 chart(s) failed" in out


@pytest.mark.parametrize("values", [None, *VALUE_FILES], ids=lambda v: v.name if v else "defaults")
def test_every_rendered_object_validates(helm_bin: Path, values: Path | None) -> None:
    docs = render(helm_bin, "--include-crds", *(["-f", str(values)] if values else []))
    crds = chart_crds()
    assert docs
    for obj in docs:
        validate_object(obj, crds)


def test_all_optional_parts_render(helm_bin: Path) -> None:
    docs = render(helm_bin, "--include-crds", "-f", str(CHART / "ci" / "all-on-values.yaml"))
    kinds = sorted(f"{d['kind']}/{d['metadata']['name']}" for d in docs)
    assert kinds == sorted([
        "ClusterKopfPeering/rel-hetero-infer", "ClusterRole/rel-hetero-infer-cluster",
        "ClusterRoleBinding/rel-hetero-infer-cluster", "ConfigMap/rel-hetero-infer-adapter-rules",
        "ConfigMap/rel-hetero-infer-dashboard", "CustomResourceDefinition/clusterkopfpeerings.kopf.dev",
        "CustomResourceDefinition/inferencedeployments.hetero-infer.io",
        "CustomResourceDefinition/kopfpeerings.kopf.dev", "Deployment/rel-hetero-infer",
        "NetworkPolicy/rel-hetero-infer", "NetworkPolicy/rel-hetero-infer-workers",
        "ServiceAccount/rel-hetero-infer", "ServiceMonitor/rel-hetero-infer-workers",
    ])
    crd = next(d for d in docs if d["metadata"]["name"] == c.CRD_NAME)
    assert crd == yaml.safe_load((ROOT / "crds" / f"{c.CRD_NAME}.yaml").read_text())

    # The adapter exposes exactly the metrics the operator's HPAs ask for.
    adapter = next(d for d in docs if d["metadata"]["name"].endswith("adapter-rules"))
    rules = yaml.safe_load(adapter["data"]["config.yaml"])["rules"]
    exposed = {r["name"]["as"] for r in rules}
    assert {c.METRIC_KV_CACHE_USAGE, c.METRIC_REQUESTS_WAITING} <= exposed
    for rule in rules:
        assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}

    dashboard = json.loads(next(d for d in docs if d["metadata"]["name"].endswith("dashboard"))["data"]
                           ["hetero-infer.json"])
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    for metric in (c.METRIC_KV_CACHE_USAGE, c.METRIC_REQUESTS_WAITING, c.METRIC_REQUESTS_RUNNING,
                   "hetero_infer_generation_tokens_total", "hetero_infer_time_to_first_token_seconds_bucket",
                   "hetero_infer_inter_token_latency_seconds_bucket"):
        assert metric in exprs, metric
    titles = " ".join(p["title"].lower() for p in dashboard["panels"])
    for word in ("throughput", "first token", "inter-token", "kv-cache", "queue", "replicas"):
        assert word in titles, word


def operator_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    dep = next(d for d in docs if d["kind"] == "Deployment"
               and d["metadata"]["labels"]["app.kubernetes.io/component"] == "operator")  # not the cluster router
    return dep["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize("values", [None, *VALUE_FILES], ids=lambda v: v.name if v else "defaults")
def test_operator_deployment_runs_the_operator_cli(helm_bin: Path, values: Path | None) -> None:
    docs = render(helm_bin, *(["-f", str(values)] if values else []))
    ctr = operator_container(docs)
    assert ctr["command"] == ["hetero-infer"] and ctr["args"][0] == "operator"
    args = build_parser().parse_args(ctr["args"][1:])  # the chart only uses flags the CLI has
    assert args.liveness.endswith("/healthz") and ctr["livenessProbe"]["httpGet"]["path"] == "/healthz"
    sec = ctr["securityContext"]
    assert sec["readOnlyRootFilesystem"] and not sec["allowPrivilegeEscalation"] and sec["capabilities"]["drop"] == [
        "ALL"]
    env = {e["name"]: e for e in ctr["env"]}
    assert "HETERO_INFER_OPERATOR_WORKER_IMAGE" in env and env["POD_ID"]["valueFrom"]
    assert args.peering or args.standalone


def _rules(docs: list[dict[str, Any]]) -> list[tuple[str, str, str, str]]:
    """(namespace or '*', apiGroup, resource, verb) the operator's service account is granted."""
    out = []
    for d in docs:
        if d["kind"] in ("ClusterRole", "Role"):
            scope = d["metadata"].get("namespace", "*") if d["kind"] == "Role" else "*"
            for rule in d["rules"]:
                for g in rule["apiGroups"]:
                    for r in rule["resources"]:
                        for v in rule["verbs"]:
                            out.append((scope, g, r, v))
    return out


def test_rbac_is_least_privilege_and_sufficient(helm_bin: Path) -> None:
    granted = _rules(render(helm_bin))
    assert not any("*" in (g, r, v) for _, g, r, v in granted), "no wildcards"
    assert not any(r in ("secrets", "pods/exec") for _, _, r, _ in granted)
    needed = {("hetero-infer.io", "inferencedeployments", v) for v in ("get", "list", "watch", "patch")}
    needed |= {("hetero-infer.io", "inferencedeployments/status", "patch"), ("", "events", "create"),
               ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
               ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
               ("kopf.dev", "clusterkopfpeerings", "get")}  # peering.py reads it before periodic work
    # kube.CONFIG_MAP: spec.adapters' list, which the workers follow (manifests/adapters.py)
    for kind in (kube.DEPLOYMENT, kube.SERVICE, kube.PDB, kube.HPA, kube.CONFIG_MAP):
        group = kind.api_version.split("/")[0] if "/" in kind.api_version else ""
        needed |= {(group, kind.plural, v) for v in ("get", "list", "watch", "create", "patch", "delete")}
    # spec.router: the operator creates the router's RBAC, and may grant only what it holds itself.
    for kind in (kube.SERVICE_ACCOUNT, kube.ROLE, kube.ROLE_BINDING, kube.INFERENCE_POOL):
        group = kind.api_version.split("/")[0] if "/" in kind.api_version else ""
        needed |= {(group, kind.plural, v) for v in ("get", "create", "patch", "delete")}
    # spec.model.cache: the download Job (created, watched, deleted; never patched), the claim, the Job's pods.
    needed |= {("batch", "jobs", v) for v in ("get", "list", "watch", "create", "delete")}
    needed |= {("", kube.PVC.plural, v) for v in ("get", "list", "watch", "create", "patch", "delete")}
    needed |= {("", "pods", "list"), ("", "pods/log", "get")}
    from hetero_infer.operator.manifests import DISCOVERY_RULES
    needed |= {(g, r, v) for rule in DISCOVERY_RULES for g in rule["apiGroups"] for r in rule["resources"]
               for v in rule["verbs"]}
    have = {(g, r, v) for _, g, r, v in granted}
    assert needed <= have, needed - have
    assert not {v for _, g, r, v in granted if r == "inferencedeployments"} & {"create", "delete", "update"}
    assert not {v for _, g, r, v in granted if g == "rbac.authorization.k8s.io"} & {"escalate", "bind"}
    assert not {v for _, g, r, v in granted if r == "endpointslices"} - {"get", "list", "watch"}


def test_the_router_image_is_pinned_apart_from_the_operators(helm_bin: Path) -> None:
    """Upgrading the operator (image.tag) must not change the routers' image: that would restart every router."""
    def router_image(*sets: str) -> str:
        env = operator_container(render(helm_bin, *sets))["env"]
        return next(e["value"] for e in env if e["name"] == "HETERO_INFER_OPERATOR_ROUTER_IMAGE")

    pinned = router_image()
    assert router_image("--set", "image.tag=9.9") == pinned
    assert router_image("--set", "routerImage=registry.local/router:1") == "registry.local/router:1"
    assert router_image("--set", "routerImage=", "--set", "image.tag=9.9") == "ghcr.io/hetero-infer/operator:9.9"


def test_worker_pull_secrets_reach_the_operator(helm_bin: Path) -> None:
    args = operator_container(render(helm_bin, "--set", "workerImage.pullSecrets={registry,mirror}"))["args"]
    assert [a for a in args if a.startswith("--image-pull-secrets")] == [
        "--image-pull-secrets=registry", "--image-pull-secrets=mirror"]
    assert not [a for a in operator_container(render(helm_bin))["args"] if a.startswith("--image-pull-secrets")]


def test_namespaced_install_uses_roles_and_namespaced_peering(helm_bin: Path) -> None:
    docs = render(helm_bin, "-f", str(CHART / "ci" / "namespaced-values.yaml"))
    granted = _rules(docs)
    cluster_resources = {r for scope, _, r, _ in granted if scope == "*"}
    assert cluster_resources == {"customresourcedefinitions", "namespaces"}
    for ns in ("team-a", "team-b"):
        assert {("apps", "deployments", "create"), ("kopf.dev", "kopfpeerings", "patch"),
                ("kopf.dev", "kopfpeerings", "get")} <= {
            (g, r, v) for scope, g, r, v in granted if scope == ns}
    assert sorted(d["metadata"]["namespace"] for d in docs if d["kind"] == "KopfPeering") == ["team-a", "team-b"]
    args = operator_container(docs)["args"]
    assert "--namespace=team-a" in args and "--namespace=team-b" in args


@pytest.mark.parametrize("bad", ["replicaCount=-1", "image.pullPolicy=Sometimes", "unknownKey=1",
                                 "workerImage.pullSecrets={Not_A_Name}",
                                 "watchNamespaces[0]=Not_A_Namespace"])
def test_values_schema_rejects_bad_values(helm_bin: Path, bad: str) -> None:
    proc = subprocess.run([str(helm_bin), "lint", "--strict", str(CHART), "--set", bad], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0, f"--set {bad} was accepted"


def test_standalone_when_peering_is_off(helm_bin: Path) -> None:
    docs = render(helm_bin, "--set", "peering.enabled=false")
    assert "--standalone" in operator_container(docs)["args"]
    assert not [d for d in docs if "KopfPeering" in d["kind"]]


@pytest.mark.parametrize("sets", [[], ["prometheusAdapter.enabled=true", "watchNamespaces={a,b}"],
                                  ["peering.enabled=false", "replicaCount=2"]])
def test_notes_render(helm_bin: Path, tmp_path: Path, sets: list[str]) -> None:
    """`helm template` skips NOTES.txt; render it through `tpl` in a copy of the chart."""
    import shutil

    chart = tmp_path / "hetero-infer"
    shutil.copytree(CHART, chart)
    (chart / "files" / "NOTES.txt").write_text((CHART / "templates" / "NOTES.txt").read_text())
    (chart / "templates" / "zz-notes.yaml").write_text(
        'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\ndata:\n  notes: |\n'
        '    {{- tpl (.Files.Get "files/NOTES.txt") . | nindent 4 }}\n')
    args = [a for s in sets for a in ("--set", s)]
    out = helm(helm_bin, "template", "rel", str(chart), "--namespace", "infer", "--show-only",
               "templates/zz-notes.yaml", *args)
    notes = yaml.safe_load(out)["data"]["notes"]
    assert "kubectl apply" in notes and "rel-hetero-infer" in notes
    # A chart upgrade does not upgrade the CRD: the notes give the command that does.
    assert "helm show crds" in notes and "kubectl apply --server-side" in notes
    # The InferenceDeployments the notes show (SmolLM2; Llama-3.1-8B-Instruct from the Hub into a shared cache)
    # are accepted by the CRD and the operator.
    shown = [yaml.safe_load(textwrap.dedent(doc)) for doc in re.findall(r"<<YAML\n(.*?)\n\s*YAML", notes, re.S)]
    assert [d["metadata"]["name"] for d in shown] == ["smollm2", "llama-8b"]
    for doc in shown:
        assert validate_custom_resource(yaml.safe_load((CHART / "crds" / f"{c.CRD_NAME}.yaml").read_text()), doc) == []
        parse_spec(doc["spec"], name=doc["metadata"]["name"])
    assert shown[1]["spec"]["model"]["cache"] and shown[1]["spec"]["model"]["credentialsSecret"] == "hf-token"
    if "prometheusAdapter.enabled=true" in sets:
        assert "custom.metrics.k8s.io" in notes and "the namespaces a, b" in notes
    if "peering.enabled=false" in sets:
        assert "WARNING" in notes


def worker_ingress_peers(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"].endswith("-workers"))
    return [peer for rule in policy["spec"]["ingress"] for peer in rule["from"]]


def test_network_policy_admits_the_configured_prometheus(helm_bin: Path) -> None:
    docs = render(helm_bin, "--set", "networkPolicy.enabled=true",
                  "--set", "networkPolicy.prometheus.namespaceSelector.matchLabels.team=observability",
                  "--set", "networkPolicy.prometheus.podSelector.matchLabels.app=prom")
    for obj in docs:
        validate_object(obj, chart_crds())
    peers = worker_ingress_peers(docs)
    assert {"namespaceSelector": {"matchLabels": {"team": "observability",
                                                   "kubernetes.io/metadata.name": "monitoring"}},
            "podSelector": {"matchLabels": {"app": "prom", "app.kubernetes.io/name": "prometheus"}}} in peers
    off = worker_ingress_peers(render(helm_bin, "--set", "networkPolicy.enabled=true",
                                      "--set", "networkPolicy.prometheus.enabled=false"))
    assert not [p for p in off if "monitoring" in str(p.get("namespaceSelector"))]
