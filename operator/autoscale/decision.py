"""The autoscaling decision (pure): (history, observation, policy, now) -> Decision.

Nothing here reads a clock, the network or the API server, so every rule below is tested without
time passing (tests/autoscale).

Per signal (KV-cache usage, queue depth), the Kubernetes HPA formula for a Pods metric:

    ratio   = average over the ready pods that answered / target
    desired = ceil(pods x ratio)                  (no change while |ratio - 1| <= tolerance)

Pods without usable data (not ready: still loading; ready but not answering; requested by
spec.replicas but not listed yet) count with a cautious value, as the HPA does for missing
metrics: the target itself when the ready pods say "scale down" (missing data never causes a
scale-down) and 0 when they say "scale up" (a loading pod never causes a scale-up; the
capacity it is about to add is counted instead). If that flips the direction or brings the
ratio inside the tolerance, the signal recommends the current size. (The HPA ignores unready
pods on a scale-down; here they hold their share, which is more careful with pods that were
just added or replaced.) Beyond the HPA, no scale-down happens at all while a ready pod does
not answer: its load is unknown and may be the reason it does not answer.

Then, as the HPA's `behavior` does: the largest signal wins and is bounded by min/max; the
result is recorded in the history; a scale-up uses the smallest recommendation of the last
`scaleUpStabilizationSeconds` (0: at once) and adds at most as many replicas as there are
(at most doubling, at least +1); a scale-down uses the largest recommendation of the last
`scaleDownStabilizationSeconds`, so it happens only after the whole window recommended fewer
replicas, and never before the history spans the window (e.g. right after the operator
started).

Scale to zero (minReplicas 0, only with the router, which holds requests while no worker is ready):
at 0 replicas, any request the routers hold scales to 1 (`ScaledFromZero`; a router with --scale-target has
usually done so already, through the scale subresource, before the pass), else it stays at 0; with replicas,
the rules above run with a floor of 1, and the size goes to 0 only once the whole `scaleToZeroAfterSeconds`
passed without activity (a request running, waiting or held, a change in the routers' routed-requests count,
or the size having come up from zero since the last pass) and with every ready pod and the routers answering
(missing data never scales to zero).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from hetero_infer.operator.spec import AutoscalingSpec

TOLERANCE = 0.1
MAX_SCALE_UP_FACTOR = 2.0

KV_CACHE_USAGE = "kvCacheUsage"
QUEUE_DEPTH = "queueDepth"
SIGNALS = (KV_CACHE_USAGE, QUEUE_DEPTH)

# Decision reasons (also the ScalingActive condition's reason).
SCALED_UP = "ScaledUp"
SCALED_DOWN = "ScaledDown"
STEADY = "Steady"  # the recommendation equals the current size
STABILIZING = "ScaleDownStabilizing"  # lower recommendations, but not for the whole window yet
HELD = "ScaleDownHeld"  # lower recommendations, but a ready pod did not answer: no scale-down on missing data
UP_STABILIZING = "ScaleUpStabilizing"  # higher recommendations, but not for the whole up-window yet
AT_MAX = "AtMaxReplicas"  # more replicas recommended than maxReplicas allows; already there
AT_MIN = "AtMinReplicas"  # fewer replicas recommended than minReplicas allows; already there
SCALED_FROM_ZERO = "ScaledFromZero"  # at 0 replicas, the routers hold requests
SCALED_TO_ZERO = "ScaledToZero"  # idle for scaleToZeroAfterSeconds
AT_ZERO = "Idle"  # at 0 replicas and nothing held
NO_METRICS = "NoMetrics"  # no ready pod answered: keep the size (only bounds are enforced)
BOUNDS = "OutsideBounds"  # replicas moved into [min, max] regardless of metrics


@dataclass(frozen=True)
class Policy:
    """What the spec asks for (autoscaling.*) plus the fixed HPA constants."""

    min_replicas: int
    max_replicas: int
    target_kv_cache_usage: float = 0.8
    target_queue_depth: float = 5.0
    scale_up_stabilization_seconds: float = 0.0
    scale_down_stabilization_seconds: float = 300.0
    tolerance: float = TOLERANCE
    max_scale_up_factor: float = MAX_SCALE_UP_FACTOR
    scale_to_zero_after_seconds: float = 600.0  # with min_replicas 0 only

    def __post_init__(self) -> None:
        if self.min_replicas < 0 or self.max_replicas < max(1, self.min_replicas):
            raise ValueError(f"need 0 <= min_replicas <= max_replicas and max_replicas >= 1, got "
                             f"{self.min_replicas}, {self.max_replicas}")
        if self.target_kv_cache_usage <= 0 or self.target_queue_depth <= 0:
            raise ValueError("targets must be > 0")

    def target(self, signal: str) -> float:
        return self.target_kv_cache_usage if signal == KV_CACHE_USAGE else self.target_queue_depth

    def bound(self, replicas: int) -> int:
        return max(self.min_replicas, min(self.max_replicas, replicas))

    def scale_up_limit(self, current: int) -> int:
        """The most replicas one decision may go to from `current` (at most doubling, at least +1)."""
        return max(math.ceil(current * self.max_scale_up_factor), current + 1)


@dataclass(frozen=True)
class PodSample:
    """One worker pod as seen in one pass: readiness and, if it answered, its gauges."""

    name: str
    ready: bool
    kv_cache_usage: float | None = None  # hetero_infer_kv_cache_usage_ratio
    queue_depth: float | None = None  # hetero_infer_num_requests_waiting
    running: float | None = None  # hetero_infer_num_requests_running
    error: str | None = None  # why there are no values (scrape failure), for messages

    @property
    def has_data(self) -> bool:
        return self.ready and self.kv_cache_usage is not None and self.queue_depth is not None

    def value(self, signal: str) -> float | None:
        return self.kv_cache_usage if signal == KV_CACHE_USAGE else self.queue_depth


@dataclass(frozen=True)
class RouterSample:
    """The router pods' gauges, summed over those that answered (scale to zero reads them)."""

    held: float  # hetero_infer_router_requests_held: requests waiting for a ready worker
    in_flight: float  # hetero_infer_router_requests_in_flight: requests open to a worker
    routed: float  # hetero_infer_router_requests_routed_total: its changes are activity


@dataclass(frozen=True)
class Observation:
    """The current size (spec.replicas), the pods found for it and, with the router, its gauges."""

    current_replicas: int
    pods: tuple[PodSample, ...] = ()
    router: RouterSample | None = None  # None: no router, or none of its pods answered

    @property
    def ready(self) -> int:
        return sum(p.ready for p in self.pods)

    @property
    def answered(self) -> int:
        return sum(p.has_data for p in self.pods)

    @property
    def unanswered(self) -> int:
        """Ready pods that did not answer (their load is unknown, possibly high)."""
        return sum(p.ready and not p.has_data for p in self.pods)

    @property
    def without_data(self) -> int:
        """Pods that count with the cautious value: listed without data, plus requested but not listed."""
        listed = len(self.pods) - self.answered
        return listed + max(0, self.current_replicas - len(self.pods))

    def average(self, signal: str) -> float | None:
        values = [p.value(signal) for p in self.pods if p.has_data]
        return sum(values) / len(values) if values else None  # type: ignore[arg-type]


@dataclass(frozen=True)
class History:
    """Recent bounded recommendations (time, replicas) and when recording started."""

    recommendations: tuple[tuple[float, int], ...] = ()
    since: float | None = None
    last_scale_time: float | None = None
    last_active: float | None = None  # scale to zero: when activity was last seen (None: not yet looked)
    last_routed: float | None = None  # the routers' routed count at the last pass
    last_replicas: int | None = None  # scale to zero: spec.replicas at the last pass

    def record(self, now: float, replicas: int, keep_seconds: float) -> History:
        kept = tuple((t, r) for t, r in self.recommendations if t > now - keep_seconds)
        return replace(self, recommendations=(*kept, (now, replicas)),
                       since=self.since if self.since is not None else now)

    def within(self, now: float, seconds: float) -> list[int]:
        """Recommendations newer than `seconds` ago (the HPA's stabilization window)."""
        return [r for t, r in self.recommendations if t > now - seconds]


@dataclass(frozen=True)
class SignalRecommendation:
    signal: str
    average: float | None  # over the ready pods that answered
    target: float
    replicas: int | None  # None: no data for this signal
    note: str = ""

    @property
    def ratio(self) -> float | None:
        return None if self.average is None else self.average / self.target


@dataclass(frozen=True)
class Decision:
    desired: int
    current: int
    recommendation: int  # largest signal, bounded by min/max, before stabilization and rate limits
    reason: str
    message: str
    signals: tuple[SignalRecommendation, ...]
    history: History
    active: bool = True  # False: no metrics, the decision only enforced bounds
    limited: list[str] = field(default_factory=list)  # which limits changed the recommendation

    @property
    def direction(self) -> str:
        return "up" if self.desired > self.current else "down" if self.desired < self.current else "none"

    def signal(self, name: str) -> SignalRecommendation:
        return next(s for s in self.signals if s.signal == name)


def signal_recommendation(signal: str, obs: Observation, policy: Policy) -> SignalRecommendation:
    """The HPA's per-metric replica count for one signal (see the module docstring)."""
    target = policy.target(signal)
    current = obs.current_replicas
    ready_values: list[float] = [v for p in obs.pods if p.has_data for v in (p.value(signal),) if v is not None]
    if not ready_values:
        return SignalRecommendation(signal, None, target, None, "no ready pod answered")
    average = sum(ready_values) / len(ready_values)
    ratio = average / target
    tol = policy.tolerance
    cautious = obs.without_data
    if cautious == 0:
        if abs(ratio - 1.0) <= tol:
            return SignalRecommendation(signal, average, target, current, "within tolerance")
        replicas = math.ceil(ratio * len(ready_values) - 1e-9)
        if (ratio < 1.0 and replicas > current) or (ratio > 1.0 and replicas < current):
            replicas = current  # more pods listed than requested (a surge): never against the direction
        return SignalRecommendation(signal, average, target, replicas)
    if ratio == 1.0:
        return SignalRecommendation(signal, average, target, current, "on target")
    fill = target if ratio < 1.0 else 0.0  # missing data never drives the recommendation
    values = ready_values + [fill] * cautious
    new_ratio = sum(values) / len(values) / target
    note = f"{cautious} pod(s) without data counted as {fill:g}"
    if abs(new_ratio - 1.0) <= tol or (ratio < 1.0) != (new_ratio < 1.0):
        return SignalRecommendation(signal, average, target, current, note + ": no change")
    replicas = math.ceil(new_ratio * len(values) - 1e-9)
    if (new_ratio < 1.0 and replicas > current) or (new_ratio > 1.0 and replicas < current):
        return SignalRecommendation(signal, average, target, current, note + ": no change")
    return SignalRecommendation(signal, average, target, replicas, note)


def _describe(s: SignalRecommendation) -> str:
    if s.average is None:
        return f"{s.signal} unknown"
    text = f"{s.signal} {s.average:.3g}/{s.target:g} -> {s.replicas}"
    return f"{text} ({s.note})" if s.note else text


def _busy(history: History, obs: Observation) -> bool | None:
    """Whether anything is going on; None when it cannot be told (missing data never scales to zero).

    A size that came up from zero since the last pass is activity: the router asks for the first replica the
    moment it holds a request (router/scale.py), possibly between two passes that both see nothing held (the
    client gave up while the worker loaded); without this the idle time would run from before the scale-up and
    the new replica could be taken away at once."""
    if history.last_replicas == 0 and obs.current_replicas > 0:
        return True
    r = obs.router
    if r is None or obs.unanswered:
        return None
    if r.held > 0 or r.in_flight > 0:
        return True
    if history.last_routed is not None and r.routed != history.last_routed:
        return True
    return any((p.running or 0) > 0 or (p.queue_depth or 0) > 0 for p in obs.pods if p.has_data)


def decide(history: History, obs: Observation, policy: Policy, now: float) -> Decision:
    """The replicas to run now, why, and the history to pass to the next call."""
    if policy.min_replicas > 0:
        return _decide(history, obs, policy, now)
    busy = _busy(history, obs)
    last_active = now if busy is not False or history.last_active is None else history.last_active
    history = replace(history, last_active=last_active, last_replicas=obs.current_replicas,
                      last_routed=obs.router.routed if obs.router is not None else history.last_routed)
    current = obs.current_replicas
    held = obs.router.held if obs.router is not None else None
    floor = replace(policy, min_replicas=1)
    signals = tuple(signal_recommendation(s, obs, floor) for s in SIGNALS)
    if current == 0:
        if held:
            message = f"scaling up from 0 to 1: the routers hold {held:g} request(s)"
            return Decision(1, 0, 1, SCALED_FROM_ZERO, message, signals, replace(history, last_scale_time=now))
        message = ("keeping 0 replicas: no request held" if held is not None
                   else "keeping 0 replicas: no router answered")
        return Decision(0, 0, 0, AT_ZERO, message, signals, history, active=held is not None)
    idle = now - last_active
    if busy is False and idle >= policy.scale_to_zero_after_seconds:
        message = (f"scaling down from {current} to 0: no request for {idle:g}s "
                   f"(scaleToZeroAfterSeconds {policy.scale_to_zero_after_seconds:g})")
        return Decision(0, current, 0, SCALED_TO_ZERO, message, signals, replace(history, last_scale_time=now))
    return _decide(history, obs, floor, now)


def _decide(history: History, obs: Observation, policy: Policy, now: float) -> Decision:
    current = obs.current_replicas
    signals = tuple(signal_recommendation(s, obs, policy) for s in SIGNALS)
    known = [s.replicas for s in signals if s.replicas is not None]
    summary = "; ".join(_describe(s) for s in signals)

    if not known:
        # Nothing to go on: keep the size (within bounds) and restart the scale-down window, so data
        # that comes back after a gap must again be low for a whole window before replicas go.
        desired = policy.bound(current)
        reason = BOUNDS if desired != current else NO_METRICS
        message = (f"no metrics from any ready pod ({obs.ready} ready of {len(obs.pods)} listed, "
                   f"{current} requested); keeping {desired} replicas")
        new_history = replace(history, since=None, last_scale_time=now if desired != current
                              else history.last_scale_time)
        return Decision(desired, current, desired, reason, message, signals, new_history, active=False)

    raw = max(known)
    recommendation = policy.bound(raw)
    limited: list[str] = []
    if recommendation != raw:
        limited.append(f"bounded to [{policy.min_replicas}, {policy.max_replicas}]")
    keep = max(policy.scale_up_stabilization_seconds, policy.scale_down_stabilization_seconds) + 1.0
    new_history = history.record(now, recommendation, keep)

    # The HPA's stabilization: up to the smallest recommendation of the up-window, down to the
    # largest of the down-window (each window includes this recommendation).
    up = min([recommendation, *new_history.within(now, policy.scale_up_stabilization_seconds)])
    down = max([recommendation, *new_history.within(now, policy.scale_down_stabilization_seconds)])
    assert new_history.since is not None
    if now - new_history.since < policy.scale_down_stabilization_seconds:
        down = max(down, current)  # the history does not span the window yet

    if up > current:
        desired, reason = up, SCALED_UP
        if up < recommendation:
            limited.append(f"scale-up stabilization window {policy.scale_up_stabilization_seconds:g}s")
        cap = policy.scale_up_limit(current)
        if desired > cap:
            desired = cap
            limited.append(f"at most {cap} replicas in one step from {current}")
    elif down < current and obs.unanswered:
        desired, reason = current, HELD
    elif down < current:
        desired, reason = down, SCALED_DOWN
    else:
        desired = current
        reason = STABILIZING if recommendation < current else UP_STABILIZING if recommendation > current else STEADY
        if reason == STEADY and raw != recommendation:
            reason = AT_MAX if raw > recommendation else AT_MIN

    bounded = policy.bound(desired)
    if bounded != desired:
        desired, reason = bounded, BOUNDS
    if desired != current:
        new_history = replace(new_history, last_scale_time=now)
    message = _message(reason, current, desired, recommendation, summary, limited, policy, obs.unanswered)
    return Decision(desired, current, recommendation, reason, message, signals, new_history, limited=limited)


def _message(reason: str, current: int, desired: int, recommendation: int, summary: str, limited: Sequence[str],
             policy: Policy, obs_unanswered: int) -> str:
    head = {
        SCALED_UP: f"scaling up from {current} to {desired}",
        SCALED_DOWN: f"scaling down from {current} to {desired}",
        STEADY: f"keeping {current} replicas",
        AT_MAX: f"keeping {current} replicas (maxReplicas)",
        AT_MIN: f"keeping {current} replicas (minReplicas)",
        STABILIZING: (f"keeping {current} replicas: {recommendation} recommended, waiting for "
                      f"{policy.scale_down_stabilization_seconds:g}s of lower recommendations"),
        HELD: (f"keeping {current} replicas: {recommendation} recommended, but {obs_unanswered} ready pod(s) did "
               "not answer (no scale-down on missing data)"),
        UP_STABILIZING: (f"keeping {current} replicas: {recommendation} recommended, waiting for "
                         f"{policy.scale_up_stabilization_seconds:g}s of higher recommendations"),
        BOUNDS: f"moving from {current} to {desired} replicas to stay within "
                f"[{policy.min_replicas}, {policy.max_replicas}]",
    }[reason]
    tail = f" (limited: {', '.join(limited)})" if limited else ""
    return f"{head}; {summary}{tail}"


def policy_from_spec(a: AutoscalingSpec) -> Policy:
    """The policy of a parsed `spec.autoscaling` (enabled, so maxReplicas is set)."""
    if a.max_replicas is None:
        raise ValueError("autoscaling.maxReplicas is required")
    return Policy(
        min_replicas=a.min_replicas,
        max_replicas=a.max_replicas,
        target_kv_cache_usage=a.target_kv_cache_usage,
        target_queue_depth=a.target_queue_depth,
        scale_up_stabilization_seconds=float(a.scale_up_stabilization_seconds),
        scale_down_stabilization_seconds=float(a.scale_down_stabilization_seconds),
        scale_to_zero_after_seconds=float(a.scale_to_zero_after_seconds),
    )


def observation(current_replicas: int, pods: Iterable[PodSample]) -> Observation:
    return Observation(current_replicas=current_replicas, pods=tuple(pods))
