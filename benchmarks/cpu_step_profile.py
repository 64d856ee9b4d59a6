"""Where a CPU decode step's time goes: the default workload's batch (32 requests, prompts 32-256 tokens),
prefilled, then `--steps` decode steps under cProfile, the functions that took the most time printed.

    python -m benchmarks.cpu_step_profile --dtype bfloat16 [--requests 32] [--steps 40]

The step time printed is measured without the profiler's overhead on the same steps' neighbours (median of
`--steps` unprofiled steps, then the profiled ones); cProfile adds ~10% to the Python part only.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time

from benchmarks.decode_batch import fill_decode_batch
from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.worker.core.engine import LLMEngine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--top", type=int, default=20)
    args = ap.parse_args()

    engine = LLMEngine(EngineConfig(dtype=args.dtype))
    fill_decode_batch(engine, args.requests, 2 * args.steps + 16)

    plain = []
    for _ in range(args.steps):
        t = time.perf_counter()
        engine.step()
        plain.append(time.perf_counter() - t)
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(args.steps):
        engine.step()
    profile.disable()
    rows = len(engine.last_schedule.scheduled) if engine.last_schedule else 0
    print(f"{args.dtype}, {rows} rows a step: median {1000 * statistics.median(plain):.2f} ms, "
          f"min {1000 * min(plain):.2f} ms over {args.steps} unprofiled steps")
    print(f"per step below: divide by {args.steps}")
    pstats.Stats(profile).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
