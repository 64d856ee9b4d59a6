"""How fast is each CPU of this machine right now? A fixed pure-Python loop, timed on each CPU in turn (pinned)
for a while (`hetero_infer.bench.cpu_speed`): on a quiet machine every sample takes about the same time; on a
shared VM whose host is busy the samples spread, often in two groups (full speed, and a fraction of it while
another tenant shares the core). Run it next to a benchmark to tell whether its numbers came from a quiet
machine.

    python benchmarks/cpu_speed_probe.py --seconds 20
"""

from __future__ import annotations

import argparse
import statistics

from hetero_infer.bench.cpu_speed import DEFAULT_LOOP, probe


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--loop", type=int, default=DEFAULT_LOOP, help="iterations of the timed loop (~5-10 ms)")
    args = p.parse_args(argv)
    samples = probe(seconds=args.seconds, loop=args.loop)
    print(f"{args.loop:,}-iteration loop, {args.seconds:g} s, CPUs {sorted(samples)}\n")
    print("| CPU | samples | fastest (ms) | p25 | median | p75 | slowest | at full speed (within 10% of the fastest) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    fastest = min(min(s) for s in samples.values())
    for c, s in samples.items():
        q = statistics.quantiles(s, n=4) if len(s) > 1 else [s[0]] * 3
        full = sum(x <= fastest * 1.1 for x in s) / len(s)
        print(f"| {c} | {len(s)} | {min(s):.2f} | {q[0]:.2f} | {q[1]:.2f} | {q[2]:.2f} | {max(s):.2f} | {full:.0%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
