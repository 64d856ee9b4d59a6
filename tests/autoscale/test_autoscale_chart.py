"""The chart's part in autoscaling: the operator may list pods, exports its metrics, reaches the workers
through the NetworkPolicy; the adapter rules (mode hpa) serve the same worker metrics the operator reads."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from hetero_infer.operator import constants as c
from hetero_infer.operator.autoscale.scrape import KV_NAMES, WAITING_NAMES
from hetero_infer.operator.cli import build_parser
from hetero_infer.operator.manifests import Owner, horizontal_pod_autoscaler
from hetero_infer.operator.spec import parse_spec

CHART = Path(__file__).resolve().parents[2] / "charts" / "hetero-infer"


def render(helm: Path, *args: str) -> list[dict[str, Any]]:
    proc = subprocess.run([str(helm), "template", "rel", str(CHART), "--namespace", "infer", *args],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def operator_pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]


def test_operator_lists_pods_and_serves_its_metrics(helm_bin: Path) -> None:
    docs = render(helm_bin)
    rules = [r for d in docs if d["kind"] in ("ClusterRole", "Role") for r in d["rules"]]
    pods = [r for r in rules if "pods" in r["resources"] and r["apiGroups"] == [""]]
    assert pods and set(pods[0]["verbs"]) == {"get", "list"}  # read-only, nothing more
    pod = operator_pod(docs)
    ctr = pod["spec"]["containers"][0]
    args = build_parser().parse_args(ctr["args"][1:])
    assert args.metrics_port == 8081 and args.scrape_timeout == 2.0
    assert {"name": "metrics", "containerPort": 8081, "protocol": "TCP"} in ctr["ports"]
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == "8081"

    off = operator_pod(render(helm_bin, "--set", "metrics.enabled=false"))
    args = build_parser().parse_args(off["spec"]["containers"][0]["args"][1:])
    assert args.metrics_port is None and "prometheus.io/scrape" not in off["metadata"]["annotations"]


def test_network_policy_lets_the_operator_scrape_the_workers(helm_bin: Path) -> None:
    docs = render(helm_bin, "--set", "networkPolicy.enabled=true")
    workers = next(d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"].endswith("-workers"))
    operator_labels = operator_pod(docs)["metadata"]["labels"]
    peers = [p for rule in workers["spec"]["ingress"] for p in rule["from"]]
    from_operator = [p for p in peers if "namespaceSelector" in p and "podSelector" in p]
    assert from_operator, peers
    sel = from_operator[0]["podSelector"]["matchLabels"]
    assert all(operator_labels.get(k) == v for k, v in sel.items())
    assert from_operator[0]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "infer"}
    assert any(p["port"] == c.WORKER_PORT for rule in workers["spec"]["ingress"] for p in rule["ports"])
    own = next(d for d in docs if d["kind"] == "NetworkPolicy" and not d["metadata"]["name"].endswith("-workers"))
    assert {p["port"] for p in own["spec"]["ingress"][0]["ports"]} == {8080, 8081}


def test_hpa_mode_and_operator_mode_read_the_same_worker_metrics(helm_bin: Path) -> None:
    docs = render(helm_bin, "--set", "prometheusAdapter.enabled=true")
    adapter = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("adapter-rules"))
    served = {r["name"]["as"] for r in yaml.safe_load(adapter["data"]["config.yaml"])["rules"]}
    spec = parse_spec({"model": {"name": "m"}, "autoscaling": {"enabled": True, "mode": "hpa", "maxReplicas": 3}})
    hpa = horizontal_pod_autoscaler(Owner("m", "ns", "uid"), spec)
    asked = {m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]}
    scraped = {KV_NAMES[0], WAITING_NAMES[0]}
    assert asked == scraped == {c.METRIC_KV_CACHE_USAGE, c.METRIC_REQUESTS_WAITING}
    assert asked <= served
