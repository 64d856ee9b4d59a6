"""Per-step time outside the model's kernels: a decode step's wall time minus the time inside the decoder stack
(the fused C step, or the per-op forward) and the LM head, for `--requests` sequences of the default workload's
prompts (32-256 tokens), prefilled, then `--steps` greedy decode steps. Also the main thread's CPU time outside
them (less sensitive to a busy neighbour than wall time).

    python -m benchmarks.cpu_step_overhead --dtype bfloat16 --requests 1 [--steps 300]

A/B between two trees: run it alternately from each with PYTHONPATH pointing at the tree, e.g.
`cd /tmp && PYTHONPATH=/tmp/base python -m benchmarks.cpu_step_overhead ...`, then the same with the other tree.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from benchmarks.decode_batch import fill_decode_batch
from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.worker.core.engine import LLMEngine


class _Clock:
    """Wall and main-thread CPU seconds spent inside the wrapped calls."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0

    def wrap(self, fn):
        def timed(*args, **kwargs):
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.wall += time.perf_counter() - wall
                self.cpu += time.thread_time() - cpu
        return timed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--requests", type=int, default=1)
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args()

    engine = LLMEngine(EngineConfig(dtype=args.dtype))
    executor, clock = engine.executor, _Clock()
    if executor.cpu_decode is not None:
        executor.cpu_decode.run = clock.wrap(executor.cpu_decode.run)
    model = executor.model
    model.compute_logits = clock.wrap(model.compute_logits)
    forward = clock.wrap(type(model).__call__)
    model.__class__ = type(type(model).__name__, (type(model),), {"__call__": forward})

    fill_decode_batch(engine, args.requests, args.steps + 40)

    steps, outside, outside_cpu = [], [], []
    for _ in range(args.steps):
        clock.wall = clock.cpu = 0.0
        wall, cpu = time.perf_counter(), time.thread_time()
        engine.step()
        steps.append(time.perf_counter() - wall)
        outside.append(steps[-1] - clock.wall)
        outside_cpu.append(time.thread_time() - cpu - clock.cpu)
    ms = 1000
    print(f"{args.dtype}, {args.requests} rows: step median {ms * statistics.median(steps):.3f} ms; outside the "
          f"kernels median {ms * statistics.median(outside):.3f} ms (min {ms * min(outside):.3f}), main-thread "
          f"CPU {ms * statistics.median(outside_cpu):.3f} ms; load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
