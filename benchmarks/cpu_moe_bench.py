"""The CPU MoE decode kernel (kernels/cpu/moe.py) against the grouped GEMM path (kernels/moe.py's `grouped_moe`) on
one MoE layer's experts, both against the reference: milliseconds, weight bytes/s of the experts hit, max error.

    OMP_NUM_THREADS=1 python benchmarks/cpu_moe_bench.py --dtype float32 --tokens 1,8,32,64

Default shape: benchmarks/shapes/qwen3-moe-1b-a0.2b's layer (H 1024, 64 experts of I 384, top 8).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from hetero_infer import kernels
from hetero_infer.kernels import moe, reference
from hetero_infer.kernels.cpu import moe as cpu_moe


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--tokens", default="1,8,32,64")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--intermediate", type=int, default=384)
    p.add_argument("--experts", type=int, default=64)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--repeats", type=int, default=15)
    a = p.parse_args()
    torch.manual_seed(0)
    dt, h, i, e = getattr(torch, a.dtype), a.hidden, a.intermediate, a.experts
    w1, w2 = (torch.randn(e, 2 * i, h) * h**-0.5).to(dt), (torch.randn(e, h, i) * i**-0.5).to(dt)
    ew1, ew2 = kernels.ExpertWeights(w1), kernels.ExpertWeights(w2)

    def timed(f) -> float:
        times = []
        for _ in range(a.repeats):
            t = time.perf_counter()
            f()
            times.append(time.perf_counter() - t)
        return statistics.median(times)

    print("| tokens | experts hit | C ms | C GB/s | grouped ms | grouped GB/s | C / grouped | max err C | grouped |")
    print("|---|---|---|---|---|---|---|---|---|")
    for t in map(int, a.tokens.split(",")):
        x = (torch.randn(t, h) * 0.5).to(dt)
        weights, ids = kernels.moe_routing(torch.randn(t, e), a.top_k, True)
        ref = reference.fused_moe(x, ew1, ew2, weights, ids).float()
        c = cpu_moe.moe_experts(x, w1, w2, weights, ids)
        g = moe.grouped_moe(x, ew1, ew2, weights, ids)
        args = (x, weights, ids)
        tc = timed(lambda a=args: cpu_moe.moe_experts(a[0], w1, w2, a[1], a[2]))
        tg = timed(lambda a=args: moe.grouped_moe(a[0], ew1, ew2, a[1], a[2]))
        hit = int((torch.bincount(ids.flatten().long(), minlength=e) > 0).sum())
        nbytes = hit * 3 * h * i * w1.element_size()
        print(f"| {t} | {hit} | {tc * 1e3:.2f} | {nbytes / tc / 1e9:.1f} | {tg * 1e3:.2f} | {nbytes / tg / 1e9:.1f} | "
              f"{tc / tg:.2f} | {(c.float() - ref).abs().max():.1e} | {(g.float() - ref).abs().max():.1e} |")


if __name__ == "__main__":
    main()
