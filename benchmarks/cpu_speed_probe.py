"""How fast is each CPU of this machine right now? A fixed pure-Python loop, timed on each CPU in turn (pinned)
for a while: on a quiet machine every sample takes about the same time; on a shared VM whose host is busy the
samples spread, often in two groups (full speed, and a fraction of it while another tenant shares the core).
Run it next to a benchmark to tell whether its numbers came from a quiet machine.

    python benchmarks/cpu_speed_probe.py --seconds 20
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def _work(n: int) -> int:
    s = 0
    for i in range(n):
        s += i * i
    return s


def probe(cpus: list[int], seconds: float, loop: int) -> dict[int, list[float]]:
    """Milliseconds per `_work(loop)` on each CPU, the CPUs taken in turn until `seconds` have passed."""
    samples: dict[int, list[float]] = {c: [] for c in cpus}
    before = os.sched_getaffinity(0)
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for c in cpus:
                os.sched_setaffinity(0, {c})
                t = time.perf_counter()
                _work(loop)
                samples[c].append((time.perf_counter() - t) * 1e3)
    finally:
        os.sched_setaffinity(0, before)
    return samples


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--loop", type=int, default=200_000, help="iterations of the timed loop (~5-10 ms)")
    args = p.parse_args(argv)
    cpus = sorted(os.sched_getaffinity(0))
    samples = probe(cpus, args.seconds, args.loop)
    print(f"{args.loop:,}-iteration loop, {args.seconds:g} s, CPUs {cpus}\n")
    print("| CPU | samples | fastest (ms) | p25 | median | p75 | slowest | at full speed (within 10% of the fastest) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    fastest = min(min(s) for s in samples.values())
    for c, s in samples.items():
        q = statistics.quantiles(s, n=4)
        full = sum(x <= fastest * 1.1 for x in s) / len(s)
        print(f"| {c} | {len(s)} | {min(s):.2f} | {q[0]:.2f} | {q[1]:.2f} | {q[2]:.2f} | {max(s):.2f} | {full:.0%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
