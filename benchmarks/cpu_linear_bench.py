"""Microbenchmark of the CPU linear layers: the project's bfloat16 GEMM against oneDNN and PyTorch.

The workload is every linear layer of one decode step of the default model (30 x qkv 576->960, o 576->576,
gate_up 576->3072, down 1536->576, and the 576->49152 LM head: 270 MB of bfloat16 weights), at several
batch sizes (rows). Each weight is a separate tensor, as in the engine, so the set (270 MB) does not fit
in the caches and every call streams its weight from memory. Prints the median time of the whole set,
the weight bandwidth and the arithmetic rate it implies, per implementation.

    python benchmarks/cpu_linear_bench.py [--threads 1 2] [--rows 1 8 32 64 256]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from timing import median_ms

from hetero_infer.kernels.cpu import linear as cpu_linear

SHAPES = [(576, 960), (576, 576), (576, 3072), (1536, 576)] * 30 + [(576, 49152)]  # (in, out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 64, 256])
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(n, k, generator=gen).to(torch.bfloat16) for k, n in SHAPES]
    ours = [cpu_linear.pack_weight(w) for w in weights]
    assert all(p.kind == "gemm_bf16" for p in ours), "this CPU has no AVX512_BF16: nothing to compare"
    onednn = [cpu_linear.PackedWeight("onednn", torch.ops.mkldnn._reorder_linear_weight(w, 32), *w.shape)
              for w in weights]
    nbytes = sum(w.numel() * w.element_size() for w in weights)
    flops_per_row = 2 * sum(k * n for k, n in SHAPES)
    print(f"torch {torch.__version__}; {len(SHAPES)} bfloat16 linears, {nbytes / 1e6:.0f} MB of weights")
    print("| threads | rows | ours ms | oneDNN ms | F.linear ms | ours vs oneDNN | ours GB/s | ours GFLOP/s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for threads in args.threads:
        torch.set_num_threads(threads)
        for m in args.rows:
            xs = {k: torch.randn(m, k, generator=gen).to(torch.bfloat16) for k in (576, 1536)}
            ms = []
            for packed in (ours, onednn):
                step = [(xs[k], p) for (k, _), p in zip(SHAPES, packed)]
                ms.append(median_ms(lambda step=step: [cpu_linear.packed_linear(x, p, None) for x, p in step],
                                    args.repeats, warmup=1))
            plain = [(xs[k], w) for (k, _), w in zip(SHAPES, weights)]
            ms.append(median_ms(lambda plain=plain: [F.linear(x, w) for x, w in plain], args.repeats, warmup=1))
            print(f"| {threads} | {m} | {ms[0]:.2f} | {ms[1]:.2f} | {ms[2]:.2f} | {ms[1] / ms[0]:.2f}x | "
                  f"{nbytes / ms[0] / 1e6:.1f} | {flops_per_row * m / ms[0] / 1e6:.0f} |")


if __name__ == "__main__":
    main()
