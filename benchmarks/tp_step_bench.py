"""Tensor parallelism's cost on the CPU: the same decode steps at tensor_parallel_size 1 and 2 on the same cores.

On one CPU the ranks share the cores (2 cores, 2 ranks: one thread each), so this shows the overhead of the
collectives (two all-reduces per layer, the embedding's, the logits' all-gather) and of feeding the step plan to
the other rank, not a speedup. TP=1 runs with all the threads, fused (the C decode step) and per op (the path the
ranks run: the fused step has no all-reduce between layers), and per op with one thread (what each rank gets).

    python benchmarks/tp_step_bench.py [--shape benchmarks/shapes/qwen3-0.6b] [--layers 8] [--batches 1,16]

Prints a table: ms per decode step (median over `--steps` steps, after the batch's prefill) per batch size.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("HETERO_INFER_LLM_ENGINE_PROCESS", "0")


def decode_step_ms(folder: str, tp: int, threads: int, batch: int, steps: int, dtype: str,
                   fused: bool = True) -> float:
    import torch
    from decode_batch import fill_decode_batch

    from hetero_infer import LLM

    torch.set_num_threads(threads)
    if not fused:  # the per-op path the ranks run (the C decode step has no all-reduce between layers)
        os.environ["HETERO_INFER_CPU_FUSED"] = "0"
    try:
        llm = LLM(folder, device="cpu", dtype=dtype, load_format="dummy", tensor_parallel_size=tp,
                  skip_tokenizer_init=True, max_model_len=1024)
    finally:
        os.environ.pop("HETERO_INFER_CPU_FUSED", None)
    try:
        engine = llm.engine
        fill_decode_batch(engine, batch, max_tokens=steps + 64)
        times = []
        for _ in range(steps):
            t = time.perf_counter()
            engine.step()
            times.append(time.perf_counter() - t)
        return 1000 * statistics.median(times)
    finally:
        if tp > 1:
            llm.engine.executor.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default=str(ROOT / "benchmarks" / "shapes" / "qwen3-0.6b"))
    p.add_argument("--layers", type=int, default=8, help="the shape's layers cut to this many (0: all)")
    p.add_argument("--batches", default="1,16")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--dtype", default="float32")
    args = p.parse_args(argv)
    import torch

    from hetero_infer.kernels.cpu import threads as cpu_threads

    cores = min(torch.get_num_threads(), cpu_threads.usable_cpus())
    config = json.loads((Path(args.shape) / "config.json").read_text())
    if args.layers:
        config["num_hidden_layers"] = args.layers
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "config.json").write_text(json.dumps(config))
        batches = [int(b) for b in args.batches.split(",")]
        runs = [("TP=1", 1, cores, True), ("TP=1, per op", 1, cores, False), ("TP=1, per op, 1 thread", 1, 1, False),
                (f"TP=2, {max(1, cores // 2)} thread(s) each", 2, cores, False)]
        rows = {name: [decode_step_ms(folder, tp, threads, b, args.steps, args.dtype, fused) for b in batches]
                for name, tp, threads, fused in runs}
    name = f"{Path(args.shape).name}" + (f", {args.layers} layers" if args.layers else "")
    print(f"\n{name}, {args.dtype}, {cores} cores: decode step, median ms over {args.steps} steps")
    print("| run | " + " | ".join(f"batch {b}" for b in batches) + " |")
    print("|---|" + "---|" * len(batches))
    base = rows["TP=1"]
    for run, values in rows.items():
        cells = [f"{v:.1f}" + ("" if run == "TP=1" else f" ({v / b0:.2f}x)") for v, b0 in zip(values, base)]
        print(f"| {run} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
