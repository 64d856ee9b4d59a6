"""Microbenchmark of the CPU paged decode-attention kernel against PyTorch (gather + SDPA).

The shapes are those of a decode step of `hetero-infer bench` on the default model: 32 sequences,
9 query heads over 3 KV heads, head dim 64, block size 16, contexts drawn from 32..384 tokens.
Prints, per dtype and thread count, the median time of one layer's call, the KV bytes it must
read, the bandwidth that implies, and the speed-up over the PyTorch path.

    python benchmarks/cpu_attention_bench.py [--threads 1 2] [--repeats 200] [--cold]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from timing import median_ms

from hetero_infer.kernels.cpu import native as cpu_native
from hetero_infer.kernels.cpu import paged_attention as cpu_paged_attention


def make_inputs(dtype: torch.dtype, batch: int, heads: int, kv_heads: int, dim: int, block: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    lens = torch.randint(32, 385, (batch,), generator=gen, dtype=torch.int32)
    blocks_per_seq = [-(-int(n) // block) for n in lens]
    num_blocks = sum(blocks_per_seq) + 8
    perm = torch.randperm(num_blocks, generator=gen).int()
    max_blocks = max(blocks_per_seq)
    tables = torch.zeros(batch, max_blocks, dtype=torch.int32)
    i = 0
    for b, nb in enumerate(blocks_per_seq):
        tables[b, :nb] = perm[i : i + nb]
        i += nb
    # allocated as the engine allocates its KV cache (huge pages where the kernel allows)
    k = cpu_native.empty_huge_pages((num_blocks, block, kv_heads, dim), dtype)
    v = cpu_native.empty_huge_pages((num_blocks, block, kv_heads, dim), dtype)
    k.copy_(torch.randn(k.shape, generator=gen))
    v.copy_(torch.randn(v.shape, generator=gen))
    q = torch.randn(batch, heads, dim, generator=gen).to(dtype)
    return q, k, v, tables, lens


def torch_path(q, k, v, tables, lens, scale):
    """What the engine does without the kernel: gather each sequence's blocks, mask, SDPA."""
    block = k.shape[1]
    max_len = int(lens.max())
    pos = torch.arange(max_len)
    slots = tables[:, pos // block].long() * block + (pos % block)  # [B, L]
    flat_k = k.view(-1, *k.shape[2:])
    flat_v = v.view(-1, *v.shape[2:])
    mask = pos.unsqueeze(0) < lens.unsqueeze(1)
    keys = flat_k[slots].transpose(1, 2)
    values = flat_v[slots].transpose(1, 2)
    return F.scaled_dot_product_attention(
        q.unsqueeze(2), keys, values, attn_mask=mask[:, None, None, :], scale=scale, enable_gqa=True
    ).squeeze(2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--cold", action="store_true", help="flush the caches before each call (as in the engine)")
    args = ap.parse_args()
    flush = torch.zeros(32 * 2**20) if args.cold else None  # 128 MiB
    assert cpu_paged_attention.available(), "the C kernel did not build"
    print(f"kernel: {cpu_paged_attention.variant()}  torch {torch.__version__}  caches: {'cold' if args.cold else 'warm'}")
    print("| dtype | threads | kernel ms | torch ms | speed-up | KV MB read | kernel GB/s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for dtype in (torch.float32, torch.bfloat16):
        q, k, v, tables, lens = make_inputs(dtype, args.batch, args.heads, args.kv_heads, args.dim, 16)
        scale = args.dim**-0.5
        ref = torch_path(q.double(), k.double(), v.double(), tables, lens, scale)
        got = cpu_paged_attention.paged_decode(q, k, v, tables, lens, scale)
        err = (got.double() - ref).abs().max().item()
        assert err < (1e-4 if dtype == torch.float32 else 3e-2), f"{dtype}: max error {err}"
        kv_bytes = int(lens.sum()) * args.kv_heads * args.dim * 2 * k.element_size()
        for threads in args.threads:
            torch.set_num_threads(threads)
            inputs = (q, k, v, tables, lens, scale)
            ms = median_ms(lambda inputs=inputs: cpu_paged_attention.paged_decode(*inputs), args.repeats, flush)
            tms = median_ms(lambda inputs=inputs: torch_path(*inputs), max(10, args.repeats // 10), flush)
            print(f"| {str(dtype).removeprefix('torch.')} | {threads} | {ms:.3f} | {tms:.3f} | {tms / ms:.1f}x | "
                  f"{kv_bytes / 1e6:.1f} | {kv_bytes / ms / 1e6:.1f} |")


if __name__ == "__main__":
    main()
