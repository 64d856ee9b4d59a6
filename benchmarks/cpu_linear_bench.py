"""Microbenchmark of the CPU linear layers: the project's GEMMs against oneDNN and PyTorch's F.linear.

The workload is every linear layer of one decode step of the default model (30 x qkv 576->960, o 576->576,
gate_up 576->3072, down 1536->576, and the 576->49152 LM head: 270 MB of bfloat16 weights, 540 MB of
float32), at several batch sizes (rows). Each weight is a separate tensor, as in the engine, so the set does
not fit in the caches and every call streams its weight from memory. Prints the median time of the whole set,
the weight bandwidth and the arithmetic rate it implies, per implementation (the project's GEMM of the dtype:
`gemm_bf16` or `gemm_f32`; `onednn`; `torch`, i.e. F.linear).

`--per-shape` times each of the five shapes alone instead, its weight read from memory (a buffer larger than
the last-level cache is read before each call), the candidates interleaved round by round (a slow minute of a
shared machine hits all of them) and each keeping the best of its per-round medians.

    python benchmarks/cpu_linear_bench.py [--dtype bfloat16|float32] [--threads 1 2] [--rows 1 8 32 64 256]
    python benchmarks/cpu_linear_bench.py --dtype float32 --per-shape --rows 1 8 32 256 2048
"""

from __future__ import annotations

import argparse

import torch
from timing import median_ms

from hetero_infer.kernels.cpu import linear as cpu_linear

SHAPES = [(576, 960), (576, 576), (576, 3072), (1536, 576)] * 30 + [(576, 49152)]  # (in, out)
OWN = {torch.bfloat16: "gemm_bf16", torch.float32: "gemm_f32"}


def kinds_for(dtype: torch.dtype) -> list[str]:
    own = OWN[dtype]
    reason = cpu_linear.unsupported(own, torch.zeros(1, 2, dtype=dtype))
    assert reason is None, f"{own} does not run here ({reason}): nothing to compare"
    return [own, "onednn", "torch"]


def whole_step(dtype: torch.dtype, threads: list[int], rows: list[int], repeats: int) -> None:
    gen = torch.Generator().manual_seed(0)
    kinds = kinds_for(dtype)
    weights = [torch.randn(n, k, generator=gen).to(dtype) for k, n in SHAPES]
    packed = {kind: [cpu_linear.pack_as(kind, w) for w in weights] for kind in kinds}
    nbytes = sum(w.numel() * w.element_size() for w in weights)
    flops_per_row = 2 * sum(k * n for k, n in SHAPES)
    print(f"torch {torch.__version__}; {len(SHAPES)} {str(dtype)[6:]} linears, {nbytes / 1e6:.0f} MB of weights")
    print(f"| threads | rows | {kinds[0]} ms | oneDNN ms | F.linear ms | {kinds[0]} vs oneDNN | {kinds[0]} vs F.linear "
          f"| {kinds[0]} GB/s | {kinds[0]} GFLOP/s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for t in threads:
        torch.set_num_threads(t)
        for m in rows:
            xs = {k: torch.randn(m, k, generator=gen).to(dtype) for k in (576, 1536)}
            ms = []
            for kind in kinds:
                step = [(xs[k], p) for (k, _), p in zip(SHAPES, packed[kind])]
                ms.append(median_ms(lambda step=step: [cpu_linear.packed_linear(x, p, None) for x, p in step],
                                    repeats, warmup=1))
            print(f"| {t} | {m} | {ms[0]:.2f} | {ms[1]:.2f} | {ms[2]:.2f} | {ms[1] / ms[0]:.2f}x | {ms[2] / ms[0]:.2f}x | "
                  f"{nbytes / ms[0] / 1e6:.1f} | {flops_per_row * m / ms[0] / 1e6:.0f} |", flush=True)


def per_shape(dtype: torch.dtype, threads: list[int], rows: list[int], repeats: int, rounds: int) -> None:
    gen = torch.Generator().manual_seed(0)
    kinds = kinds_for(dtype)
    flush = torch.ones(64 << 20, dtype=torch.uint8)  # 64 MB, twice the L3 of the dev box
    print(f"torch {torch.__version__}; {str(dtype)[6:]}; each cell: best of {rounds} interleaved rounds of the "
          f"median of {repeats} calls, weight from memory")
    print(f"| threads | weight (out x in) | rows | {kinds[0]} ms | oneDNN ms | F.linear ms | {kinds[0]} vs oneDNN "
          f"| {kinds[0]} vs F.linear | {kinds[0]} GFLOP/s |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for t in threads:
        torch.set_num_threads(t)
        for k, n in dict.fromkeys(SHAPES):
            w = torch.randn(n, k, generator=gen).to(dtype)
            packed = {kind: cpu_linear.pack_as(kind, w) for kind in kinds}
            for m in rows:
                x = torch.randn(m, k, generator=gen).to(dtype)
                reps = max(1, repeats if m * n * k < 5e8 else repeats // 4)
                best = dict.fromkeys(kinds, float("inf"))
                for _ in range(rounds):
                    for kind in kinds:
                        ms = median_ms(lambda p=packed[kind], x=x: cpu_linear.packed_linear(x, p, None), reps, flush,
                                       warmup=1)
                        best[kind] = min(best[kind], ms)
                ms = [best[kind] for kind in kinds]
                print(f"| {t} | {n}x{k} | {m} | {ms[0]:.3f} | {ms[1]:.3f} | {ms[2]:.3f} | {ms[1] / ms[0]:.2f}x | "
                      f"{ms[2] / ms[0]:.2f}x | {2 * m * n * k / ms[0] / 1e6:.0f} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 64, 256])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--per-shape", action="store_true", help="time each shape alone (weight from memory)")
    ap.add_argument("--rounds", type=int, default=3, help="--per-shape: interleaved rounds per cell")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    if args.per_shape:
        per_shape(dtype, args.threads, args.rows, args.repeats, args.rounds)
    else:
        whole_step(dtype, args.threads, args.rows, args.repeats)


if __name__ == "__main__":
    main()
