"""Microbenchmark of the CPU paged decode-attention kernel against PyTorch (gather + SDPA).

The shapes are those of a decode step of `hetero-infer bench` on the default model: 32 sequences,
9 query heads over 3 KV heads, head dim 64, block size 16, contexts drawn from 32..384 tokens.
Prints, per dtype and thread count, the median time of one layer's call, the KV bytes it must
read, the bandwidth that implies, and the speed-up over the PyTorch path.

    python benchmarks/cpu_attention_bench.py [--threads 1 2] [--repeats 200] [--cold] [--baseline REV]

With `--baseline REV`, paged_attention.c (and simd.h) at git revision REV is built into a temporary library
with the engine's flags and timed against this tree's kernel in the same minutes: each round calls both once,
in turn (the order reversed every other round), and each keeps its median; outputs are checked bit-identical.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

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


REPO = Path(__file__).resolve().parent.parent


def build_at(rev: str, folder: Path) -> dict[torch.dtype, object]:
    """paged_decode_f32/_bf16 of paged_attention.c at `rev`, built like the engine's library."""
    for name in ("paged_attention.c", "simd.h"):
        src = subprocess.run(["git", "show", f"{rev}:kernels/cpu/csrc/{name}"], cwd=REPO, check=True,
                             capture_output=True, text=True).stdout
        (folder / name).write_text(src)
    lib_path = folder / "paged_attention_old.so"
    subprocess.run([cpu_native._compiler() or "cc", cpu_native._march(), *cpu_native.FLAGS, f"-I{folder}",
                    str(folder / "paged_attention.c"), "-o", str(lib_path), "-lm"], check=True)
    lib = ctypes.CDLL(str(lib_path))
    fns = {torch.float32: lib.paged_decode_f32, torch.bfloat16: lib.paged_decode_bf16}
    for fn in fns.values():
        fn.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int] * 6 + [ctypes.c_float]
    return fns


def call_lib(fn, q, k, v, tables, lens, scale) -> torch.Tensor:
    out = torch.empty_like(q)
    b, h, d = q.shape
    fn(q.data_ptr(), k.data_ptr(), v.data_ptr(), tables.data_ptr(), lens.data_ptr(), out.data_ptr(),
       b, h, k.shape[2], d, k.shape[1], tables.shape[1], float(scale))
    return out


def interleaved_ms(fns, repeats: int, flush: torch.Tensor | None) -> list[float]:
    """Median ms of each of fns, timed in turn every round (order reversed every other round)."""
    for fn in fns * 5:
        fn()
    times: list[list[float]] = [[] for _ in fns]
    for r in range(repeats):
        for i in (range(len(fns)) if r % 2 else reversed(range(len(fns)))):
            if flush is not None:
                flush.sum()
            t0 = time.perf_counter()
            fns[i]()
            times[i].append(time.perf_counter() - t0)
    return [statistics.median(t) * 1e3 for t in times]


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
    ap.add_argument("--baseline", metavar="REV", help="also time paged_attention.c at this git revision")
    args = ap.parse_args()
    tmp = tempfile.TemporaryDirectory()
    old = build_at(args.baseline, Path(tmp.name)) if args.baseline else None
    flush = torch.zeros(32 * 2**20) if args.cold else None  # 128 MiB
    assert cpu_paged_attention.available(), "the C kernel did not build"
    print(f"kernel: {cpu_paged_attention.variant()}  torch {torch.__version__}  caches: {'cold' if args.cold else 'warm'}")
    if old is not None:
        print("| dtype | threads | baseline | this tree | speed-up |\n|---|---:|---:|---:|---:|")
    else:
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
        inputs = (q, k, v, tables, lens, scale)
        if old is not None:
            assert torch.equal(call_lib(old[dtype], *inputs), got), f"{dtype}: output differs from {args.baseline}"
        for threads in args.threads:
            torch.set_num_threads(threads)
            if old is not None:
                ms, oms = interleaved_ms([lambda inputs=inputs: cpu_paged_attention.paged_decode(*inputs),
                                          lambda fn=old[dtype], inputs=inputs: call_lib(fn, *inputs)],
                                         args.repeats, flush)
                print(f"| {str(dtype).removeprefix('torch.')} | {threads} | {args.baseline}: {oms:.3f} ms, "
                      f"{kv_bytes / oms / 1e6:.1f} GB/s | this tree: {ms:.3f} ms, {kv_bytes / ms / 1e6:.1f} GB/s | "
                      f"{oms / ms:.2f}x |")
                continue
            ms = median_ms(lambda inputs=inputs: cpu_paged_attention.paged_decode(*inputs), args.repeats, flush)
            tms = median_ms(lambda inputs=inputs: torch_path(*inputs), max(10, args.repeats // 10), flush)
            print(f"| {str(dtype).removeprefix('torch.')} | {threads} | {ms:.3f} | {tms:.3f} | {tms / ms:.1f}x | "
                  f"{kv_bytes / 1e6:.1f} | {kv_bytes / ms / 1e6:.1f} |")


if __name__ == "__main__":
    main()
