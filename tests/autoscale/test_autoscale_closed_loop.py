"""The closed loop (closed_loop.py): real mock workers under load, the operator's scraper and decisions, a
harness as the Deployment controller. Assertions are on the recorded trajectory, so they can fail.

They are properties of the sequence of decisions, not of when each came (a busy machine shifts every time in the
trajectory): scaled up only under load and only upwards, to the target; down only once the load is gone, never
before the stabilization window and at the first pass that window allows; no flapping; at min in the end. Each
phase ends on its condition, with a generous deadline.

The default suite runs the short scenario (a spike to 2 replicas, then no load; about a minute with worker
start-up; the spike ends once both workers serve, since how fast they drain the queue depends on the machine). `pytest -m slow` runs the full one: spike to 3, steady load, a worker killed, no load (the one
plotted in docs/autoscaling.png).
"""

from __future__ import annotations

import pytest
from closed_loop import (
    FULL_POLICY,
    SHORT_POLICY,
    Sample,
    Trajectory,
    full_phases,
    run_scenario,
    short_phases,
)

from hetero_infer.operator.autoscale.decision import Policy

INTERVAL = 1.0
TICK_ROUNDING = 0.05  # sample times are rounded to the millisecond; the decision reads the loop's clock


def explain(trajectory: Trajectory) -> str:
    return f"\nphases: {trajectory.phases}\nload: {trajectory.load}\n{trajectory.table()}"


def check_bounds(trajectory: Trajectory, policy: Policy) -> None:
    for s in trajectory.samples:
        assert policy.min_replicas <= s.replicas <= policy.max_replicas, s
        if s.replicas > s.current:
            assert s.replicas <= max(2 * s.current, s.current + 1), s  # at most doubling


def check_spike(trajectory: Trajectory, top: int, queue_settles: bool = True) -> None:
    spike = trajectory.phase("spike")
    first_up = next(s for s in trajectory.samples if s.replicas > s.current)
    assert first_up.phase == "spike", first_up  # scaled up under load...
    # ...and not before: no scale-up while idle.
    assert all(s.replicas == s.current for s in trajectory.in_phase("idle"))
    # Under load, only upwards (monotone up).
    assert all(s.replicas >= s.current for s in trajectory.in_phase("spike"))
    # Reached the target: `top` workers ready (the phase's end condition), and, where the scenario waits for
    # it, the queue back under its target.
    assert spike["ended_by"] == "condition", spike
    last = trajectory.in_phase("spike")[-1]
    assert last.ready == top and last.replicas == top, last
    if queue_settles:
        assert last.queue is not None and last.queue < trajectory.policy["target_queue_depth"], last


def check_removal(trajectory: Trajectory, policy: Policy) -> None:
    removed = trajectory.phase("removed")
    samples = trajectory.in_phase("removed")
    assert removed["ended_by"] == "condition", removed  # reached min
    assert samples[-1].replicas == policy.min_replicas
    downs = [s for s in samples if s.replicas < s.current]
    assert downs, "never scaled down"
    # Recommendations go low as soon as the load is gone; the replicas only once the window holds
    # nothing but lower recommendations.
    window = policy.scale_down_stabilization_seconds
    before = [s for s in trajectory.samples if s.t < downs[0].t]
    last_high = [s for s in before if s.recommendation >= downs[0].current][-1]
    # Not before the window has passed since the last pass that wanted the replicas...
    assert downs[0].t - last_high.t >= window - TICK_ROUNDING, (last_high, downs[0])
    # ...and at the first pass (that read every worker) after it: none after the window kept the replicas.
    late = [s for s in before if s.t - last_high.t >= window + TICK_ROUNDING and not s.scrape_errors]
    assert not late, (last_high, late)
    assert all(s.reason == "ScaleDownStabilizing" for s in samples if last_high.t < s.t < downs[0].t)
    # Once down, never up again (no flapping), and only downwards until min.
    after = [s for s in trajectory.samples if s.t >= downs[0].t]
    assert all(s.replicas <= s.current for s in after), after


def changes(samples: list[Sample]) -> list[tuple[float, int, int]]:
    return [(s.t, s.current, s.replicas) for s in samples if s.replicas != s.current]


def check_no_flapping(trajectory: Trajectory) -> None:
    """Every scale-up before every scale-down: ups during the spike, downs once the load is gone."""
    ups = [c for c in changes(trajectory.samples) if c[2] > c[1]]
    downs = [c for c in changes(trajectory.samples) if c[2] < c[1]]
    assert ups and downs, changes(trajectory.samples)
    assert max(t for t, _, _ in ups) < min(t for t, _, _ in downs), changes(trajectory.samples)
    assert all(t >= trajectory.phase("removed")["start"] for t, _, _ in downs), changes(trajectory.samples)


@pytest.mark.slow  # the whole closed loop on real processes (~40 s); the KMock tests cover each decision
async def test_closed_loop_spike_then_no_load() -> None:
    policy = SHORT_POLICY
    trajectory = await run_scenario(short_phases(policy), policy, INTERVAL)
    why = explain(trajectory)
    try:
        check_bounds(trajectory, policy)
        check_spike(trajectory, top=policy.max_replicas, queue_settles=False)
        check_removal(trajectory, policy)
        check_no_flapping(trajectory)
        assert trajectory.load["failed"] == 0  # overload answers 429, nothing breaks
    except AssertionError as e:
        raise AssertionError(f"{e}{why}") from e


@pytest.mark.slow
async def test_closed_loop_full_scenario() -> None:
    policy = FULL_POLICY
    top = policy.max_replicas
    trajectory = await run_scenario(full_phases(policy), policy, INTERVAL)
    why = explain(trajectory)
    try:
        check_bounds(trajectory, policy)
        check_spike(trajectory, top)
        # Steady load: replicas constant, nothing flaps.
        steady = trajectory.in_phase("steady")
        assert {s.replicas for s in steady} == {top} and not changes(steady)
        # A worker killed: replaced (a new process started), and no scale-down on the missing data.
        kill = trajectory.in_phase("kill")
        assert trajectory.phase("kill")["ended_by"] == "condition"
        assert trajectory.workers_replaced == 1
        assert all(s.replicas >= top for s in kill)
        assert any(s.scrape_errors or s.ready < top for s in kill)  # the loop did see the loss
        check_removal(trajectory, policy)
        # Only the requests in flight on the killed worker failed; overload elsewhere answers 429.
        killed = {e["worker"] for e in trajectory.events if e.get("event") == "kill"}
        assert set(trajectory.load["failed_by_worker"]) <= killed, trajectory.load
        check_no_flapping(trajectory)
        steady_start = trajectory.phase("steady")["start"]
        assert all(t <= steady_start for t, a, b in changes(trajectory.samples) if b > a)  # up in the spike only
    except AssertionError as e:
        raise AssertionError(f"{e}{why}") from e
