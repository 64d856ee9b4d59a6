"""Host time of an eager step's input preparation on the CPU (`TorchExecutor._prepare`: the step's integer
inputs as tensors and the CPU attention backend's metadata), for decode steps of `--rows` sequences, without a
model. The executor is a stand-in that carries what `_prepare` reads in this tree and in the trees before the
staging area (`_h2d`), so the same script times both.

    python benchmarks/step_prepare_ab.py --rows 1 32 256

A/B between two trees: run it alternately from each with PYTHONPATH pointing at the tree, e.g.
`cd /tmp && PYTHONPATH=/tmp/base python /tmp/base/benchmarks/step_prepare_ab.py`, then the same with the other.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from hetero_infer.contracts.sampling_params import SamplingParams
from hetero_infer.worker.core.scheduler import ScheduledSeq, SchedulerOutput
from hetero_infer.worker.core.sequence import Sequence
from hetero_infer.worker.core.step_plan import launch_step
from hetero_infer.worker.runner.attention.base import to_device
from hetero_infer.worker.runner.attention.cpu_backend import CpuBackend
from hetero_infer.worker.runner.executor import TorchExecutor
from hetero_infer.worker.runner.inputs import step_inputs

BLOCK = 16


class StandIn:
    _prepare = TorchExecutor._prepare

    def __init__(self) -> None:
        self.device = torch.device("cpu")
        self.backend = CpuBackend(rope=None)
        self._prev_tokens, self._prev_rows = None, {}
        try:
            from hetero_infer.worker.runner.staging import StagingArea
        except ImportError:  # a tree before the staging area
            return
        self.staging = StagingArea(self.device)

    def _h2d(self, t):
        return to_device(t, self.device)


def decode_step(rows: int, context: int = 300):
    scheduled = []
    for i in range(rows):
        seq = Sequence("r", [100 + i] * context, context - 8, SamplingParams(), 1024)
        seq.num_computed_tokens = context - 1
        seq.block_table = list(range(i * 64, i * 64 + -(-context // BLOCK)))
        scheduled.append(ScheduledSeq(seq, 1))
    tables = {item.seq.seq_id: item.seq.block_table for item in scheduled}  # the executor's
    return step_inputs(launch_step(SchedulerOutput(scheduled))[0], tables, BLOCK)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 32, 256])
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    ex = StandIn()
    for rows in args.rows:
        step = decode_step(rows)
        times = []
        for _ in range(args.repeats):
            start = time.thread_time()
            for _ in range(args.iters):
                ex._prepare(step)
            times.append((time.thread_time() - start) / args.iters)
        print(f"{rows} rows: _prepare {1e6 * statistics.median(times):.1f} us (CPU time, median of {args.repeats})")


if __name__ == "__main__":
    main()
