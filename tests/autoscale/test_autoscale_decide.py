"""autoscale.decide: the HPA's documented examples, the rules of the issue, and properties (hypothesis)."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from hetero_infer.operator.autoscale import decision as a
from hetero_infer.operator.autoscale.decision import (
    History,
    Observation,
    PodSample,
    Policy,
    decide,
    signal_recommendation,
)
from hetero_infer.operator.spec import parse_spec


def pods(*values: tuple[float, float] | None, unready: int = 0) -> tuple[PodSample, ...]:
    """Ready pods with (kv, queue) values (None: ready but not answering) plus `unready` loading pods."""
    out = [PodSample(f"p{i}", True, v[0], v[1]) if v is not None else PodSample(f"p{i}", True, error="timeout")
           for i, v in enumerate(values)]
    out += [PodSample(f"u{i}", False) for i in range(unready)]
    return tuple(out)


def obs(current: int, *values: tuple[float, float] | None, unready: int = 0) -> Observation:
    return Observation(current, pods(*values, unready=unready))


# A policy whose KV target stays out of the way (KV 0 recommends nothing above the queue's result), so the
# queue signal can play any HPA Pods metric with an arbitrary target.
def hpa_like(target: float, max_replicas: int = 100, min_replicas: int = 1) -> Policy:
    return Policy(min_replicas=min_replicas, max_replicas=max_replicas, target_queue_depth=target,
                  scale_down_stabilization_seconds=0, max_scale_up_factor=1000)


def queue_only(current: int, *queues: float | None, unready: int = 0) -> Observation:
    return obs(current, *[(0.0, q) if q is not None else None for q in queues], unready=unready)


def hpa_formula(current: int, average: float, target: float, tolerance: float = 0.1) -> int:
    ratio = average / target
    return current if abs(ratio - 1) <= tolerance else math.ceil(current * ratio)


# -- the HPA's documented examples (kubernetes.io, "Horizontal Pod Autoscaling", algorithm details) ---------

@pytest.mark.parametrize(("current", "value", "target", "expected"), [
    (3, 200, 100, 6),  # "200m ... desired 100m: the number of replicas will be doubled"
    (4, 50, 100, 2),  # "50m: you'll halve the number of replicas"
    (4, 105, 100, 4),  # "skips any scaling action if the ratio is sufficiently close to 1.0 (0.1)"
    (4, 91, 100, 4),
    (4, 111, 100, 5),
    (1, 305, 50, 7),  # the HPA walkthrough: 305% CPU against a 50% target, 1 replica -> 7
])
def test_hpa_documented_examples(current: int, value: float, target: float, expected: int) -> None:
    policy = hpa_like(target)
    d = decide(History(), queue_only(current, *[value] * current), policy, now=0.0)
    assert d.signal(a.QUEUE_DEPTH).replicas == expected == hpa_formula(current, value, target)
    assert d.desired == expected


def test_hpa_missing_metrics_count_as_target_on_scale_down_and_zero_on_scale_up() -> None:
    # "assuming those pods were consuming 100% of the desired value in case of a scale down, and 0% in
    # case of a scale up"
    policy = hpa_like(100)
    down = signal_recommendation(a.QUEUE_DEPTH, queue_only(4, 50, 50, 50, None), policy)
    assert down.replicas == math.ceil(4 * (50 + 50 + 50 + 100) / 4 / 100) == 3  # not ceil(3 * 0.5) = 2
    up = signal_recommendation(a.QUEUE_DEPTH, queue_only(4, 200, 200, 200, None), policy)
    assert up.replicas == math.ceil(4 * (200 * 3 + 0) / 4 / 100) == 6  # not ceil(4 x 2) = 8


def test_hpa_not_ready_pods_count_as_zero_on_scale_up() -> None:
    # "the controller conservatively assumes that the not-yet-ready pods are consuming 0% of the desired metric"
    policy = hpa_like(100)
    r = signal_recommendation(a.QUEUE_DEPTH, queue_only(3, 200, 200, unready=1), policy)
    assert r.replicas == math.ceil(3 * (200 + 200 + 0) / 3 / 100) == 4


def test_hpa_no_action_when_the_adjusted_ratio_reverses_or_is_within_tolerance() -> None:
    # "If the new ratio reverses the scale direction, or is within the tolerance, the controller doesn't
    # take any scaling action"
    policy = hpa_like(100)
    assert signal_recommendation(a.QUEUE_DEPTH, queue_only(2, 150, unready=1), policy).replicas == 2  # 75%
    assert signal_recommendation(a.QUEUE_DEPTH, queue_only(2, 210, unready=1), policy).replicas == 2  # 105%
    assert signal_recommendation(a.QUEUE_DEPTH, queue_only(2, 80, None), policy).replicas == 2  # 90%


def test_hpa_largest_of_several_metrics_wins() -> None:
    policy = Policy(min_replicas=1, max_replicas=20, target_kv_cache_usage=0.5, target_queue_depth=5,
                    max_scale_up_factor=100)
    d = decide(History(), obs(2, (1.0, 5.0), (1.0, 5.0)), policy, now=0)  # KV says 4, queue says 2
    assert (d.signal(a.KV_CACHE_USAGE).replicas, d.signal(a.QUEUE_DEPTH).replicas, d.desired) == (4, 2, 4)
    d = decide(History(), obs(2, (0.5, 30.0), (0.5, 30.0)), policy, now=0)  # KV on target, queue says 12
    assert d.desired == 12


def test_hpa_scale_down_uses_the_highest_recommendation_of_the_window() -> None:
    # "the highest recommendation within the window is used" (behavior.scaleDown, 300 s by default)
    policy = Policy(min_replicas=1, max_replicas=10, scale_down_stabilization_seconds=300)
    h = History()
    decided = {}
    for t, kv in ((0, 0.8), (100, 0.32), (200, 0.48), (300, 0.32), (400, 0.32), (500, 0.32)):
        d = decide(h, obs(5, *[(kv, 0.0)] * 5), policy, now=t)  # recommends 5, 2, 3, 2, 2, 2
        h = d.history
        decided[t] = d.desired
    assert decided == {0: 5, 100: 5, 200: 5, 300: 3, 400: 3, 500: 2}


# -- the rules --------------------------------------------------------------------------------------

POLICY = Policy(min_replicas=1, max_replicas=8, target_kv_cache_usage=0.8, target_queue_depth=5,
                scale_down_stabilization_seconds=60)


def test_kv_pressure_scales_up_at_once_at_most_doubling() -> None:
    d = decide(History(), obs(2, (1.0, 0), (1.0, 0)), POLICY, now=0)  # 2 x 1.0/0.8 = 2.5 -> 3
    assert (d.desired, d.reason, d.direction) == (3, a.SCALED_UP, "up")
    d = decide(History(), obs(1, (0.9, 40)), POLICY, now=0)  # queue 40/5 -> 8, at most doubling
    assert d.recommendation == 8 and d.desired == 2 and "at most 2" in d.message


def test_queue_over_target_adds_at_least_one() -> None:
    d = decide(History(), obs(4, (0.5, 6), (0.5, 6), (0.5, 6), (0.5, 6)), POLICY, now=0)  # 4 x 1.2 = 4.8
    assert d.desired == 5


def test_no_change_inside_the_tolerance() -> None:
    d = decide(History(), obs(3, (0.84, 5.4), (0.78, 4.6), (0.8, 5.0)), POLICY, now=0)
    assert d.desired == 3 and d.reason == a.STEADY
    assert all(s.note == "within tolerance" for s in d.signals)


def test_scale_down_only_after_the_window_of_lower_recommendations() -> None:
    h = History()
    busy, idle = (0.8, 5.0), (0.1, 0.0)
    d = decide(h, obs(4, *[busy] * 4), POLICY, now=0)
    h = d.history
    out = []
    for t in range(10, 131, 10):
        d = decide(h, obs(d.desired, *[idle] * d.desired), POLICY, now=t)
        h = d.history
        out.append((t, d.desired, d.reason))
    # Lower recommendations from t=10 on; the busy one at t=0 holds until it leaves the 60 s window.
    assert [r for t, r, _ in out if t < 60] == [4] * 5
    assert all(reason == a.STABILIZING for t, _, reason in out if t < 60)
    assert (out[5][1], out[5][2]) == (1, a.SCALED_DOWN)  # t=60: every recommendation in the window is 1
    assert out[-1][1] == 1 and h.last_scale_time == 60


def test_no_scale_down_before_the_history_spans_the_window() -> None:
    # Right after the operator (re)starts nothing is known about the last window: no scale-down yet.
    h = History()
    for t in (0, 30, 59):
        d = decide(h, obs(4, *[(0.0, 0.0)] * 4), POLICY, now=t)
        h = d.history
        assert d.desired == 4
    assert decide(h, obs(4, *[(0.0, 0.0)] * 4), POLICY, now=60).desired == 1


def test_a_spike_inside_the_window_resets_the_scale_down() -> None:
    h = History()
    quiet, spike = (0.1, 0.0), (0.8, 5.0)
    t = 0
    while True:
        d = decide(h, obs(3, *[spike if t == 50 else quiet] * 3), POLICY, now=t)
        h = d.history
        if d.desired != 3:
            break
        t += 10
    # Quiet from t=0 would scale down at t=60, but the spike's recommendation (3) at t=50 holds until t=110.
    assert (t, d.desired) == (110, 1)


def test_bounds_are_enforced_even_without_metrics() -> None:
    d = decide(History(), obs(12), POLICY, now=0)
    assert (d.desired, d.reason, d.active) == (8, a.BOUNDS, False)
    d = decide(History(), Observation(0), POLICY, now=0)
    assert d.desired == 1
    d = decide(History(), obs(3, (1.0, 100.0), (1.0, 100.0), (1.0, 100.0)),
               Policy(min_replicas=1, max_replicas=4), now=0)
    assert d.desired == 4


def test_loading_pods_count_as_the_target_on_a_scale_down() -> None:
    # Two of four pods answer with a light load, two are loading: those two are assumed at the target,
    # so only the light pods' share can go (4 -> 3, not 4 -> 1), and only after the window.
    o = Observation(4, pods((0.2, 0.0), (0.2, 0.0), unready=2))
    d = decide(History(), o, POLICY, now=0)
    kv = d.signal(a.KV_CACHE_USAGE)
    assert kv.replicas == 3 and "counted as 0.8" in kv.note  # (0.2 + 0.2 + 0.8 + 0.8) / 4 / 0.8 x 4
    assert d.desired == 4
    assert decide(d.history, o, POLICY, now=60).desired == 3


def test_no_scale_down_while_a_ready_pod_does_not_answer() -> None:
    o = Observation(4, pods((0.0, 0.0), (0.0, 0.0), (0.0, 0.0), None))
    h = History()
    for t in range(0, 400, 30):
        d = decide(h, o, POLICY, now=t)
        h = d.history
        assert d.desired == 4
    assert d.reason == a.HELD and d.recommendation == 1 and "did not answer" in d.message
    # A scale-up is not held back by it (the silent pod counts 0 there).
    d = decide(h, Observation(4, pods((1.0, 20.0), (1.0, 20.0), (1.0, 20.0), None)), POLICY, now=500)
    assert d.desired > 4
    # With no answer at all: keep the size, ScalingActive False.
    d = decide(h, Observation(4, pods(None, None, unready=2)), POLICY, now=600)
    assert (d.desired, d.reason, d.active) == (4, a.NO_METRICS, False)
    assert "no metrics" in d.message


def test_a_loading_pod_never_causes_a_scale_up() -> None:
    # One ready pod over target and one loading: the loading pod counts 0, the pair is on target.
    d = decide(History(), obs(2, (0.85, 9.0), unready=1), POLICY, now=0)
    assert d.desired == 2
    # Pods that are requested but not listed yet (just created) count as loading too.
    d = decide(History(), obs(2, (0.85, 9.0)), POLICY, now=0)
    assert d.desired == 2


def test_no_metrics_restarts_the_scale_down_window() -> None:
    h = History()
    d = decide(h, obs(3, *[(0.0, 0.0)] * 3), POLICY, now=0)
    d = decide(d.history, obs(3, None, None, None), POLICY, now=100)  # a gap without data
    d = decide(d.history, obs(3, *[(0.0, 0.0)] * 3), POLICY, now=200)
    assert d.desired == 3  # needs a full window of data again
    d = decide(d.history, obs(3, *[(0.0, 0.0)] * 3), POLICY, now=260)
    assert d.desired == 1


def test_scale_up_stabilization_uses_the_lowest_recommendation_of_its_window() -> None:
    policy = Policy(min_replicas=1, max_replicas=10, scale_up_stabilization_seconds=30,
                    scale_down_stabilization_seconds=0)
    d = decide(History(), obs(2, (0.8, 5.0), (0.8, 5.0)), policy, now=0)
    d = decide(d.history, obs(2, (1.6, 5.0), (1.6, 5.0)), policy, now=10)  # says 4; the window says 2
    assert (d.desired, d.reason) == (2, a.UP_STABILIZING)
    d = decide(d.history, obs(2, (1.6, 5.0), (1.6, 5.0)), policy, now=31)
    assert (d.desired, d.reason) == (4, a.SCALED_UP)


def test_policy_from_spec() -> None:
    spec = parse_spec({"model": {"name": "m"}, "autoscaling": {
        "enabled": True, "minReplicas": 2, "maxReplicas": 6, "targetKVCacheUsage": 0.7, "targetQueueDepth": 3,
        "scaleUpStabilizationSeconds": 5, "scaleDownStabilizationSeconds": 30}})
    p = a.policy_from_spec(spec.autoscaling)
    assert (p.min_replicas, p.max_replicas, p.target_kv_cache_usage, p.target_queue_depth) == (2, 6, 0.7, 3.0)
    assert (p.scale_up_stabilization_seconds, p.scale_down_stabilization_seconds, p.tolerance) == (5.0, 30.0, 0.1)
    with pytest.raises(ValueError):
        a.policy_from_spec(parse_spec({"model": {"name": "m"}}).autoscaling)
    with pytest.raises(ValueError):
        Policy(min_replicas=3, max_replicas=2)


# -- properties -------------------------------------------------------------------------------------------

kv_values = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
queue_values = st.floats(min_value=0.0, max_value=200.0, allow_nan=False)
maybe_pod = st.one_of(st.none(), st.tuples(kv_values, queue_values))


@st.composite
def policies(draw: st.DrawFn) -> Policy:
    lo = draw(st.integers(1, 5))
    hi = draw(st.integers(lo, 12))
    return Policy(min_replicas=lo, max_replicas=hi,
                  target_kv_cache_usage=draw(st.floats(0.05, 1.0)),
                  target_queue_depth=draw(st.floats(0.5, 20.0)),
                  scale_up_stabilization_seconds=draw(st.sampled_from([0.0, 0.0, 10.0])),
                  scale_down_stabilization_seconds=draw(st.sampled_from([0.0, 30.0, 300.0])))


@st.composite
def scenes(draw: st.DrawFn) -> tuple[Policy, History, Observation, float]:
    """A policy, a history of earlier passes, and an observation."""
    policy = draw(policies())
    history = History()
    t = 0.0
    for _ in range(draw(st.integers(0, 6))):
        current = draw(st.integers(0, 14))
        past = Observation(current, pods(*draw(st.lists(maybe_pod, max_size=6)), unready=draw(st.integers(0, 2))))
        history = decide(history, past, policy, now=t).history
        t += draw(st.floats(0.5, 200.0))
    current = draw(st.integers(0, 14))
    o = Observation(current, pods(*draw(st.lists(maybe_pod, max_size=8)), unready=draw(st.integers(0, 3))))
    return policy, history, o, t


@settings(max_examples=300, deadline=None)
@given(scenes())
def test_property_bounds_are_always_respected(scene: tuple[Policy, History, Observation, float]) -> None:
    policy, history, o, t = scene
    d = decide(history, o, policy, now=t)
    assert policy.min_replicas <= d.desired <= policy.max_replicas
    assert policy.min_replicas <= d.recommendation <= policy.max_replicas
    if d.desired > max(o.current_replicas, policy.min_replicas):
        assert d.desired <= policy.scale_up_limit(o.current_replicas)  # at most doubling


@settings(max_examples=300, deadline=None)
@given(scenes(), st.data())
def test_property_monotone_in_load(scene: tuple[Policy, History, Observation, float], data: st.DataObject) -> None:
    """More load on any pod (KV or queue) never gives fewer replicas."""
    policy, history, o, t = scene
    answered = [i for i, p in enumerate(o.pods) if p.has_data]
    if not answered:
        return
    i = data.draw(st.sampled_from(answered))
    p = o.pods[i]
    assert p.kv_cache_usage is not None and p.queue_depth is not None
    heavier = PodSample(p.name, True, min(1.0, p.kv_cache_usage + data.draw(st.floats(0, 1))),
                        p.queue_depth + data.draw(st.floats(0, 50)))
    more = Observation(o.current_replicas, o.pods[:i] + (heavier,) + o.pods[i + 1:])
    assert decide(history, more, policy, now=t).desired >= decide(history, o, policy, now=t).desired


@settings(max_examples=200, deadline=None)
@given(policies(), st.integers(1, 12), st.data())
def test_property_no_change_inside_the_tolerance(policy: Policy, current: int, data: st.DataObject) -> None:
    """Every pod answers and both averages are within 10% of their targets: the size stays."""
    def near(target: float) -> float:
        return target * data.draw(st.floats(0.91, 1.09))

    values = [(near(policy.target_kv_cache_usage), near(policy.target_queue_depth)) for _ in range(current)]
    o = obs(current, *values)
    kv = sum(v[0] for v in values) / current / policy.target_kv_cache_usage
    q = sum(v[1] for v in values) / current / policy.target_queue_depth
    if abs(kv - 1) > 0.1 or abs(q - 1) > 0.1:
        return
    d = decide(History(), o, policy, now=0)
    assert d.desired == policy.bound(current)


@settings(max_examples=200, deadline=None)
@given(policies(), st.integers(1, 12), kv_values, queue_values, st.floats(0, 5000))
def test_property_scale_down_only_after_the_window(policy: Policy, current: int, kv: float, queue: float,
                                                   window_fraction: float) -> None:
    """A scale-down below the current size happens only once the history spans the down-window."""
    if not policy.min_replicas <= current <= policy.max_replicas:
        return
    h = History()
    t = 0.0
    step = max(policy.scale_down_stabilization_seconds / 7, 1.0)
    while True:
        d = decide(h, obs(current, *[(kv, queue)] * current), policy, now=t)
        h = d.history
        if d.desired < current:
            assert t >= policy.scale_down_stabilization_seconds
            break
        if t > policy.scale_down_stabilization_seconds + 2 * step:
            # Not scaled down after the window: the recommendation was never lower.
            assert d.recommendation >= current
            break
        t += step


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 20), st.floats(0.01, 100), st.floats(0.01, 100))
def test_property_same_as_the_hpa_formula_when_every_pod_answers(current: int, value: float, target: float) -> None:
    ratio = value / target
    assume(abs(abs(ratio - 1) - 0.1) > 1e-9)  # not exactly on the tolerance's edge (float rounding)
    assume(abs(current * ratio - round(current * ratio)) > 1e-6)  # nor exactly on an integer
    policy = Policy(min_replicas=1, max_replicas=1_000_000, target_queue_depth=target,
                    scale_down_stabilization_seconds=0, max_scale_up_factor=1e9)
    d = decide(History(), queue_only(current, *[value] * current), policy, now=0)
    assert d.signal(a.QUEUE_DEPTH).replicas == hpa_formula(current, value, target)
    assert d.desired == max(1, hpa_formula(current, value, target))


def test_decisions_are_pure() -> None:
    h = History()
    o = obs(2, (0.9, 7.0), (0.9, 7.0))
    assert decide(h, o, POLICY, now=5) == decide(h, o, POLICY, now=5)
    assert h == History()  # the input history is not changed


# -- edge cases that mutation testing found unchecked (docs/testing.md) ---------------------------------

def test_a_surge_never_recommends_against_the_direction_of_the_load():
    # 4 pods listed for 2 requested (a rollout surge), all answering, all below target: the per-pod
    # formula would say 4 replicas, but a load below target never recommends growing
    low = signal_recommendation(a.QUEUE_DEPTH, queue_only(2, 4, 4, 4, 4), hpa_like(5))
    assert (low.ratio, low.replicas) == (pytest.approx(0.8), 2)


def test_no_metrics_touches_the_last_scale_time_only_when_it_moves_replicas():
    before = History(last_scale_time=10.0)
    kept = decide(before, queue_only(2, None), hpa_like(5, max_replicas=3), now=50.0)
    assert (kept.desired, kept.history.last_scale_time) == (2, 10.0)
    moved = decide(before, queue_only(5, None), hpa_like(5, max_replicas=3), now=50.0)
    assert (moved.desired, moved.history.last_scale_time) == (3, 50.0)


def test_limited_names_the_bounds_only_when_they_cut_the_recommendation():
    free = decide(History(), queue_only(2, 10, 10), hpa_like(5, max_replicas=10), now=0.0)
    assert (free.desired, free.limited) == (4, [])
    capped = decide(History(), queue_only(2, 10, 10), hpa_like(5, max_replicas=3), now=0.0)
    assert capped.desired == 3 and capped.limited == ["bounded to [1, 3]"]


def test_the_down_window_remembers_a_recommendation_until_it_ends():
    policy = Policy(min_replicas=1, max_replicas=10, target_queue_depth=5, scale_down_stabilization_seconds=10)
    history = History(recommendations=((0.0, 4),), since=-100.0)
    held = decide(history, queue_only(4, 0, 0, 0, 0), policy, now=9.5)  # t=0's 4 is 9.5 s old: still counts
    assert (held.desired, held.reason) == (4, a.STABILIZING)
    later = decide(history, queue_only(4, 0, 0, 0, 0), policy, now=10.5)
    assert later.desired == 1


def test_a_scale_up_to_exactly_the_rate_limit_is_not_reported_as_limited():
    policy = Policy(min_replicas=1, max_replicas=10, target_queue_depth=5, scale_down_stabilization_seconds=0)
    d = decide(History(), queue_only(2, 10, 10), policy, now=0.0)  # 4 recommended, 4 = twice 2 allowed
    assert (d.desired, d.limited) == (4, [])


def test_the_message_gives_each_signal_its_note():
    d = decide(History(), queue_only(2, 5, 5), hpa_like(5), now=0.0)
    assert f"{a.QUEUE_DEPTH} 5/5 -> 2 (within tolerance)" in d.message
    assert f"{a.KV_CACHE_USAGE} 0/0.8 -> 0;" in d.message  # no note, no parentheses


def test_missing_pods_count_as_idle_when_the_load_is_high():
    # 6 requested, 2 answer at 19 (target 5), 4 without data count as 0: 38 / 30 -> 1.27 -> 8 replicas
    r = signal_recommendation(a.QUEUE_DEPTH, queue_only(6, 19, 19), hpa_like(5))
    assert r.replicas == 8


def test_an_unanswered_pod_holds_only_a_scale_down():
    d = decide(History(), queue_only(3, 5, 5, 5, None), hpa_like(5), now=0.0)
    assert (d.desired, d.reason) == (3, a.STEADY)


def test_a_bounded_recommendation_still_stabilizes_before_going_down():
    policy = Policy(min_replicas=2, max_replicas=10, target_queue_depth=5, scale_down_stabilization_seconds=300)
    d = decide(History(), queue_only(4, 0, 0, 0, 0), policy, now=0.0)  # 0 load: raw 0, bounded to 2
    assert (d.desired, d.recommendation, d.reason) == (4, 2, a.STABILIZING)


def test_at_the_bounds_the_reason_names_which_one():
    policy = Policy(min_replicas=2, max_replicas=3, target_queue_depth=5, scale_down_stabilization_seconds=0)
    assert decide(History(), queue_only(3, 50, 50, 50), policy, now=0.0).reason == a.AT_MAX
    assert decide(History(), queue_only(2, 0, 0), policy, now=0.0).reason == a.AT_MIN


def test_the_tolerance_is_inclusive_like_the_hpa():
    # |ratio - 1| == tolerance counts as within it (Kubernetes: math.Abs(1.0-usageRatio) <= tolerance)
    policy = Policy(min_replicas=1, max_replicas=10, target_queue_depth=4, tolerance=0.5)
    assert signal_recommendation(a.QUEUE_DEPTH, queue_only(2, 6, 6), policy).replicas == 2
    # with a pod missing (cautious branch): 2 answer at 9, 1 missing counts as 0 -> 18 / 3 / 4 = 1.5
    assert signal_recommendation(a.QUEUE_DEPTH, queue_only(3, 9, 9), policy).replicas == 3


def test_cautious_counting_scales_up_while_the_load_stays_above_target():
    # 3 requested, 2 answer at 9 (1.8x of 5), 1 missing counts as 0: 18 / 3 / 5 = 1.2 -> 4
    assert signal_recommendation(a.QUEUE_DEPTH, queue_only(3, 9, 9), hpa_like(5)).replicas == 4


def test_cautious_counting_never_grows_on_a_low_load_during_a_surge():
    # 2 requested, 4 listed: 3 answer at 2 (0.4x), 1 does not and counts as the target: 11 / 4 / 5 = 0.55,
    # whose per-pod count (3) is above the current 2: no change rather than growth on a low load
    assert signal_recommendation(a.QUEUE_DEPTH, queue_only(2, 2, 2, 2, None), hpa_like(5)).replicas == 2
