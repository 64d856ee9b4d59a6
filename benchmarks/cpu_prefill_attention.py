"""Prefill attention on the CPU: the C paged kernel (one query row at a time, straight from the block pool) against
torch's SDPA over the chunk's gathered blocks (`cpu_backend.prefill_attention`), per chunk shape (cached + new
rows), on the default model's heads (9 query, 3 KV, dim 64) unless told otherwise. Medians; prints a table and
the largest difference between the two (docs/cpu.md, "Prefill attention").

    python benchmarks/cpu_prefill_attention.py [--dtype bfloat16] [--repeats 7]

The last column: which of the two the default threshold takes (`cpu_backend.takes_sdpa`; the engine measures its
own threshold at start-up, `measure_sdpa_min_pairs`).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import torch

from hetero_infer.kernels.cpu import paged_attention
from hetero_infer.worker.runner.attention.base import SeqSpan
from hetero_infer.worker.runner.attention.cpu_backend import prefill_attention, takes_sdpa

SHAPES = [(0, 2048), (0, 256), (0, 128), (0, 64), (0, 32), (0, 16), (0, 8), (1024, 256), (1024, 64), (1024, 16), (1024, 8), (1024, 4), (1024, 2), (256, 8), (256, 4), (128, 8)]


def median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args(argv)
    assert paged_attention.available(), "the C library did not build here"
    dtype, bs, d = getattr(torch, a.dtype), a.block_size, a.head_dim
    gen = torch.Generator().manual_seed(0)
    pool = max(-(-(start + n) // bs) for start, n in SHAPES)
    k_cache = torch.randn(pool, bs, a.kv_heads, d, generator=gen).to(dtype)
    v_cache = torch.randn(pool, bs, a.kv_heads, d, generator=gen).to(dtype)
    scale = d ** -0.5
    print(f"threads {torch.get_num_threads()}, {a.dtype}, {a.heads} query / {a.kv_heads} KV heads of {d}, "
          f"blocks of {bs}")
    print("| chunk (cached + new rows) | paged kernel (ms) | SDPA (ms) | max difference | the engine takes |")
    print("|---|---:|---:|---:|---|")
    for start, n in SHAPES:
        length = start + n
        blocks = torch.randperm(pool, generator=gen)[: -(-length // bs)]
        q = torch.randn(n, a.heads, d, generator=gen).to(dtype)
        tables = blocks.to(torch.int32).repeat(n, 1)
        lens = torch.arange(start + 1, length + 1, dtype=torch.int32)

        paged = functools.partial(paged_attention.paged_decode, q, k_cache, v_cache, tables, lens, scale)
        sdpa = functools.partial(prefill_attention, q, k_cache, v_cache, start, blocks, scale)

        diff = (paged().float() - sdpa().float()).abs().max().item()
        taken = "SDPA" if takes_sdpa(SeqSpan([], start, n, True)) else "paged"
        print(f"| {start:,} + {n:,} | {median_ms(paged, a.repeats):.2f} | {median_ms(sdpa, a.repeats):.2f} "
              f"| {diff:.1e} | {taken} |")


if __name__ == "__main__":
    main()
