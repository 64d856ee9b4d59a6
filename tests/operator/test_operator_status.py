"""observed state -> status, and desired-vs-live comparison (pure functions)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from hetero_infer.operator.diff import differences, merge_patch, parse_quantity, strip_none
from hetero_infer.operator.spec import parse_spec
from hetero_infer.operator.status import (
    Observed,
    compute_status,
    hpa_metrics,
    invalid_spec_status,
    status_changed,
)

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"


def spec(**raw: Any) -> Any:
    return parse_spec({"model": {"name": "m"}, **raw})


def deployment(replicas: int, ready: int, updated: int | None = None, generation: int = 1,
               observed: int = 1, conditions: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    updated = replicas if updated is None else updated
    return {"metadata": {"generation": generation},
            "status": {"replicas": replicas, "readyReplicas": ready, "updatedReplicas": updated,
                       "availableReplicas": ready, "observedGeneration": observed,
                       "conditions": conditions or []}}


def status_of(s: Any, dep: Any = None, hpa: Any = None, previous: Any = None, now: str = T0,
              problems: list[str] | None = None) -> dict[str, Any]:
    return compute_status(spec=s, observed=Observed(generation=3, deployment=dep, hpa=hpa, problems=problems or []),
                          previous=previous, selector="sel", endpoint="http://x/v1", now=now)


def conds(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {cond["type"]: cond for cond in status["conditions"]}


def test_all_ready() -> None:
    st = status_of(spec(replicas=2), deployment(2, 2))
    assert (st["replicas"], st["readyReplicas"], st["desiredReplicas"]) == (2, 2, 2)
    assert st["selector"] == "sel" and st["endpoint"] == "http://x/v1" and st["observedGeneration"] == 3
    cs = conds(st)
    assert cs["Ready"]["status"] == "True" and cs["Progressing"]["status"] == "False"
    assert cs["Degraded"]["status"] == "False" and cs["ScalingActive"]["reason"] == "AutoscalingDisabled"
    assert all(cond["lastTransitionTime"] == T0 and cond["observedGeneration"] == 3 for cond in st["conditions"])


@pytest.mark.parametrize(("dep", "ready", "reason", "progressing"), [
    (None, "False", "DeploymentMissing", "True"),
    (deployment(2, 0), "False", "NoReplicasReady", "True"),
    (deployment(2, 1, updated=1), "False", "PartiallyReady", "True"),
    (deployment(2, 2, generation=2, observed=1), "True", "AllReplicasReady", "True"),
])
def test_ready_and_progressing(dep: Any, ready: str, reason: str, progressing: str) -> None:
    cs = conds(status_of(spec(replicas=2), dep))
    assert (cs["Ready"]["status"], cs["Ready"]["reason"]) == (ready, reason)
    assert cs["Progressing"]["status"] == progressing


def test_scaled_to_zero_is_ready() -> None:
    assert conds(status_of(spec(replicas=0), deployment(0, 0)))["Ready"]["reason"] == "ScaledToZero"


def test_stuck_rollout_is_degraded() -> None:
    stuck = [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded", "message": "too slow"}]
    cs = conds(status_of(spec(), deployment(1, 0, conditions=stuck)))
    assert cs["Degraded"]["status"] == "True" and cs["Degraded"]["reason"] == "RolloutStuck"
    assert cs["Progressing"]["reason"] == "ProgressDeadlineExceeded"


def test_problems_make_degraded() -> None:
    cs = conds(status_of(spec(), deployment(1, 1), problems=["Service x: 403 Forbidden"]))
    assert cs["Degraded"]["status"] == "True" and "403" in cs["Degraded"]["message"]


def test_transition_time_is_kept_while_status_is_unchanged() -> None:
    first = status_of(spec(), deployment(1, 0))
    second = status_of(spec(), deployment(1, 0), previous=first, now=T1)
    assert second == first and not status_changed(first, second)
    third = status_of(spec(), deployment(1, 1), previous=second, now=T1)
    assert conds(third)["Ready"]["lastTransitionTime"] == T1
    assert conds(third)["Degraded"]["lastTransitionTime"] == T0
    assert status_changed(second, third)


def test_hpa_mode_reports_hpa_condition_and_metrics() -> None:
    s = spec(autoscaling={"enabled": True, "mode": "hpa", "maxReplicas": 4})
    hpa = {"status": {"lastScaleTime": T0, "currentMetrics": [
        {"type": "Pods", "pods": {"metric": {"name": "hetero_infer_kv_cache_usage_ratio"},
                                  "current": {"averageValue": "625m"}}},
        {"type": "Pods", "pods": {"metric": {"name": "hetero_infer_num_requests_waiting"},
                                  "current": {"averageValue": "3"}}}],
        "conditions": [{"type": "ScalingActive", "status": "True", "reason": "ValidMetricFound", "message": "ok"}]}}
    st = status_of(s, deployment(1, 1), hpa=hpa, now=T1)
    assert st["metrics"] == {"kvCacheUsage": 0.625, "queueDepth": 3.0, "time": T1}
    assert st["lastScaleTime"] == T0
    assert conds(st)["ScalingActive"]["status"] == "True"
    assert conds(st)["ScalingActive"]["reason"] == "HPAValidMetricFound"
    assert conds(status_of(s, deployment(1, 1)))["ScalingActive"]["status"] == "Unknown"
    assert hpa_metrics(None) == {}


def test_operator_mode_leaves_the_autoscalers_fields_alone() -> None:
    """In mode operator the autoscaler owns ScalingActive, metrics, desiredReplicas and lastScaleTime:
    reconcile's merge patch leaves them out, and its conditions list keeps the autoscaler's entry as is."""
    s = spec(replicas=2, autoscaling={"enabled": True, "maxReplicas": 3})
    first = status_of(s, deployment(2, 2))
    assert set(conds(first)) == {"Ready", "Progressing", "Degraded"}
    assert not {"desiredReplicas", "metrics", "lastScaleTime"} & set(first)
    # Whatever the autoscaler wrote (tests/autoscale), whatever its reason, is carried over untouched.
    theirs = {"type": "ScalingActive", "status": "False", "reason": "AnyReasonAtAll", "message": "m",
              "lastTransitionTime": T0, "observedGeneration": 1}
    previous = dict(first, desiredReplicas=3, lastScaleTime=T0, conditions=[*first["conditions"], theirs],
                    metrics={"kvCacheUsage": 0.5, "queueDepth": 0.0, "time": T0})
    second = status_of(s, deployment(2, 1), previous=previous, now=T1)
    assert conds(second)["ScalingActive"] == theirs
    assert conds(second)["Ready"]["reason"] == "PartiallyReady"
    assert not {"desiredReplicas", "metrics", "lastScaleTime"} & set(second)
    # Turned off: reconcile owns them again, and removes the stale metrics.
    off = status_of(spec(replicas=2), deployment(2, 2), previous=previous, now=T1)
    assert conds(off)["ScalingActive"]["reason"] == "AutoscalingDisabled" and off["metrics"] is None
    assert off["desiredReplicas"] == 2


def test_replica_change_sets_last_scale_time() -> None:
    first = status_of(spec(replicas=1), deployment(1, 1))
    assert "lastScaleTime" not in first
    second = status_of(spec(replicas=3), deployment(1, 1), previous=first, now=T1)
    assert second["lastScaleTime"] == T1


def test_invalid_spec_status() -> None:
    st = invalid_spec_status(previous=None, generation=4, problems=["spec.replicas: must be >= 0"], selector="s",
                             now=T0)
    cs = conds(st)
    assert cs["Degraded"]["status"] == "True" and cs["Degraded"]["reason"] == "InvalidSpec"
    assert "spec.replicas" in cs["Degraded"]["message"] and st["observedGeneration"] == 4


def test_quantities() -> None:
    assert parse_quantity("500m") == Decimal("0.5") and parse_quantity("4Gi") == 4 * 2**30
    assert parse_quantity(2) == 2 and parse_quantity("1e3") == 1000 and parse_quantity("abc") is None
    assert parse_quantity(True) is None


def test_differences_ignore_server_additions_and_equivalent_quantities() -> None:
    desired = {"spec": {"replicas": 2, "template": {"containers": [{"name": "w", "resources": {"cpu": "1000m"},
                                                                    "imagePullPolicy": None}]},
                        "nodeSelector": None, "env": []}}
    live = {"spec": {"replicas": 2, "progressDeadlineSeconds": 600,
                     "template": {"containers": [{"name": "w", "resources": {"cpu": "1"},
                                                  "imagePullPolicy": "IfNotPresent"}]}},
            "status": {"replicas": 2}}
    assert differences(desired, live) == []  # None: the operator does not set it (server default)
    live["spec"]["nodeSelector"] = {"a": "b"}
    live["spec"]["replicas"] = 5
    live["spec"]["env"] = [{"name": "X"}]
    assert differences(desired, live) == [".spec.replicas", ".spec.env"]
    live["spec"]["template"]["containers"].append({"name": "sidecar"})
    assert ".spec.template.containers" in differences(desired, live)


def test_merge_patch_and_strip_none() -> None:
    desired = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x", "namespace": "n", "labels": {"a": "b"}},
               "spec": {"type": "ClusterIP", "externalName": None}}
    assert merge_patch(desired) == {"metadata": {"labels": {"a": "b"}}, "spec": {"type": "ClusterIP",
                                                                                 "externalName": None}}
    assert strip_none(desired)["spec"] == {"type": "ClusterIP"}
