"""How fast each CPU runs right now, for benchmarks on shared machines.

A fixed pure-Python loop is timed on each CPU in turn (pinned). On a quiet machine every sample takes about the
same time; on a shared VM whose host is busy the samples spread, often in two groups (full speed, and a
fraction of it while another tenant shares the core). `benchmarks/cpu_speed_probe.py` prints the distribution;
`hetero_infer.bench.overhead` probes around every round to tell the rounds measured at full speed
from the others.
"""

from __future__ import annotations

import os
import statistics
import time

DEFAULT_LOOP = 200_000  # iterations of the timed loop: ~6 ms at full speed on the project's VM


def _work(n: int) -> int:
    s = 0
    for i in range(n):
        s += i * i
    return s


def probe(cpus: list[int] | None = None, seconds: float = 1.0, loop: int = DEFAULT_LOOP) -> dict[int, list[float]]:
    """Milliseconds per `_work(loop)` on each CPU (default: those this process may use), taken in turn until
    `seconds` have passed (at least one sample each). The process's CPU affinity is restored afterwards."""
    cpus = sorted(os.sched_getaffinity(0)) if cpus is None else cpus
    samples: dict[int, list[float]] = {c: [] for c in cpus}
    before = os.sched_getaffinity(0)
    try:
        end = time.monotonic() + seconds
        while True:
            for c in cpus:
                os.sched_setaffinity(0, {c})
                t = time.perf_counter()
                _work(loop)
                samples[c].append((time.perf_counter() - t) * 1e3)
            if time.monotonic() >= end:
                break
    finally:
        os.sched_setaffinity(0, before)
    return samples


def slowdown(samples: dict[int, list[float]], fastest_ms: float) -> float:
    """How much slower than `fastest_ms` the slowest CPU ran (its median sample over it): 1.0 at full speed."""
    return max(statistics.median(s) for s in samples.values()) / fastest_ms
