"""Scale to zero and from zero (minReplicas 0): the pure decision, table cases and properties, and the router
metrics parser against the router's own /metrics output."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero_infer.operator.autoscale.decision import (
    AT_ZERO,
    SCALED_FROM_ZERO,
    SCALED_TO_ZERO,
    History,
    Observation,
    PodSample,
    Policy,
    RouterSample,
    decide,
)
from hetero_infer.operator.autoscale.scrape import ScrapeError, parse_router_metrics
from hetero_infer.operator.spec import parse_spec

POLICY = Policy(min_replicas=0, max_replicas=4, scale_down_stabilization_seconds=60, scale_to_zero_after_seconds=100)
IDLE_POD = PodSample("w-0", ready=True, kv_cache_usage=0.0, queue_depth=0.0, running=0.0)


def router(held: float = 0, in_flight: float = 0, routed: float = 0) -> RouterSample:
    return RouterSample(held=held, in_flight=in_flight, routed=routed)


def obs(current: int, pods: tuple[PodSample, ...] = (), r: RouterSample | None = None) -> Observation:
    return Observation(current_replicas=current, pods=pods, router=r)


@pytest.mark.parametrize(("held", "desired", "reason"), [(0, 0, AT_ZERO), (1, 1, SCALED_FROM_ZERO),
                                                         (7, 1, SCALED_FROM_ZERO)])
def test_at_zero_a_held_request_starts_one_worker(held: float, desired: int, reason: str) -> None:
    d = decide(History(), obs(0, r=router(held=held)), POLICY, now=0)
    assert (d.desired, d.reason) == (desired, reason)


def test_at_zero_without_router_data_nothing_starts_and_scaling_is_inactive() -> None:
    d = decide(History(), obs(0, r=None), POLICY, now=0)
    assert d.desired == 0 and d.active is False


def test_idle_for_the_whole_window_scales_to_zero_and_not_before() -> None:
    h = History()
    for t in (0, 50, 99):
        d = decide(h, obs(1, (IDLE_POD,), router(routed=5)), POLICY, now=t)
        assert d.desired == 1, (t, d.message)
        h = d.history
    d = decide(h, obs(1, (IDLE_POD,), router(routed=5)), POLICY, now=100)
    assert (d.desired, d.reason) == (0, SCALED_TO_ZERO)


@pytest.mark.parametrize("activity", [
    {"r": router(routed=6)},  # a request was routed (and finished) between two passes
    {"r": router(routed=5, in_flight=1)},
    {"r": router(routed=5, held=1)},
    {"pods": (replace(IDLE_POD, running=1.0),)},
    {"pods": (replace(IDLE_POD, queue_depth=2.0),)},
    {"pods": (PodSample("w-0", ready=True, error="timeout: no answer"),)},  # unknown load is not idle
    {"r": None},  # the routers did not answer: unknown is not idle
])
def test_activity_or_missing_data_restarts_the_idle_window(activity: dict) -> None:
    h = decide(History(), obs(1, (IDLE_POD,), router(routed=5)), POLICY, now=0).history
    d = decide(h, obs(1, activity.get("pods", (IDLE_POD,)), activity.get("r", router(routed=5))), POLICY, now=90)
    assert d.desired == 1
    d = decide(d.history, obs(1, (IDLE_POD,), router(routed=d.history.last_routed or 5)), POLICY, now=150)
    assert d.desired == 1, "the window restarted at t=90, so t=150 is only 60 s idle"
    d = decide(d.history, obs(1, (IDLE_POD,), router(routed=d.history.last_routed or 5)), POLICY, now=190)
    assert (d.desired, d.reason) == (0, SCALED_TO_ZERO)


def test_with_replicas_the_ordinary_rules_run_with_a_floor_of_one() -> None:
    busy = tuple(PodSample(f"w-{i}", ready=True, kv_cache_usage=0.1, queue_depth=20.0, running=8.0) for i in range(2))
    d = decide(History(), obs(2, busy, router()), POLICY, now=0)
    assert d.desired == 4  # queue 20 against the default target 5: the HPA formula, capped at max
    quiet = tuple(replace(p, queue_depth=0.0, running=1.0, kv_cache_usage=0.01) for p in busy)
    h = History()
    for t in range(0, 400, 10):
        d = decide(h, obs(2, quiet, router(routed=t)), POLICY, now=t)  # busy, so never to zero
        h = d.history
        assert d.desired >= 1
    assert d.desired == 1


def test_min_replicas_one_keeps_the_old_behaviour() -> None:
    policy = replace(POLICY, min_replicas=1)
    h = History()
    for t in range(0, 1000, 50):
        d = decide(h, obs(1, (IDLE_POD,), router()), policy, now=t)
        h = d.history
        assert d.desired == 1


def test_policy_from_the_spec_carries_min_zero_and_the_window() -> None:
    from hetero_infer.operator.autoscale.decision import policy_from_spec

    s = parse_spec({"model": {"name": "m"}, "router": {"enabled": True},
                    "autoscaling": {"enabled": True, "minReplicas": 0, "maxReplicas": 3,
                                    "scaleToZeroAfterSeconds": 42}})
    p = policy_from_spec(s.autoscaling)
    assert (p.min_replicas, p.max_replicas, p.scale_to_zero_after_seconds) == (0, 3, 42.0)
    with pytest.raises(ValueError):
        Policy(min_replicas=0, max_replicas=0)


@st.composite
def passes(draw: st.DrawFn) -> list[tuple[float, Observation]]:
    """A run of passes at increasing times, each with some size, pods and router state."""
    out, t = [], 0.0
    for _ in range(draw(st.integers(1, 12))):
        t += draw(st.sampled_from([1.0, 5.0, 15.0, 40.0, 120.0]))
        current = draw(st.integers(0, 4))
        pods = tuple(PodSample(f"w-{i}", ready=draw(st.booleans()),
                               kv_cache_usage=draw(st.sampled_from([None, 0.0, 0.5])),
                               queue_depth=draw(st.sampled_from([None, 0.0, 3.0])),
                               running=draw(st.sampled_from([None, 0.0, 2.0])))
                     for i in range(current))
        r = draw(st.one_of(st.none(), st.builds(RouterSample, held=st.sampled_from([0.0, 0.0, 2.0]),
                                                  in_flight=st.sampled_from([0.0, 1.0]),
                                                  routed=st.sampled_from([0.0, 1.0, 2.0]))))
        out.append((t, obs(current, pods, r)))
    return out


@settings(max_examples=60, deadline=None)
@given(passes())
def test_properties_of_scaling_through_zero(run: list[tuple[float, Observation]]) -> None:
    h = History()
    for t, o in run:
        d = decide(h, o, POLICY, now=t)
        h = d.history
        assert 0 <= d.desired <= POLICY.max_replicas
        if o.current_replicas == 0:
            # From zero: only to one, and only for a held request.
            assert d.desired == (1 if o.router is not None and o.router.held > 0 else 0)
        if d.desired == 0 and o.current_replicas > 0:
            # To zero: only with complete data showing nothing going on, after the whole window.
            assert o.router is not None and o.router.held == 0 and o.router.in_flight == 0
            assert all(p.has_data and not p.running and not p.queue_depth for p in o.pods if p.ready)
            assert h.last_active is not None and t - h.last_active >= POLICY.scale_to_zero_after_seconds


def test_router_metrics_parsed_from_the_routers_own_exposition() -> None:
    """The names the router really exports (router/metrics.py), not a copy of them."""
    from prometheus_client import generate_latest

    from hetero_infer.router.metrics import RouterMetrics

    m = RouterMetrics()
    m.held.set(3)
    m.in_flight.labels("http://a").set(2)
    m.in_flight.labels("http://b").set(1)
    m.routed.labels("http://a", "prefix").inc(4)
    m.routed.labels("http://b", "prefix").inc(1)
    sample = parse_router_metrics(generate_latest(m.registry).decode())
    assert sample == RouterSample(held=3.0, in_flight=3.0, routed=5.0)
    with pytest.raises(ScrapeError):
        parse_router_metrics("hetero_infer_num_requests_running 1\n")
