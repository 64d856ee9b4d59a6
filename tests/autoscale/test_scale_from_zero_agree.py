"""The autoscaler agrees with the router's scale from zero (router/scale.py) instead of fighting it (pure).

The router writes spec.replicas 1 through the scale subresource the moment it holds a request, between two
autoscaling passes. The pass that follows may see nothing going on: the client gave up while the worker loaded
(nothing held, nothing routed), the worker pod not even listed yet. The size it finds must still count as
activity, so the replica gets the whole scaleToZeroAfterSeconds before it can go, however long the model sat at
zero before."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero_infer.operator.autoscale.decision import (
    AT_ZERO,
    SCALED_TO_ZERO,
    History,
    Observation,
    PodSample,
    Policy,
    RouterSample,
    decide,
)

WINDOW = 100.0
POLICY = Policy(min_replicas=0, max_replicas=4, scale_to_zero_after_seconds=WINDOW)
QUIET = RouterSample(held=0, in_flight=0, routed=7)  # the same routed count at every pass: nothing routed
LOADING = PodSample("w-0", ready=False)
IDLE = PodSample("w-0", ready=True, kv_cache_usage=0.0, queue_depth=0.0, running=0.0)


def at_zero_for(seconds: float, interval: float = 15.0) -> tuple[History, float]:
    """The history after passes at 0 replicas, nothing held, for `seconds`; and the time of the last pass."""
    h, t = History(), 0.0
    while t <= seconds:
        d = decide(h, Observation(0, (), QUIET), POLICY, now=t)
        assert d.reason == AT_ZERO
        h, t = d.history, t + interval
    return h, t - interval


@pytest.mark.parametrize("pods", [(), (LOADING,), (IDLE,)], ids=["not listed yet", "loading", "ready, idle"])
def test_a_replica_the_router_added_between_passes_is_not_taken_away(pods: tuple[PodSample, ...]) -> None:
    h, t = at_zero_for(3600)  # an hour at zero: idle far longer than the window
    # The router wrote replicas 1 after that pass; the client left before the worker was ready.
    t += 15
    d = decide(h, Observation(1, pods, QUIET), POLICY, now=t)
    assert d.desired == 1, d.message
    came_up = t
    while t < came_up + WINDOW - 15:
        t += 15
        d = decide(d.history, Observation(1, pods, QUIET), POLICY, now=t)
        assert d.desired == 1, (t - came_up, d.message)
    d = decide(d.history, Observation(1, pods, QUIET), POLICY, now=came_up + WINDOW)
    assert (d.desired, d.reason) == (0, SCALED_TO_ZERO), "idle for the whole window after it came up"


def test_even_a_zero_window_gives_the_new_replica_its_first_pass() -> None:
    policy = Policy(min_replicas=0, max_replicas=1, scale_to_zero_after_seconds=0)
    h = decide(History(), Observation(0, (), QUIET), policy, now=0).history
    d = decide(h, Observation(1, (IDLE,), QUIET), policy, now=1)
    assert d.desired == 1
    d = decide(d.history, Observation(1, (IDLE,), QUIET), policy, now=2)
    assert (d.desired, d.reason) == (0, SCALED_TO_ZERO)


@st.composite
def runs(draw: st.DrawFn) -> list[tuple[float, Observation]]:
    """Passes at increasing times with sizes that jump (others write spec.replicas between passes)."""
    out, t = [], 0.0
    for _ in range(draw(st.integers(2, 14))):
        t += draw(st.sampled_from([1.0, 15.0, 60.0, 400.0]))
        current = draw(st.sampled_from([0, 0, 1, 2]))
        pods = tuple(draw(st.sampled_from([LOADING, IDLE])) for _ in range(draw(st.integers(0, current))))
        r = draw(st.sampled_from([QUIET, RouterSample(held=1, in_flight=0, routed=7), None]))
        out.append((t, Observation(current, pods, r)))
    return out


@settings(max_examples=80, deadline=None)
@given(runs())
def test_no_scale_to_zero_within_the_window_after_coming_up_from_zero(run: list[tuple[float, Observation]]) -> None:
    h, came_up, previous = History(), None, None
    for t, o in run:
        if previous == 0 and o.current_replicas > 0:
            came_up = t  # the first pass that sees the size up from zero
        d = decide(h, o, POLICY, now=t)
        h, previous = d.history, o.current_replicas
        if d.reason == SCALED_TO_ZERO and came_up is not None:
            assert t - came_up >= WINDOW, f"scaled to zero {t - came_up:g}s after coming up from zero"
