"""The fused CPU decode step against the per-op path, interleaved in one process: the default workload's prompts
(32-256 tokens) for `--requests` sequences, prefilled, then decode steps in blocks of `--block` steps that
alternate between the two paths on the same engine (a busy minute of a shared machine hits both alike).

    python -m benchmarks.cpu_fused_step_ab --dtype bfloat16 --requests 32 [--rounds 12] [--threads N]
    python -m benchmarks.cpu_fused_step_ab --dtype float32 --requests 1 --gemm-one-row

--gemm-one-row: before timing, every projection's one-row bucket is moved onto the dtype's own GEMM (the weight
packed for its other buckets), so the fused step covers one-row steps too; the per-op side keeps the measured
plan. This is the float32 case where the measurement chose `F.linear` for a small weight at one row (timed with
the weight in cache) and the fused step therefore stays off (docs/cpu.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--block", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch/OpenMP threads (0: as configured)")
    ap.add_argument("--gemm-one-row", action="store_true")
    args = ap.parse_args()
    if args.threads:
        os.environ["HETERO_INFER_CPU_ADAPT"] = "0"
        torch.set_num_threads(args.threads)

    from benchmarks.decode_batch import fill_decode_batch
    from hetero_infer.contracts.engine_options import EngineConfig
    from hetero_infer.kernels.cpu import decode_step
    from hetero_infer.worker.core.engine import LLMEngine

    engine = LLMEngine(EngineConfig(dtype=args.dtype))
    ex = engine.executor
    linears = [m for layer in ex.model.layers for m in (layer.self_attn.qkv_proj, layer.self_attn.o_proj,
                                                        layer.mlp.gate_up_proj, layer.mlp.down_proj)]
    measured = [m.by_bucket for m in linears]
    fused_plan = measured
    fused = ex.cpu_decode
    if args.gemm_one_row:
        kind = {torch.bfloat16: "gemm_bf16", torch.float32: "gemm_f32"}[ex.dtype]
        fused_plan = [(next(p for p in b if p.kind == kind),) + b[1:] for b in measured]
        for m, b in zip(linears, fused_plan):
            m.by_bucket = b
        fused = decode_step.FusedDecodeStack.build(ex.model, ex.backend, ex.kv_caches, ex.dtype)
    assert fused is not None, "the fused step is off here (see the log)"
    print(f"fused: {fused.label}; per op: the measured plan ({ex.cpu_paths.get('o_proj')} for o_proj)")

    fill_decode_batch(engine, args.requests, 2 * args.rounds * args.block + 40, settle=4)

    times: dict[str, list[float]] = {"fused": [], "per op": []}
    for r in range(args.rounds):
        for name in ("fused", "per op") if r % 2 == 0 else ("per op", "fused"):
            for m, b in zip(linears, fused_plan if name == "fused" else measured):
                m.by_bucket = b
            ex.cpu_decode = fused if name == "fused" else None
            for _ in range(args.block):
                t = time.perf_counter()
                engine.step()
                times[name].append(time.perf_counter() - t)
    f, p = statistics.median(times["fused"]), statistics.median(times["per op"])
    load = " ".join(open("/proc/loadavg").read().split()[:3])
    print(f"{args.dtype}, {args.requests} rows a step, threads {torch.get_num_threads()}: fused median {1e3 * f:.2f} "
          f"ms (min {1e3 * min(times['fused']):.2f}), per op median {1e3 * p:.2f} ms (min "
          f"{1e3 * min(times['per op']):.2f}), per op / fused {p / f:.3f}; {len(times['fused'])} steps each; "
          f"load {load}")


if __name__ == "__main__":
    main()
