"""The operator's own Prometheus metrics (served with `hetero-infer operator --metrics-port`).

They live in their own registry, so tests can run several operators (or read them) in one process.
"""

from __future__ import annotations

import threading
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from hetero_infer.operator.autoscale.decision import Decision

REGISTRY = CollectorRegistry(auto_describe=True)
LABELS = ("namespace", "name")

DECISIONS = Counter(
    "hetero_infer_operator_autoscale_decisions", "Autoscaling decisions, by direction (up, down, none).",
    [*LABELS, "direction"], registry=REGISTRY)
SCRAPE_ERRORS = Counter(
    "hetero_infer_operator_scrape_errors", "Failed scrapes of a ready worker's /metrics, by kind "
    "(timeout, connect, http, parse, missing).", [*LABELS, "kind"], registry=REGISTRY)
LIST_ERRORS = Counter(
    "hetero_infer_operator_pod_list_errors", "Failed pod listings (the API refused or was unreachable).",
    list(LABELS), registry=REGISTRY)
DESIRED = Gauge("hetero_infer_operator_desired_replicas", "Replicas the autoscaler last decided on.",
                list(LABELS), registry=REGISTRY)
CURRENT = Gauge("hetero_infer_operator_current_replicas", "spec.replicas when the autoscaler last looked.",
                list(LABELS), registry=REGISTRY)
OBSERVED = Gauge("hetero_infer_operator_observed_metric", "Last observed per-pod average of a scaling signal "
                 "(kvCacheUsage, queueDepth).", [*LABELS, "signal"], registry=REGISTRY)
TARGET = Gauge("hetero_infer_operator_target_metric", "Target of a scaling signal.", [*LABELS, "signal"],
               registry=REGISTRY)
PODS = Gauge("hetero_infer_operator_pods", "Worker pods seen by the autoscaler, by state "
             "(ready, answered, without_data).", [*LABELS, "state"], registry=REGISTRY)

_server_lock = threading.Lock()
_server: Any = None


def record_decision(namespace: str, name: str, decision: Decision) -> None:
    DECISIONS.labels(namespace, name, decision.direction).inc()
    DESIRED.labels(namespace, name).set(decision.desired)
    CURRENT.labels(namespace, name).set(decision.current)
    for s in decision.signals:
        TARGET.labels(namespace, name, s.signal).set(s.target)
        if s.average is not None:
            OBSERVED.labels(namespace, name, s.signal).set(s.average)


def record_pods(namespace: str, name: str, ready: int, answered: int, without_data: int) -> None:
    PODS.labels(namespace, name, "ready").set(ready)
    PODS.labels(namespace, name, "answered").set(answered)
    PODS.labels(namespace, name, "without_data").set(without_data)


def record_scrape_error(namespace: str, name: str, kind: str) -> None:
    SCRAPE_ERRORS.labels(namespace, name, kind).inc()


def record_list_error(namespace: str, name: str) -> None:
    LIST_ERRORS.labels(namespace, name).inc()


def forget(namespace: str, name: str) -> None:
    """Drop the series of a deleted (or no longer autoscaled) InferenceDeployment."""
    for metric in (DESIRED, CURRENT, OBSERVED, TARGET, PODS, DECISIONS, SCRAPE_ERRORS, LIST_ERRORS):
        for labels in list(metric._metrics):  # prometheus-client has no public "remove matching"
            if labels[:2] == (namespace, name):
                metric.remove(*labels)


def serve(port: int, addr: str = "0.0.0.0") -> None:
    """Serve /metrics on a background thread (once per process)."""
    global _server
    with _server_lock:
        if _server is None:
            _server = start_http_server(port, addr=addr, registry=REGISTRY)
