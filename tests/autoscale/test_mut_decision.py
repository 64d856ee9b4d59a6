"""Cases mutation testing of operator/autoscale/decision.py (round 4, docs/testing.md) found unchecked: the
never-against-the-direction rule when fewer pods are listed than requested, a queue of exactly one as activity,
and the recorded fields of the scale-to-zero decisions (the status and events show them)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hetero_infer.operator.autoscale.decision import (
    AT_ZERO,
    QUEUE_DEPTH,
    SCALED_FROM_ZERO,
    SCALED_TO_ZERO,
    History,
    Observation,
    PodSample,
    Policy,
    RouterSample,
    decide,
    signal_recommendation,
)

HPA = Policy(min_replicas=1, max_replicas=100, target_queue_depth=5.0, scale_down_stabilization_seconds=0,
             max_scale_up_factor=1000)
ZERO = Policy(min_replicas=0, max_replicas=4, scale_down_stabilization_seconds=60, scale_to_zero_after_seconds=100)
IDLE_POD = PodSample("w-0", ready=True, kv_cache_usage=0.0, queue_depth=0.0, running=0.0)


def queue_pods(*queues: float, loading: int = 0) -> tuple[PodSample, ...]:
    ready = [PodSample(f"p{i}", True, 0.0, q) for i, q in enumerate(queues)]
    return tuple(ready + [PodSample(f"u{i}", False) for i in range(loading)])


@pytest.mark.parametrize("queue", [7.5, 12.0, 30.0])
def test_high_load_on_fewer_pods_than_requested_never_recommends_fewer(queue: float) -> None:
    # 10 requested, 2 listed (the rest not created yet, counted as 0 on a scale-up): a per-listed-pod formula
    # would give ceil(ratio * 2) < 10 and scale down under load (ratios 1.5, 2.4 and 6)
    rec = signal_recommendation(QUEUE_DEPTH, Observation(10, queue_pods(queue, queue)), HPA)
    assert rec.replicas >= 10, rec


@pytest.mark.parametrize("queue", [15.0, 20.0])
def test_high_load_with_loading_pods_on_fewer_pods_than_requested_never_recommends_fewer(queue: float) -> None:
    # with a loading pod counted as 0 the adjusted ratio is 2.0 and 2.67: still above 1, still never fewer
    rec = signal_recommendation(QUEUE_DEPTH, Observation(10, queue_pods(queue, queue, loading=1)), HPA)
    assert rec.replicas >= 10, rec


def test_a_queue_of_one_request_is_activity() -> None:
    router = RouterSample(held=0, in_flight=0, routed=5)
    h = decide(History(), Observation(1, (IDLE_POD,), router), ZERO, now=0).history
    waiting = replace(IDLE_POD, queue_depth=1.0)
    h = decide(h, Observation(1, (waiting,), router), ZERO, now=90).history
    d = decide(h, Observation(1, (IDLE_POD,), router), ZERO, now=150)
    assert d.desired == 1, "one waiting request at t=90 restarted the idle window"


def test_scaling_from_zero_records_what_it_did() -> None:
    d = decide(History(), Observation(0, (), RouterSample(held=3, in_flight=0, routed=0)), ZERO, now=7)
    assert (d.desired, d.current, d.recommendation, d.reason) == (1, 0, 1, SCALED_FROM_ZERO)
    assert d.history.last_scale_time == 7


@pytest.mark.parametrize(("router", "active", "says"), [
    (RouterSample(held=0, in_flight=0, routed=0), True, "no request held"),
    (None, False, "no router answered"),
])
def test_staying_at_zero_says_why(router: RouterSample | None, active: bool, says: str) -> None:
    d = decide(History(), Observation(0, (), router), ZERO, now=0)
    assert (d.desired, d.current, d.recommendation, d.reason, d.active) == (0, 0, 0, AT_ZERO, active)
    assert says in d.message


def test_scaling_to_zero_records_what_it_did() -> None:
    router = RouterSample(held=0, in_flight=0, routed=5)
    h = decide(History(), Observation(2, (IDLE_POD, replace(IDLE_POD, name="w-1")), router), ZERO, now=0).history
    d = decide(h, Observation(2, (IDLE_POD, replace(IDLE_POD, name="w-1")), router), ZERO, now=100)
    assert (d.desired, d.current, d.recommendation, d.reason) == (0, 2, 0, SCALED_TO_ZERO)
    assert d.history.last_scale_time == 100
