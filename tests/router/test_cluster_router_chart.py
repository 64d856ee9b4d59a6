"""The chart's cluster router (templates/cluster-router.yaml, `clusterRouter.enabled`), rendered by helm: the
command line is one the router's CLI parses into the cluster router, the pods are spread and drained as the
per-model routers' are (2+ replicas, PDB, preStop), and the Role grants exactly what router/cluster.py reads.
(Every rendered object is also validated against its Kubernetes schema by tests/operator/test_helm_chart.py, which
renders each ci/*-values.yaml.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from hetero_infer.router.cli import resolve_options

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "hetero-infer"
OPERATOR_TESTS = ROOT / "tests" / "operator"
if str(OPERATOR_TESTS) not in sys.path:
    sys.path.insert(0, str(OPERATOR_TESTS))

from borrowed_fixtures import operator_fixtures  # noqa: E402

helm_bin = operator_fixtures().helm_bin


def render(helm: Path, *args: str) -> list[dict[str, Any]]:
    proc = subprocess.run([str(helm), "template", "rel", str(CHART), "--namespace", "infer", *args],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def test_off_by_default(helm_bin: Path) -> None:
    assert not [d for d in render(helm_bin) if "cluster-router" in d["metadata"]["name"]]


def test_the_cluster_router_renders_runs_and_is_granted_only_what_it_reads(helm_bin: Path) -> None:
    docs = render(helm_bin, "-f", str(CHART / "ci" / "cluster-router-values.yaml"))
    ours = {d["kind"]: d for d in docs if d["metadata"]["name"] == "rel-hetero-infer-cluster-router"}
    assert sorted(ours) == ["Deployment", "PodDisruptionBudget", "Role", "RoleBinding", "Service", "ServiceAccount"]
    assert {d["metadata"]["namespace"] for d in ours.values()} == {"models"}
    dep = ours["Deployment"]
    pod = dep["spec"]["template"]
    ctr = pod["spec"]["containers"][0]
    assert ctr["command"] == ["hetero-infer"] and ctr["args"][0] == "router"
    options = resolve_options(ctr["args"][1:], {})  # flags the router's CLI has, with the values meant
    assert options.discover_inference_deployments and options.namespace == "models"
    assert options.selector == "team=search" and options.flow_control and options.tenant_header == "X-Tenant"
    assert (options.host, options.port) == ("0.0.0.0", 3000) and options.shutdown_grace_s == options.hold_timeout_s
    # Spread and drained like the per-model routers.
    assert dep["spec"]["replicas"] == 3 and dep["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert ctr["lifecycle"]["preStop"]["sleep"]["seconds"] > 0
    assert pod["spec"]["terminationGracePeriodSeconds"] > options.hold_timeout_s + 5
    labels = pod["metadata"]["labels"]
    for selector in (dep["spec"]["selector"]["matchLabels"], ours["PodDisruptionBudget"]["spec"]["selector"]
                     ["matchLabels"], ours["Service"]["spec"]["selector"]):
        assert selector.items() <= labels.items()
    assert ours["PodDisruptionBudget"]["spec"]["maxUnavailable"] == 1
    assert ctr["readinessProbe"]["httpGet"]["path"] == "/readyz" and ctr["livenessProbe"]["httpGet"]["path"] == "/healthz"
    # RBAC: bound to the pods' service account, in its namespace, nothing beyond what router/cluster.py reads.
    assert pod["spec"]["serviceAccountName"] == ours["ServiceAccount"]["metadata"]["name"]
    binding = ours["RoleBinding"]
    assert binding["roleRef"]["name"] == ours["Role"]["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": ours["ServiceAccount"]["metadata"]["name"],
                                    "namespace": "models"}]
    granted = {(g, r, v) for rule in ours["Role"]["rules"] for g in rule["apiGroups"] for r in rule["resources"]
               for v in rule["verbs"]}
    assert granted == {("hetero-infer.io", "inferencedeployments", v) for v in ("get", "list", "watch")} | {
        ("hetero-infer.io", "inferencedeployments/scale", v) for v in ("get", "patch")} | {
        ("discovery.k8s.io", "endpointslices", v) for v in ("get", "list", "watch")}
