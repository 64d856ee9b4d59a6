"""With spec.router users call the router: its Deployment -> status.router, RouterReady, and a Ready that needs
both the workers and the router (compute_status, pure). The operator against KMock is test_router_status_kmock.py."""

from __future__ import annotations

from typing import Any

import pytest
from crd_validation import validate

from hetero_infer.operator import constants as c
from hetero_infer.operator.autoscale.decision import History, Observation, PodSample, Policy, decide
from hetero_infer.operator.spec import parse_spec
from hetero_infer.operator.status import Observed, autoscaler_status, compute_status, status_changed

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"


def spec(router: bool = True, replicas: int = 2, router_replicas: int = 1, **raw: Any) -> Any:
    return parse_spec({"model": {"name": "m"}, "replicas": replicas,
                       "router": {"enabled": router, "replicas": router_replicas, "policy": "least-load"}, **raw})


def dep(replicas: int, available: int, conditions: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A Deployment as the Deployment controller reports it (ready = available: no minReadySeconds)."""
    return {"metadata": {"generation": 1},
            "status": {"replicas": replicas, "readyReplicas": available, "updatedReplicas": replicas,
                       "availableReplicas": available, "observedGeneration": 1, "conditions": conditions or []}}


WORKERS_READY = dep(2, 2)


def status_of(s: Any, workers: Any = WORKERS_READY, router: Any = None, previous: Any = None,
              now: str = T0) -> dict[str, Any]:
    return compute_status(spec=s, observed=Observed(generation=3, deployment=workers, router=router),
                          previous=previous, selector="sel", endpoint="http://x/v1", now=now)


def conds(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {cond["type"]: cond for cond in status["conditions"]}


def test_router_ready_and_workers_ready_is_ready() -> None:
    st = status_of(spec(), router=dep(1, 1))
    cs = conds(st)
    assert (cs["RouterReady"]["status"], cs["RouterReady"]["reason"]) == ("True", "RouterAvailable")
    assert cs["RouterReady"]["message"] == "1/1 router replicas available"
    assert (cs["Ready"]["status"], cs["Ready"]["reason"]) == ("True", "AllReplicasReady")
    assert "workers: 2/2 replicas ready" in cs["Ready"]["message"] and "1/1 router" in cs["Ready"]["message"]
    assert st["router"] == {"replicas": 1, "readyReplicas": 1, "updatedReplicas": 1, "availableReplicas": 1,
                            "policy": "least-load"}
    assert st["readyReplicas"] == 2  # the workers' own numbers stay where they were


@pytest.mark.parametrize(("router", "router_replicas", "reason", "counted"), [
    (None, 1, "DeploymentMissing", "does not exist"),
    (dep(1, 0), 1, "RouterUnavailable", "0/1 router replicas available"),
    (dep(2, 1), 2, "RouterPartiallyAvailable", "1/2 router replicas available (serving)"),
])
def test_workers_ready_but_router_not_is_not_ready_and_says_it_is_the_router(
        router: Any, router_replicas: int, reason: str, counted: str) -> None:
    cs = conds(status_of(spec(router_replicas=router_replicas), router=router))
    assert (cs["RouterReady"]["status"], cs["RouterReady"]["reason"]) == ("False", reason)
    assert counted in cs["RouterReady"]["message"]
    assert (cs["Ready"]["status"], cs["Ready"]["reason"]) == ("False", "RouterNotReady")
    assert cs["Ready"]["message"].startswith("the router is not available: ")
    assert counted in cs["Ready"]["message"] and "workers: 2/2 replicas ready" in cs["Ready"]["message"]


def test_neither_ready_keeps_the_workers_reason_and_names_both() -> None:
    cs = conds(status_of(spec(), workers=dep(2, 0), router=dep(1, 0)))
    assert (cs["Ready"]["status"], cs["Ready"]["reason"]) == ("False", "NoReplicasReady")
    assert "workers: 0/2 replicas ready" in cs["Ready"]["message"]
    assert "0/1 router replicas available" in cs["Ready"]["message"]


def test_workers_partly_ready_with_the_router_ready_is_the_workers_verdict() -> None:
    cs = conds(status_of(spec(), workers=dep(2, 1), router=dep(1, 1)))
    assert (cs["Ready"]["status"], cs["Ready"]["reason"]) == ("False", "PartiallyReady")
    assert cs["RouterReady"]["status"] == "True"


def test_scaled_to_zero_is_ready_only_with_the_router_holding_requests() -> None:
    s = spec(replicas=0, autoscaling={"enabled": True, "minReplicas": 0, "maxReplicas": 2})
    cs = conds(status_of(s, workers=dep(0, 0), router=dep(1, 1)))
    assert (cs["Ready"]["status"], cs["Ready"]["reason"]) == ("True", "ScaledToZero")
    cs = conds(status_of(s, workers=dep(0, 0), router=dep(1, 0)))
    assert (cs["Ready"]["status"], cs["Ready"]["reason"]) == ("False", "RouterNotReady")


def test_router_disabled_has_no_router_status_and_turning_it_off_removes_it() -> None:
    off = status_of(spec(router=False))
    assert "router" not in off and "RouterReady" not in conds(off)
    assert conds(off)["Ready"]["message"] == "2/2 replicas ready"  # exactly as without a router
    on = status_of(spec(), router=dep(1, 1))
    turned_off = status_of(spec(router=False), router=dep(1, 1), previous=on, now=T1)
    assert turned_off["router"] is None  # a merge patch's null: removes the field
    assert "RouterReady" not in conds(turned_off)
    assert status_changed(on, turned_off)
    applied = {k: v for k, v in {**on, **turned_off}.items() if v is not None}  # the merge patch, applied
    again = status_of(spec(router=False), previous=applied, now=T1)
    assert "router" not in again and not status_changed(applied, again)


@pytest.mark.parametrize(("workers", "router", "status", "reason", "message"), [
    (WORKERS_READY, dep(1, 1), "False", "RolloutComplete", "2 replicas up to date"),
    (WORKERS_READY, None, "True", "RouterRollingOut", "router: creating the router Deployment"),
    (WORKERS_READY, dep(1, 0), "True", "RouterRollingOut", "router: 1/1 replicas updated, 0 available, 1 total"),
    (dep(2, 1), dep(1, 0), "True", "RollingOut",
     "2/2 replicas updated, 1 available, 2 total; router: 1/1 replicas updated, 0 available, 1 total"),
])
def test_progressing_covers_the_router_rollout(workers: Any, router: Any, status: str, reason: str,
                                               message: str) -> None:
    progressing = conds(status_of(spec(), workers=workers, router=router))["Progressing"]
    assert (progressing["status"], progressing["reason"], progressing["message"]) == (status, reason, message)


def test_a_router_rolling_to_a_new_generation_is_progressing_while_available() -> None:
    rolling = dep(1, 1)
    rolling["metadata"]["generation"] = 2  # a new image: the controller has not caught up yet
    cs = conds(status_of(spec(), router=rolling))
    assert (cs["Progressing"]["status"], cs["Progressing"]["reason"]) == ("True", "RouterRollingOut")
    assert cs["Ready"]["status"] == "True"  # maxUnavailable 0: it serves throughout


def test_a_stuck_router_rollout_is_degraded() -> None:
    stuck = [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
              "message": 'ReplicaSet "smol-router-1" has timed out progressing.'}]
    cs = conds(status_of(spec(), router=dep(1, 0, conditions=stuck)))
    assert (cs["Degraded"]["status"], cs["Degraded"]["reason"]) == ("True", "RouterRolloutStuck")
    assert "timed out" in cs["Degraded"]["message"]
    assert (cs["Progressing"]["status"], cs["Progressing"]["reason"]) == ("False", "RolloutComplete")  # the workers'
    assert conds(status_of(spec(), router=dep(1, 1)))["Degraded"]["status"] == "False"


def test_unchanged_router_writes_nothing_and_a_flip_moves_only_its_times() -> None:
    first = status_of(spec(), router=dep(1, 0))
    second = status_of(spec(), router=dep(1, 0), previous=first, now=T1)
    assert second == first and not status_changed(first, second)
    third = status_of(spec(), router=dep(1, 1), previous=second, now=T1)
    assert status_changed(second, third)
    cs = conds(third)
    assert cs["RouterReady"]["lastTransitionTime"] == cs["Ready"]["lastTransitionTime"] == T1
    assert cs["Degraded"]["lastTransitionTime"] == T0
    fourth = status_of(spec(), router=dep(1, 1), previous=third, now="2026-01-01T01:00:00Z")
    assert not status_changed(third, fourth)


def test_the_autoscaler_keeps_router_ready() -> None:
    s = spec(autoscaling={"enabled": True, "maxReplicas": 3})
    first = status_of(s, router=dep(1, 1))
    pods = tuple(PodSample(f"p{i}", True, 0.5, 1.0) for i in range(2))
    decision = decide(History(), Observation(2, pods), Policy(min_replicas=1, max_replicas=3), now=0)
    theirs = autoscaler_status(previous=first, decision=decision, generation=3, now=T1)
    assert conds(theirs)["RouterReady"] == conds(first)["RouterReady"]


@pytest.mark.parametrize("router", [None, dep(1, 0), dep(2, 1), dep(1, 1)])
def test_the_crd_status_schema_accepts_what_reconcile_writes(crd: dict[str, Any], router: Any) -> None:
    obj = {"apiVersion": c.API_VERSION, "kind": c.KIND, "metadata": {"name": "smol", "namespace": "ns"},
           "spec": {"model": {"name": "m"}, "router": {"enabled": True}},
           "status": status_of(spec(), router=router)}
    assert validate(crd, obj) == []
