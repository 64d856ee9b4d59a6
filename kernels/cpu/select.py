"""Kernel choice by measurement: each candidate kernel of an operation is timed once on the machine at hand,
the fastest is kept, and the choice is cached on disk so that the next start on the same machine pays nothing.

Why measure: which CPU GEMM is fastest depends on the CPU more than on its vendor or ISA flags. On the AMD EPYC
(AVX512_BF16, no AMX) this project was tuned on, the project's own bfloat16 GEMM beats oneDNN at decode sizes;
on an Intel Sapphire Rapids, oneDNN's bfloat16 uses AMX tiles and PyTorch's own linears were as fast as the
engine's whole step. A vendor table would be wrong on the next CPU; a measurement is not.

Pure parts (`choose`, `plan_buckets`, `bucket_index`, `MachineKey`) take timings as data; `ChoiceCache` is the
disk; `time_call` the clock. The operations' candidates live with the operations (`linear.py`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

log = logging.getLogger(__name__)

# Row counts timed; a call with m rows uses the first bucket >= m (the last beyond it). 32 is the default
# workload's decode batch; 256 stands for prefill-sized calls.
BUCKETS: tuple[int, ...] = (1, 8, 32, 256)
TIE = 0.03  # within 3% of the fastest, the candidate earlier in the preference order wins (noise, not a win)
LAYOUT_TIE = 0.10  # within 10%, a bucket reuses a layout another bucket already keeps (one copy of the weight)


def bucket_index(rows: int, buckets: Sequence[int] = BUCKETS) -> int:
    for i, b in enumerate(buckets):
        if rows <= b:
            return i
    return len(buckets) - 1


def _valid(t: float | None) -> bool:
    return t is not None and math.isfinite(t) and t > 0


def choose(timings: Mapping[str, float | None], preference: Sequence[str], tie: float = TIE) -> str | None:
    """The fastest candidate; a candidate earlier in `preference` within `tie` of the fastest wins instead.
    None, NaN, inf or a missing entry is a candidate that failed or does not run here. None if none ran."""
    ran = [c for c in preference if _valid(timings.get(c))]
    if not ran:
        return None
    best = min(timings[c] for c in ran)
    return next(c for c in ran if timings[c] <= best * (1 + tie))


def plan_buckets(per_bucket: Sequence[Mapping[str, float | None]], preference: Sequence[str], tie: float = TIE,
                 layout_tie: float = LAYOUT_TIE) -> tuple[str, ...]:
    """One candidate per bucket: each bucket's `choose`, then, so that a weight is kept in as few layouts as
    possible, a bucket takes a layout that more buckets chose where it is within `layout_tie` of its own
    choice. Raises ValueError when some bucket has no candidate that ran."""
    first = [choose(t, preference, tie) for t in per_bucket]
    if any(c is None for c in first):
        raise ValueError(f"no candidate ran for some row count: {list(per_bucket)}")
    order = sorted(dict.fromkeys(first), key=lambda c: (-first.count(c), preference.index(c)))
    plan = []
    for timings, own in zip(per_bucket, first):
        limit = timings[own] * (1 + layout_tie)
        plan.append(next(c for c in order if _valid(timings.get(c)) and timings[c] <= limit))
    return tuple(plan)


@dataclass(frozen=True)
class MachineKey:
    """Everything a measured choice depends on: a change to any of it is another machine."""

    cpu_model: str
    cpu_flags: str  # digest of the sorted feature flags
    threads: int  # the thread count the candidates were timed with
    torch: str
    project: str
    kernels: str  # the C library's build digest (sources, flags, compiler)

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]

    @classmethod
    def here(cls, threads: int) -> MachineKey:
        import importlib.metadata

        import torch

        from hetero_infer.kernels.cpu import native

        try:
            project = importlib.metadata.version("hetero-infer")
        except importlib.metadata.PackageNotFoundError:
            project = "unknown"
        flags = hashlib.sha256(" ".join(sorted(native.cpu_flags())).encode()).hexdigest()[:16]
        kernels = native.build_digest() if native.library() is not None else "none"
        return cls(native.cpu_model(), flags, threads, torch.__version__, project, kernels)


class ChoiceCache:
    """Choices on disk, one JSON file per MachineKey: {"key": ..., "choices": {entry: {"plan": [...],
    "timings": [...]}}}. Several processes may write at once: each write merges with the file and replaces
    it atomically. A folder that cannot be written leaves the choices in memory only."""

    def __init__(self, folder: Path, key: MachineKey) -> None:
        self.key = key
        self.path = folder / f"choices-{key.digest()}.json"
        self._choices: dict[str, dict] = self._read()

    def _read(self) -> dict[str, dict]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        if data.get("key") != asdict(self.key):  # a digest collision or a hand-edited file
            return {}
        return dict(data.get("choices", {}))

    def get(self, entry: str) -> tuple[str, ...] | None:
        found = self._choices.get(entry)
        return tuple(found["plan"]) if found else None

    def timings(self, entry: str) -> list[dict[str, float | None]] | None:
        """The timings [bucket][candidate] the cached choice of `entry` was made from (failed candidates None)."""
        found = self._choices.get(entry)
        return [dict(t) for t in found.get("timings", [])] if found else None

    def put(self, entry: str, plan: Sequence[str], timings: Sequence[Mapping[str, float | None]]) -> None:
        self._choices = {**self._read(), **self._choices,
                         entry: {"plan": list(plan), "timings": [dict(t) for t in timings]}}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"key": asdict(self.key), "choices": self._choices}, indent=1))
            os.replace(tmp, self.path)
        except OSError as exc:
            log.warning("kernel choices not saved (%s): they will be measured again at the next start", exc)


def machine_cache(threads: int) -> ChoiceCache:
    """The choices measured on `threads` thread(s) of this machine, in `<cache>/cpu_choices`."""
    from hetero_infer.paths import cache_dir

    return ChoiceCache(cache_dir() / "cpu_choices", MachineKey.here(threads))


def clock(fn: Callable[[], object]) -> float:
    """Seconds one call of `fn` took."""
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


@dataclass(frozen=True)
class Rounds:
    """How long `measure` keeps timing: rounds over all candidates (each timed once per round, interleaved so
    that a slow minute of a shared machine hits all of them) until every candidate's two best samples agree
    within `agree` (a minimum seen twice is not a lucky or unlucky sample), at least `min_rounds` and at most
    `max_rounds`, or until `budget_s` is spent. A candidate 3x slower than the leader after `drop_after` rounds
    stops (not sooner: at load 13 on two cores, a candidate's first samples were all 40x its true time)."""

    min_rounds: int = 4
    drop_after: int = 4
    max_rounds: int = 12
    agree: float = 0.05
    budget_s: float = 1.0


def _settled(samples: list[float], agree: float) -> bool:
    best = sorted(samples)[:2]
    return len(best) == 2 and best[1] <= best[0] * (1 + agree)


def measure(candidates: Mapping[str, Callable[[int], Callable[[], object]]], buckets: Sequence[int] = BUCKETS,
            timer: Callable[[Callable[[], object]], float] = clock,
            rounds: Rounds = Rounds()) -> list[dict[str, float | None]]:
    """Timings [bucket][candidate], the minimum of each candidate's samples (on a shared CPU every disturbance
    only adds time). `candidates[name](rows)` returns the call to time, once warmed up; a candidate that raises
    (unsupported here, or failing) is None in that bucket."""
    out: list[dict[str, float | None]] = []
    for rows in buckets:
        calls: dict[str, Callable[[], object]] = {}
        failed: dict[str, None] = {}
        for name, make in candidates.items():
            try:
                calls[name] = make(rows)
                calls[name]()  # warm-up: first-call allocations, page faults, oneDNN's kernel generation
            except Exception as exc:  # noqa: BLE001 - any failure means "not this one"
                log.debug("candidate %s at %d rows failed: %s", name, rows, exc)
                calls.pop(name, None)
                failed[name] = None
        samples: dict[str, list[float]] = {name: [] for name in calls}
        active = list(calls)
        spent = 0.0
        for r in range(rounds.max_rounds):
            for name in active:
                try:
                    dt = timer(calls[name])
                except Exception as exc:  # noqa: BLE001
                    log.debug("candidate %s at %d rows failed: %s", name, rows, exc)
                    failed[name] = None
                    continue
                samples[name].append(dt)
                spent += dt
            active = [n for n in active if n not in failed]
            lead = min((min(samples[n]) for n in active if samples[n]), default=None)
            if r + 1 >= rounds.drop_after and lead is not None:
                active = [n for n in active if min(samples[n]) <= 3 * lead]
            done = r + 1 >= rounds.min_rounds and all(_settled(samples[n], rounds.agree) for n in active)
            if done or spent > rounds.budget_s or not active:
                break
        timings: dict[str, float | None] = {n: (None if n in failed or not samples[n] else min(samples[n]))
                                            for n in candidates}
        out.append(timings)
    return out
