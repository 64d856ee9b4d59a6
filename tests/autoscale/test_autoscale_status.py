"""What one autoscaling pass writes (status, spec.replicas, events, operator metrics), the CLI flags, the
metrics endpoint; a fake API client and fake workers, no kopf."""

from __future__ import annotations

import asyncio
import socket
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import pytest
from autoscale_fakes import FakeWorkers

from hetero_infer.operator import kube
from hetero_infer.operator.autoscale import decision as a
from hetero_infer.operator.autoscale import metrics as opmetrics
from hetero_infer.operator.autoscale.decision import History, Observation, PodSample, Policy, decide
from hetero_infer.operator.autoscale.loop import Autoscaler, autoscale_once, interval_of, replicas_patch
from hetero_infer.operator.cli import build_parser, operator_kwargs
from hetero_infer.operator.manifests import selector_labels
from hetero_infer.operator.status import autoscaler_status

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:00:15Z"
POLICY = Policy(min_replicas=1, max_replicas=4, scale_down_stabilization_seconds=0)


def decision(current: int, kv: float | None, queue: float | None, n: int | None = None) -> a.Decision:
    n = current if n is None else n
    pods = tuple(PodSample(f"p{i}", True, kv, queue) for i in range(n))
    return decide(History(), Observation(current, pods), POLICY, now=0)


def test_autoscaler_status_metrics_condition_and_scale_time() -> None:
    up = decision(1, 0.95, 20.0)
    st = autoscaler_status(previous={}, decision=up, generation=3, now=T0)
    assert st["desiredReplicas"] == 2 and st["lastScaleTime"] == T0
    assert st["metrics"] == {"kvCacheUsage": 0.95, "queueDepth": 20.0, "time": T0}
    [cond] = st["conditions"]
    assert (cond["type"], cond["status"], cond["reason"]) == ("ScalingActive", "True", "ScaledUp")
    assert cond["observedGeneration"] == 3 and "queueDepth 20/5 -> 4" in cond["message"]

    # The same numbers again: the metrics' time and the condition's transition time stay (no write needed
    # when nothing else changed either).
    steady = decision(4, 0.95, 20.0)  # at maxReplicas: no change
    assert steady.reason == a.AT_MAX
    previous = dict(st, desiredReplicas=4, conditions=st["conditions"])
    again = autoscaler_status(previous=previous, decision=steady, generation=3, now=T1)
    assert again["metrics"]["time"] == T0 and "lastScaleTime" not in again
    assert again["conditions"][0]["lastTransitionTime"] == T0

    # No metrics: the last observation stays, ScalingActive turns False.
    none = decision(2, None, None)
    st = autoscaler_status(previous=previous, decision=none, generation=3, now=T1)
    assert "metrics" not in st  # untouched by the merge patch
    assert st["conditions"][0]["status"] == "False" and st["conditions"][0]["reason"] == a.NO_METRICS
    assert st["conditions"][0]["lastTransitionTime"] == T1


def test_replicas_patch_tests_what_it_read() -> None:
    assert replicas_patch({"spec": {"replicas": 2}}, 4) == [
        {"op": "test", "path": "/spec/replicas", "value": 2}, {"op": "replace", "path": "/spec/replicas", "value": 4}]
    assert replicas_patch({"spec": {}}, 1) == [{"op": "add", "path": "/spec/replicas", "value": 1}]


@pytest.mark.parametrize(("raw", "expected"), [(3, 3.0), (None, 15.0), ("5", 15.0), (0, 15.0), (True, 15.0)])
def test_interval_of(raw: Any, expected: float) -> None:
    assert interval_of({"spec": {"autoscaling": {"intervalSeconds": raw}}}) == expected


class FakeApi:
    """The calls autoscale_once makes: list pods, patch status, JSON-patch spec.replicas."""

    def __init__(self, pods: list[dict[str, Any]], conflict: bool = False, list_fails: bool = False) -> None:
        self.pods = pods
        self.conflict = conflict
        self.list_fails = list_fails
        self.status_patches: list[dict[str, Any]] = []
        self.spec_patches: list[list[dict[str, Any]]] = []
        self.queries: list[dict[str, str]] = []

    def request(self, method: str, path: str, body: Any = None, content_type: str | None = None,
                query: dict[str, str] | None = None) -> dict[str, Any]:
        if method == "GET" and path.endswith("/pods"):
            if self.list_fails:
                raise kube.ApiError(403, "Forbidden", "pods is forbidden")
            self.queries.append(dict(query or {}))
            return {"items": self.pods}
        if method == "PATCH" and content_type == "application/json-patch+json":
            if self.conflict:
                raise kube.ApiError(422, "Invalid", "test operation failed")
            self.spec_patches.append(body)
            return {}
        raise AssertionError(f"unexpected {method} {path}")

    def patch(self, kind: kube.Kind, namespace: str, name: str, patch: dict[str, Any],
              subresource: str | None = None) -> dict[str, Any]:
        assert kind == kube.INFERENCE_DEPLOYMENT and subresource == "status"
        self.status_patches.append(patch)
        return {}


def body(replicas: int = 1, **autoscaling: Any) -> dict[str, Any]:
    auto = {"enabled": True, "mode": "operator", "maxReplicas": 4, "scaleDownStabilizationSeconds": 0,
            **autoscaling}
    return {"metadata": {"name": "smol", "namespace": "ns", "generation": 2},
            "spec": {"model": {"name": "m"}, "replicas": replicas, "autoscaling": auto}, "status": {}}


def pod(i: int, port: int, ready: bool = True) -> dict[str, Any]:
    return {"metadata": {"name": f"smol-{i}", "labels": selector_labels("smol")},
            "spec": {"containers": [{"name": "worker", "ports": [{"name": "http", "containerPort": port}]}]},
            "status": {"phase": "Running", "podIP": "127.0.0.1",
                       "conditions": [{"type": "Ready", "status": str(ready)}]}}


@pytest.fixture
async def workers() -> AsyncIterator[FakeWorkers]:
    w = FakeWorkers()
    await w.start(2)
    yield w
    await w.stop()


async def test_one_pass_writes_status_then_replicas_and_an_event(workers: FakeWorkers) -> None:
    workers.set_all(kv=0.95, queue=20.0)
    api = FakeApi([pod(0, workers.ports[0]), pod(1, workers.ports[1], ready=False)])
    recorded: list[tuple[str, str, str]] = []
    result = await autoscale_once(body(replicas=2), api, Autoscaler(), lambda *e: recorded.append(e), now=0.0,
                                  now_iso=T0)
    assert result is not None
    # One ready pod over target and one loading (counted 0): (20 + 0) / 2 / 5 x 2 = 4.
    assert result.decision.desired == 4
    assert api.queries == [{"labelSelector": "app.kubernetes.io/component=worker,hetero-infer.io/inference-deployment=smol"}]
    assert api.status_patches[0]["status"]["desiredReplicas"] == 4
    assert api.spec_patches == [replicas_patch({"spec": {"replicas": 2}}, 4)]
    assert recorded[0][:2] == ("Normal", "ScaledUp") and recorded[0][2].startswith("scaling up from 2 to 4")
    labels = {"namespace": "ns", "name": "smol"}
    assert opmetrics.REGISTRY.get_sample_value("hetero_infer_operator_desired_replicas", labels) == 4
    assert opmetrics.REGISTRY.get_sample_value("hetero_infer_operator_pods", dict(labels, state="ready")) == 1


async def test_one_pass_is_a_no_op_outside_mode_operator_and_on_a_bad_spec() -> None:
    api = FakeApi([])
    for b in (body(mode="hpa"), body(enabled=False), {"metadata": {"name": "x"}, "spec": {"replicas": -1}}):
        assert await autoscale_once(b, api, Autoscaler(), lambda *e: None, now=0) is None
    assert not api.status_patches and not api.spec_patches


async def test_a_concurrent_replicas_change_wins(workers: FakeWorkers) -> None:
    workers.set_all(kv=0.95, queue=20.0)
    api = FakeApi([pod(0, workers.ports[0])], conflict=True)
    recorded: list[Any] = []
    result = await autoscale_once(body(replicas=1), api, Autoscaler(), lambda *e: recorded.append(e), now=0)
    assert result is not None and result.decision.desired == 2
    assert not api.spec_patches and not recorded  # no event for a change that did not happen


async def test_listing_failures_mean_no_metrics_not_a_scale_down() -> None:
    api = FakeApi([], list_fails=True)
    labels = {"namespace": "ns", "name": "smol"}
    before = opmetrics.REGISTRY.get_sample_value("hetero_infer_operator_pod_list_errors_total", labels) or 0
    result = await autoscale_once(body(replicas=3), api, Autoscaler(), lambda *e: None, now=0)
    assert result is not None and result.decision.desired == 3 and result.decision.reason == a.NO_METRICS
    assert opmetrics.REGISTRY.get_sample_value("hetero_infer_operator_pod_list_errors_total", labels) == before + 1


async def test_the_daemon_loop_runs_passes_until_stopped(workers: FakeWorkers,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """scaling.run: one pass per interval on the live body, stops on the flag, forgets its metrics."""
    from hetero_infer.operator.autoscale import loop as autoscale_loop

    class Stopped:
        def __init__(self) -> None:
            self.event = asyncio.Event()

        def __bool__(self) -> bool:
            return self.event.is_set()

        async def wait(self, timeout: float) -> None:
            try:
                await asyncio.wait_for(self.event.wait(), timeout)
            except asyncio.TimeoutError:
                pass

    workers.set_all(kv=0.5, queue=0.0)
    live = body(replicas=1, intervalSeconds=1)
    live["metadata"]["name"] = "loop"
    api = FakeApi([pod(0, workers.ports[0])])
    loop = asyncio.get_running_loop()
    starts: list[float] = []  # each pass's start on the loop's own clock (its `now`)

    async def timed(obj: Any, client: Any, autoscaler: Any, record: Any, now: float, **kwargs: Any) -> Any:
        starts.append(now)
        return await autoscale_once(obj, client, autoscaler, record, now, **kwargs)

    monkeypatch.setattr(autoscale_loop, "autoscale_once", timed)
    stopped = Stopped()
    task = asyncio.create_task(autoscale_loop.run(stopped, live, api, lambda *e: None))
    deadline = loop.time() + 30
    while len(starts) < 3 and loop.time() < deadline:
        await asyncio.sleep(0.05)
    stopped.event.set()
    await asyncio.wait_for(task, 10)
    assert len(starts) >= 3, starts
    # One pass per intervalSeconds: never sooner (a busy machine can only make the gaps longer). The pass
    # starts, not when a pass got to list the pods (a busy machine can delay that by any amount).
    assert all(b - a >= 0.95 for a, b in zip(starts, starts[1:])), starts
    assert len(api.status_patches) >= 1
    labels = {"namespace": "ns", "name": "loop"}
    assert opmetrics.REGISTRY.get_sample_value("hetero_infer_operator_desired_replicas", labels) is None


def test_cli_flags() -> None:
    args = build_parser().parse_args(["--metrics-port", "9100", "--scrape-timeout", "0.5"])
    assert args.metrics_port == 9100 and operator_kwargs(args)["registry"] is not None
    assert build_parser().parse_args([]).metrics_port is None


def test_metrics_endpoint_serves_the_operator_registry() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    opmetrics.serve(port, addr="127.0.0.1")
    opmetrics.record_scrape_error("ns", "served", "timeout")
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert 'hetero_infer_operator_scrape_errors_total{kind="timeout",name="served",namespace="ns"} 1.0' in text
    assert "hetero_infer_operator_autoscale_decisions_total" in text or "# HELP hetero_infer_operator" in text
