"""Microbenchmark of the CPU weight-only quantized linears (W8A16, W4A16) against bfloat16 and PyTorch's own.

The workload is the 120 quantized projections of one decode step of the default model (30 x qkv 576->960,
o 576->576, gate_up 576->3072, down 1536->576: 202 MB in bfloat16), each weight a separate tensor as in the
engine, so every call streams its weight from memory. Per row count it prints the median time of the set for:

* bf16: the project's bfloat16 GEMM (the unquantized model);
* int8 / int4 ours: the project's W8A16 / W4A16 GEMM (`gemm_w8a16`, `gemm_w4a16`, kernels/cpu/csrc/gemm.c);
* int8 / int4 torch: PyTorch's CPU kernels for the same formats, as gpt-fast and torchao use them
  (`torch._weight_int8pack_mm`, `torch._weight_int4pack_mm_for_cpu`; groups of 64 / 128 as ours);
* int8 / int4 ref: the kernels' PyTorch reference (`hetero_infer.kernels.int8_matmul` / `int4_matmul` on
  CPU), what quantized models ran on before the C GEMM.

    python benchmarks/cpu_quant_linear_bench.py [--threads 1 2] [--rows 1 8 32 256]

Across ISA levels (issue 42): `--isa-levels avx512,avx2,portable` runs the set once per level in a process of its
own (the library built at HETERO_INFER_CPU_ISA=level; PyTorch, oneDNN and MKL held to AVX2 at every level, so only
our kernels change), `--rounds` times in alternating order, and prints each level's median ms of the path the
engine runs there (the C W8A16 / W4A16 GEMM where the level builds it, else the PyTorch reference the quantized
layers fall back to) and the ratios. On an AVX2-only CPU:

    python benchmarks/cpu_quant_linear_bench.py --isa-levels avx2,portable --threads 1 --rows 1 8 32
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

import torch
from timing import median_ms

from hetero_infer import kernels
from hetero_infer.kernels.cpu import linear as cpu_linear
from hetero_infer.kernels.cpu import native
from hetero_infer.worker.quant.quantize import int4_group_size

SHAPES = [(576, 960), (576, 576), (576, 3072), (1536, 576)] * 30  # (in, out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 256])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--no-reference", action="store_true", help="skip the (slow) PyTorch reference")
    ap.add_argument("--isa-levels", help="comma-separated HETERO_INFER_CPU_ISA levels to compare (a process each)")
    ap.add_argument("--rounds", type=int, default=2, help="with --isa-levels: runs of each level, alternating")
    ap.add_argument("--json-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.isa_levels:
        return isa_table(args)
    if not cpu_linear.quantized_gemm_available():  # the portable level: the layers run the PyTorch reference
        print(f"no C W8A16 / W4A16 GEMM at ISA level {native.isa()}: the 'ours' columns are the reference")
    gen = torch.Generator().manual_seed(0)
    weights = [(torch.randn(n, k, generator=gen) * 0.05).to(torch.bfloat16) for k, n in SHAPES]
    impl: dict[str, list] = {"bf16": [cpu_linear.pack_weight(w) for w in weights]}
    q8 = [kernels.quantize_int8(w) for w in weights]
    groups = [int4_group_size(k) for k, _ in SHAPES]
    q4 = [kernels.quantize_int4(w, g) for w, g in zip(weights, groups)]
    ours = cpu_linear.quantized_gemm_available()
    if ours:
        impl["int8 ours"] = [cpu_linear.pack_int8(q, s) for q, s in q8]
        impl["int4 ours"] = [cpu_linear.pack_int4(kernels.unpack_int4(p, g), s, z, g)
                             for (p, s, z), g in zip(q4, groups)]
    torch8 = [(q, s.to(torch.bfloat16)) for q, s in q8]
    torch4 = []
    for (p, s, z), g in zip(q4, groups):  # torchao's convention: w = (q - 8) * scale + zero, [K/G, N, 2]
        levels = kernels.unpack_int4(p, g).to(torch.int32)
        offset = ((8 - z.float()) * s).T
        torch4.append((torch._convert_weight_to_int4pack_for_cpu(levels, 1), g,
                       torch.stack([s.T, offset], dim=-1).to(torch.bfloat16).contiguous()))
    nbytes = {"bf16": sum(w.numel() * 2 for w in weights)}
    nbytes["int8"] = sum(q.numel() + s.numel() * 4 for q, s in q8)
    nbytes["int4"] = sum(p.numel() + s.numel() * 4 + z.numel() for p, s, z in q4)
    print(f"torch {torch.__version__}; {len(SHAPES)} projections; weights: bf16 {nbytes['bf16'] / 1e6:.0f} MB, "
          f"int8 {nbytes['int8'] / 1e6:.0f} MB, int4 {nbytes['int4'] / 1e6:.0f} MB")
    cols = ["bf16", "int8 ours", "int8 torch", "int8 ref", "int4 ours", "int4 torch", "int4 ref"]
    print("| threads | rows | " + " | ".join(f"{c} ms" for c in cols) + " | int8 ours GB/s | int4 ours GB/s |")
    print("|---:|---:|" + "---:|" * (len(cols) + 2))
    results: list[dict] = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        for m in args.rows:
            xs = {k: torch.randn(m, k, generator=gen).to(torch.bfloat16) for k in (576, 1536)}
            runs = {
                "bf16": lambda xs=xs: [cpu_linear.packed_linear(xs[k], p, None) for (k, _), p in zip(SHAPES, impl["bf16"])],
            }
            runs |= {
                "int8 ours": lambda xs=xs: [cpu_linear.packed_linear(xs[k], p, None)
                                      for (k, _), p in zip(SHAPES, impl["int8 ours"])],
                "int4 ours": lambda xs=xs: [cpu_linear.packed_linear(xs[k], p, None)
                                      for (k, _), p in zip(SHAPES, impl["int4 ours"])],
            } if ours else {  # what the quantized layers run without the C GEMM (float32 activations there)
                "int8 ours": lambda xs=xs: [kernels.int8_matmul(xs[k].float(), q, s) for (k, _), (q, s) in zip(SHAPES, q8)],
                "int4 ours": lambda xs=xs: [kernels.int4_matmul(xs[k].float(), p, s, z, g)
                                      for (k, _), (p, s, z), g in zip(SHAPES, q4, groups)],
            }
            runs |= {
                "int8 torch": lambda xs=xs: [torch._weight_int8pack_mm(xs[k], q, s) for (k, _), (q, s) in zip(SHAPES, torch8)],
                "int4 torch": lambda xs=xs: [torch._weight_int4pack_mm_for_cpu(xs[k], p, g, sz)
                                       for (k, _), (p, g, sz) in zip(SHAPES, torch4)],
                "int8 ref": lambda xs=xs: [kernels.int8_matmul(xs[k], q, s) for (k, _), (q, s) in zip(SHAPES, q8)],
                "int4 ref": lambda xs=xs: [kernels.int4_matmul(xs[k], p, s, z, g)
                                     for (k, _), (p, s, z), g in zip(SHAPES, q4, groups)],
            }
            ms = {}
            for c in cols:
                if c.endswith("ref") and (args.no_reference or m > 32) or (args.json_out and c.endswith(("torch", "ref"))):
                    ms[c] = float("nan")
                    continue
                ms[c] = median_ms(runs[c], args.repeats if not c.endswith("ref") else 3, warmup=1)
            if args.json_out:
                results.append({"threads": threads, "rows": m, "isa": native.isa(), "c_gemm": ours,
                                **{c: ms[c] for c in ("bf16", "int8 ours", "int4 ours")}})
            cells = " | ".join("n/a" if ms[c] != ms[c] else f"{ms[c]:.2f}" for c in cols)
            print(f"| {threads} | {m} | {cells} | {nbytes['int8'] / ms['int8 ours'] / 1e6:.1f} | "
                  f"{nbytes['int4'] / ms['int4 ours'] / 1e6:.1f} |")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(results, f)


TORCH_AT_AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def isa_table(args: argparse.Namespace) -> None:
    """The set at each ISA level (a process each, `--rounds` times alternating), medians and ratios."""
    import tempfile

    levels = [level.strip() for level in args.isa_levels.split(",")]
    runs: dict[str, list[list[dict]]] = {level: [] for level in levels}
    out = os.path.join(tempfile.mkdtemp(prefix="quant-isa-"), "run.json")
    for r in range(args.rounds):
        for level in levels if r % 2 == 0 else levels[::-1]:
            env = {**os.environ, **TORCH_AT_AVX2, "HETERO_INFER_CPU_ISA": level}
            cmd = [sys.executable, __file__, "--threads", *map(str, args.threads), "--rows", *map(str, args.rows),
                   "--repeats", str(args.repeats), "--json-out", out]
            subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
            with open(out) as f:
                runs[level].append(json.load(f))
            print(f"round {r + 1}/{args.rounds}: {level} done", file=sys.stderr)
    print(f"`lscpu` {native.cpu_model()!r}; torch {torch.__version__}, PyTorch/oneDNN/MKL held to AVX2; median of "
          f"{args.rounds} runs a level; ms for the 120 projections of a decode step (the path the engine runs)\n")
    first = runs[levels[0]][0]
    head = "| threads | rows | " + " | ".join(f"{lv} ({'C GEMM' if runs[lv][0][0]['c_gemm'] else 'reference'}): "
                                               f"bf16 / int8 / int4 ms" for lv in levels)
    ratios = [(a, b) for a in levels for b in levels if a != b and levels.index(a) < levels.index(b)]
    head += "".join(f" | int8, int4: {b} ÷ {a}" for a, b in ratios) + " |"
    print(head)
    print("|---:|---:|" + "---|" * (len(levels) + len(ratios)))
    for i, row in enumerate(first):
        med = {lv: {c: statistics.median(run[i][c] for run in runs[lv]) for c in ("bf16", "int8 ours", "int4 ours")}
               for lv in levels}
        cells = " | ".join(f"{med[lv]['bf16']:.1f} / {med[lv]['int8 ours']:.1f} / {med[lv]['int4 ours']:.1f}"
                           for lv in levels)
        cells += "".join(f" | {med[b]['int8 ours'] / med[a]['int8 ours']:.2f}x, "
                         f"{med[b]['int4 ours'] / med[a]['int4 ours']:.2f}x" for a, b in ratios)
        print(f"| {row['threads']} | {row['rows']} | {cells} |")


if __name__ == "__main__":
    main()
