"""A/B of the bfloat16 GEMM: this tree's gemm.c against gemm.c at a git revision, in one process.

The old source is built into a temporary library with the engine's flags (kernels/cpu/native.py) and called
through the same packed layout, so both run on the same weights in the same minutes: each round times every
variant once, in turn (the order reversed every other round), and each keeps the median of its rounds (a slow minute of a shared machine hits all
variants alike). Variants: `old` (the revision's kernel, weights packed on ordinary 4 KiB pages as before
weight_arena.py), `new-4k` (this kernel, ordinary pages), `new` (this kernel, weights on the huge-page arena,
as the engine packs them now).

The workload is `cpu_linear_bench.py`'s: every linear of one decode step of the default model, 121 distinct
weights (270 MB, eight times the L3 of the dev box), so each call reads its weight from memory as in the
engine; `--lm-head` times the 49152x576 LM head alone, a 64 MB buffer read before each call. `--per-shape`
times each of the five shapes alone, one call per sample, cycling through copies of the weight that add up to
more than 64 MB (so each call reads its copy from memory): short samples, which a shared machine preempts far
less often than a whole step of 121 calls (a two-thread parallel region waits for a descheduled thread).

    python benchmarks/cpu_gemm_bf16_ab.py --baseline a8198fb~1 [--threads 1 2] [--rows 1 8 32 64 256]
    python benchmarks/cpu_gemm_bf16_ab.py --baseline a8198fb~1 --per-shape --threads 2 --rows 16 32 64
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

from hetero_infer.kernels.cpu import linear as cpu_linear
from hetero_infer.kernels.cpu import native

SHAPES = [(576, 960), (576, 576), (576, 3072), (1536, 576)] * 30 + [(576, 49152)]  # (in, out)
REPO = Path(__file__).resolve().parent.parent


def build_at(rev: str, folder: Path):
    """gemm_bf16 of gemm.c (and simd.h) at `rev`, built like the engine's library."""
    for name in ("gemm.c", "simd.h"):
        src = subprocess.run(["git", "show", f"{rev}:kernels/cpu/csrc/{name}"], cwd=REPO, check=True,
                             capture_output=True, text=True).stdout
        (folder / name).write_text(src)
    lib = folder / "gemm_old.so"
    subprocess.run([native._compiler() or "cc", native._march(), *native.FLAGS, f"-I{folder}", str(folder / "gemm.c"),
                    "-o", str(lib), "-lm"], check=True)
    fn = ctypes.CDLL(str(lib)).gemm_bf16
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                   ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


def pack_4k(w: torch.Tensor) -> torch.Tensor:
    """The bfloat16 layout on ordinary pages (the packing before weight_arena.py)."""
    n, k = w.shape
    padded = torch.zeros(-(-n // 64) * 64, k, dtype=torch.bfloat16)
    padded[:n] = w
    return padded.view(-1, 64, k // 2, 2).permute(0, 2, 1, 3).contiguous()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", required=True, help="git revision of the old gemm.c")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 64, 256])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--lm-head", action="store_true", help="the LM head alone, caches flushed before each call")
    ap.add_argument("--per-shape", action="store_true", help="each shape alone, one call per sample")
    args = ap.parse_args()
    if args.per_shape:
        return per_shape(args)
    new_fn = cpu_linear._gemm_bf16()
    assert new_fn is not None, "no AVX512_BF16 in this build: nothing to compare"
    tmp = tempfile.TemporaryDirectory()
    old_fn = build_at(args.baseline, Path(tmp.name))
    shapes = [(576, 49152)] if args.lm_head else SHAPES
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(n, k, generator=gen).to(torch.bfloat16) for k, n in shapes]
    four_k = [pack_4k(w) for w in weights]
    arena = [cpu_linear.pack_as("gemm_bf16", w).data for w in weights]
    variants = {"old": (old_fn, four_k), "new-4k": (new_fn, four_k), "new": (new_fn, arena)}
    flush = torch.ones(64 << 20, dtype=torch.uint8) if args.lm_head else None
    nbytes = sum(w.numel() * 2 for w in weights)
    flops_per_row = 2 * sum(k * n for k, n in shapes)
    print(f"baseline {args.baseline}; {len(shapes)} linears, {nbytes / 1e6:.0f} MB of bfloat16 weights; "
          f"median of {args.rounds} interleaved rounds")
    print("| threads | rows | old ms | new-4k ms | new ms | old / new | new GB/s | new GFLOP/s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for threads in args.threads:
        torch.set_num_threads(threads)
        for m in args.rows:
            xs = {k: torch.randn(m, k, generator=gen).to(torch.bfloat16) for k in (576, 1536)}
            outs = {n: torch.empty(m, n, dtype=torch.bfloat16) for n in {n for _, n in shapes}}
            calls = [(xs[k].data_ptr(), k, n, outs[n].data_ptr()) for k, n in shapes]
            samples: dict[str, list[float]] = {v: [] for v in variants}
            for r in range(args.rounds + 1):
                order = list(variants.items())
                for name, (fn, packs) in order[::-1] if r % 2 else order:  # each goes first and last
                    if flush is not None:
                        flush.sum()
                    t0 = time.perf_counter()
                    for (x, k, n, out), p in zip(calls, packs):
                        if fn(x, m, k, p.data_ptr(), n, None, out) != 0:
                            raise RuntimeError(f"{name} failed")
                    if r:  # the first round warms up
                        samples[name].append(time.perf_counter() - t0)
            ms = {v: statistics.median(s) * 1e3 for v, s in samples.items()}
            print(f"| {threads} | {m} | {ms['old']:.2f} | {ms['new-4k']:.2f} | {ms['new']:.2f} | "
                  f"{ms['old'] / ms['new']:.2f}x | {nbytes / ms['new'] / 1e6:.1f} | "
                  f"{flops_per_row * m / ms['new'] / 1e6:.0f} |", flush=True)


def per_shape(args: argparse.Namespace) -> None:
    new_fn = cpu_linear._gemm_bf16()
    assert new_fn is not None, "no AVX512_BF16 in this build: nothing to compare"
    tmp = tempfile.TemporaryDirectory()
    old_fn = build_at(args.baseline, Path(tmp.name))
    gen = torch.Generator().manual_seed(0)
    samples_per_round = 20
    print(f"baseline {args.baseline}; each shape alone, weights from memory; median of {args.rounds} interleaved "
          f"rounds x {samples_per_round} calls")
    print("| threads | weight (out x in) | rows | old ms | new-4k ms | new ms | old / new | new GFLOP/s |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    for k, n in dict.fromkeys(SHAPES):
        w = torch.randn(n, k, generator=gen).to(torch.bfloat16)
        copies = (64 << 20) // (n * k * 2) + 2
        four_k = [pack_4k(w) for _ in range(copies)]
        arena = [cpu_linear.pack_as("gemm_bf16", w).data for _ in range(copies)]
        variants = {"old": (old_fn, four_k), "new-4k": (new_fn, four_k), "new": (new_fn, arena)}
        for threads in args.threads:
            torch.set_num_threads(threads)
            for m in args.rows:
                x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
                out = torch.empty(m, n, dtype=torch.bfloat16)
                samples: dict[str, list[float]] = {v: [] for v in variants}
                for r in range(args.rounds + 1):
                    order = list(variants.items())
                    for name, (fn, packs) in order[::-1] if r % 2 else order:
                        for i in range(samples_per_round):
                            p = packs[(r * samples_per_round + i) % copies]
                            t0 = time.perf_counter()
                            fn(x.data_ptr(), m, k, p.data_ptr(), n, None, out.data_ptr())
                            if r:
                                samples[name].append(time.perf_counter() - t0)
                ms = {v: statistics.median(s) * 1e3 for v, s in samples.items()}
                print(f"| {threads} | {n}x{k} | {m} | {ms['old']:.3f} | {ms['new-4k']:.3f} | {ms['new']:.3f} | "
                      f"{ms['old'] / ms['new']:.2f}x | {2 * m * n * k / ms['new'] / 1e6:.0f} |", flush=True)


if __name__ == "__main__":
    main()
