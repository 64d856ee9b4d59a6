"""Per-request timing, recorded on the frontend's side from the step times the engine's deltas carry."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from hetero_infer.worker.core.outputs import RequestDelta


@dataclass(slots=True)
class RequestTiming:
    """The timing of one engine request: times are `time.monotonic()`; `num_tokens` counts the tokens
    generated so far (`sample_tokens`: per sample); `n` and `max_tokens` are its parameters, `cached_tokens`
    the prompt tokens the prefix cache served (known from its first delta on)."""

    arrival: float
    prompt_tokens: int
    first_scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    num_tokens: int = 0
    inter_token: list[float] = field(default_factory=list)
    n: int = 1
    max_tokens: int | None = None
    cached_tokens: int | None = None
    sample_tokens: list[int] = field(default_factory=list)


class TimingSink(Protocol):
    """Receives the timing of each request when it ends (finished, failed or aborted)."""

    def observe_request(self, timing: RequestTiming, finished_at: float, finish_reason: str) -> None: ...


def record_steps(timing: RequestTiming, step_times: list[float], first_scheduled: float | None,
                 num_tokens: int) -> None:
    """First scheduled, first token, the gap between every two output steps, tokens."""
    if step_times:
        last = timing.last_token
        if last is None:
            timing.first_token = step_times[0]
            timing.first_scheduled = step_times[0] if first_scheduled is None else first_scheduled
        else:
            timing.inter_token.append(step_times[0] - last)
        gaps = timing.inter_token
        for i in range(1, len(step_times)):
            gaps.append(step_times[i] - step_times[i - 1])
        timing.last_token = step_times[-1]
    timing.num_tokens += num_tokens


def record_delta(timing: RequestTiming, delta: RequestDelta) -> str | None:
    """Record a delta; its request's finish reason when the delta ends it (None while it runs). A failed
    step ends the request at its last step time, which gave no token."""
    step_times = delta.step_times[:-1] if delta.error else delta.step_times
    record_steps(timing, step_times, delta.first_scheduled_time, delta.num_new_tokens)
    if timing.cached_tokens is None and delta.first_scheduled_time is not None:
        timing.cached_tokens = delta.num_cached_tokens
    counts = timing.sample_tokens
    for i, sample in enumerate(delta.samples):
        if i == len(counts):
            counts.append(0)
        counts[i] += len(sample.token_ids)
    if delta.error:
        return "error"
    return finish_reason_of({s.finish_reason for s in delta.samples}) if delta.finished else None


def finish_reason_of(reasons: set[str | None]) -> str:
    """A request's finish reason from those of its samples."""
    for reason in ("error", "abort", "length"):
        if reason in reasons:
            return reason
    return "stop"
