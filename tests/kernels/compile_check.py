"""Compile every Triton kernel for an NVIDIA target without a GPU (ahead of time).

Runs the kernels' host wrappers on CPU tensors with Triton's launcher replaced by a
recorder, then compiles each recorded launch with ``triton.compile`` for the target
(default sm_90, Hopper) and reports registers / spills / shared memory from the cubin
(via the ``cuobjdump`` bundled with Triton). This catches errors that Triton's CPU
interpreter does not (type rules of the compiler, dot shape limits, layouts) on machines
without a GPU.

Usage: ``python tests/kernels/compile_check.py [--arch 90] [--verbose]``; exits non-zero
if any kernel fails to compile or needs more shared memory than the target has (``SMEM_LIMIT``).
``--prefill-grid`` compiles the prefill kernel (bf16, head dim 128) at every config of the GPU tuner's grid
instead (benchmarks/tune_kernels.py skips those that spill or do not fit); with ``--quick``, its built-in tiles at
2, 3 and 4 stages. Must run with TRITON_INTERPRET unset.
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
import subprocess
import sys
import tempfile
import traceback

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

_TYPES = {
    torch.float32: "fp32",
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.int32: "i32",
    torch.int64: "i64",
}

#: Shared memory a block may use (opt-in maximum), bytes: A100 (sm_80) 163 KiB, H100 (sm_90) 227 KiB; Ada/GA10x 99 KiB.
SMEM_LIMIT = {80: 163 * 1024, 86: 99 * 1024, 89: 99 * 1024, 90: 227 * 1024}
#: The prefill configs ``--prefill-grid`` compiles (benchmarks/tune_kernels.py's prefill grid).
PREFILL_GRID = {"BLOCK_M": (64, 128), "BLOCK_N": (32, 64, 128), "num_warps": (4, 8), "num_stages": (2, 3, 4)}

LAUNCHES: list[tuple[JITFunction, dict, dict, dict, dict, str]] = []


def _record(self, *args, grid, warmup, **kwargs):
    sig = inspect.signature(self.fn)
    bound = sig.bind_partial(*args, **{k: v for k, v in kwargs.items() if k in sig.parameters})
    options = {k: v for k, v in kwargs.items() if k not in sig.parameters}
    signature, constexprs, attrs = {}, {}, {}
    for index, (name, param) in enumerate(sig.parameters.items()):
        value = bound.arguments.get(name, param.default)
        if param.annotation is tl.constexpr or "constexpr" in str(param.annotation):
            signature[name] = "constexpr"
            constexprs[name] = value
        elif isinstance(value, torch.Tensor):
            signature[name] = "*" + _TYPES[value.dtype]
            if value.data_ptr() % 16 == 0:  # what Triton's launcher specializes on
                attrs[(index,)] = [["tt.divisibility", 16]]
        elif isinstance(value, bool):
            signature[name] = "i1"
        elif isinstance(value, int):
            signature[name] = "i32" if -(2**31) <= value < 2**31 else "i64"
            if value % 16 == 0:
                attrs[(index,)] = [["tt.divisibility", 16]]
        elif isinstance(value, float):
            signature[name] = "fp32"
        else:
            raise TypeError(f"{self.fn.__name__}: cannot type argument {name}={value!r}")
    label = f"{self.fn.__name__}[" + ",".join(f"{k}={v}" for k, v in constexprs.items()) + "]"
    LAUNCHES.append((self, signature, constexprs, attrs, options, label))


def _scenarios(quick: bool = False) -> None:
    """Call every host wrapper on CPU tensors as if they were on a GPU.

    ``quick``: bfloat16 and one head size only (one variant of each kernel, for CI)."""
    import hetero_infer.kernels._backend as B

    B.compiled = lambda device: True
    B.num_sms = lambda device: 132
    from hetero_infer.kernels import _triton_attention as A
    from hetero_infer.kernels import _triton_fused as F
    from hetero_infer.kernels import _triton_lora as L
    from hetero_infer.kernels import _triton_moe as M
    from hetero_infer.kernels import _triton_ops as O
    from hetero_infer.kernels import _triton_quant as Q

    dtypes = (torch.bfloat16,) if quick else (torch.bfloat16, torch.float16, torch.float32)
    heads = ((128, 8, 32),) if quick else ((128, 8, 32), (64, 3, 9), (256, 1, 8), (80, 2, 2), (128, 1, 32), (96, 4, 28))
    for dt in dtypes:
        for d, kvh, h in heads:
            kc = torch.empty(4, 16, kvh, d, dtype=dt)
            q = torch.empty(2, h, d, dtype=dt)
            bt = torch.zeros(2, 4, dtype=torch.int32)
            lens = torch.ones(2, dtype=torch.int32)
            A.paged_attention_decode(q, kc, kc, bt, lens, 0.1, q, None, None)  # one partition
            A.paged_attention_decode(q, kc, kc, bt, lens, 0.1, q, 64, 4096)  # split + reduce
            # int64 tables and lengths (the interpreter does not check the kernels' integer types)
            A.paged_attention_decode(q, kc, kc, bt.long(), lens.long(), 0.1, q, None, None)
            A.paged_attention_decode(q, kc, kc, bt.long(), lens.long(), 0.1, q, 64, 4096)
            qp = torch.empty(5, h, d, dtype=dt)
            cu = torch.tensor([0, 2, 5], dtype=torch.int32)
            A.paged_attention_prefill(qp, kc, kc, bt, cu, lens, 0.1, qp, None)
            A.paged_attention_prefill(qp, kc, kc, bt, cu, lens, 0.1, qp, 128)
            A.write_kv_cache(qp[:, :kvh], qp[:, :kvh], kc, kc, torch.zeros(5, dtype=torch.int64))
            pos5, kv5 = torch.zeros(5, dtype=torch.int64), qp[:, :kvh]
            wd = torch.empty(d, dtype=dt)  # with Qwen3's q/k norms; without; partial rotary
            F.rotary_and_write_kv(pos5, qp, kv5, kv5, torch.empty(10, d), kc, kc, pos5, qp, wd, wd, 1e-6)
            if not quick:
                F.rotary_and_write_kv(pos5, qp, kv5, kv5, torch.empty(10, d), kc, kc, pos5, qp, None, None, 1e-6)
                F.rotary_and_write_kv(pos5, qp, kv5, kv5, torch.empty(10, d // 2), kc, kc, pos5, qp, wd, wd, 1e-6)
        x = torch.empty(4, 4096, dtype=dt)
        O.rms_norm(x, torch.empty(4096, dtype=dt), 1e-6, x, x, x)
        O.rms_norm(x[:, :128], torch.empty(128, dtype=torch.float32), 1e-6, None, x[:, :128], None)
        O.silu_and_mul(x, x[:, :2048])
        qq = torch.empty(3, 32, 128, dtype=dt)
        kk = torch.empty(3, 8, 128, dtype=dt)
        O.rotary_embedding(torch.zeros(3, dtype=torch.int64), qq, kk, torch.empty(10, 128), qq, kk)
        O.rotary_embedding(torch.zeros(3, dtype=torch.int64), qq, None, torch.empty(10, 64), qq, None)
        w = torch.empty(512, 1024, dtype=torch.int8)
        s = torch.empty(512)
        pk = torch.empty(512, 512, dtype=torch.uint8)
        sc = torch.empty(512, 8)
        z = torch.empty(512, 8, dtype=torch.uint8)
        for m in (1,) if quick else (1, 16, 48, 300):
            xm = torch.empty(m, 1024, dtype=dt)
            Q.int8_matmul(xm, w, s, None, torch.empty(m, 512, dtype=dt))
            Q.int4_matmul(xm, pk, sc, z, 128, s, torch.empty(m, 512, dtype=dt))
        _moe_scenarios(M, dt, quick)
        # LoRA shrink / expand: the fused q/k/v of rank 16 (K = 48) over 4096 wide, a decode-sized step
        slots = torch.zeros(4, dtype=torch.int32)
        xl, al, bl = torch.empty(4, 4096, dtype=dt), torch.empty(4, 48, 4096, dtype=dt), torch.empty(4, 6144, 16, dtype=dt)
        L.shrink(xl, al, slots, torch.empty(4, 48, dtype=dt))
        L.expand(torch.empty(4, 48, dtype=dt), bl, slots, torch.empty(4, 6144, dtype=dt), (4096, 1024, 1024))


def _moe_scenarios(M, dt: torch.dtype, quick: bool) -> None:
    """The fused MoE grouped GEMM: float, INT8 and INT4 experts; gate|up (rows gathered per token, no routing
    weight) and down (the routing weight, float32 out); decode-sized and prefill-sized tiles."""
    from hetero_infer.kernels.reference import ExpertWeights

    e, h, i, k = 8, 256, 128, 2
    experts = [ExpertWeights(torch.empty(e, 2 * i, h, dtype=dt)),
               ExpertWeights(torch.empty(e, 2 * i, h, dtype=torch.int8), torch.empty(e, 2 * i)),
               ExpertWeights(torch.empty(e, 2 * i, h // 2, dtype=torch.uint8), torch.empty(e, 2 * i, h // 128),
                             torch.empty(e, 2 * i, h // 128, dtype=torch.uint8), 128)]
    for tokens in (1,) if quick else (1, 64):
        block = M._blocks(tokens * k, torch.device("cuda"), dt)
        align = M.moe_align(torch.zeros(tokens, k, dtype=torch.int32), e, block[0])
        for ew in experts:
            M._gemm(torch.empty(tokens, h, dtype=dt), ew, torch.empty(tokens * k, 2 * i, dtype=dt), align, k, None,
                    block)
        down = ExpertWeights(torch.empty(e, h, i, dtype=dt))
        M._gemm(torch.empty(tokens * k, i, dtype=dt), down, torch.empty(tokens * k, h), align, 1,
                torch.empty(tokens * k), block)


def _prefill_grid_scenarios(quick: bool = False) -> None:
    """The prefill at every config of ``PREFILL_GRID``: bf16, head dim 128, GQA 4 (Llama-3-8B's group), with and
    without a sliding window. ``quick``: the built-in 128 x 64 tiles on 8 warps at 2, 3 and 4 stages, no window."""
    import itertools

    import hetero_infer.kernels._backend as B

    B.compiled = lambda device: True
    B.num_sms = lambda device: 132
    from hetero_infer.kernels import _triton_attention as A

    kc = torch.empty(4, 16, 8, 128, dtype=torch.bfloat16)
    qp = torch.empty(5, 32, 128, dtype=torch.bfloat16)
    bt = torch.zeros(2, 4, dtype=torch.int32)
    lens = torch.ones(2, dtype=torch.int32)
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    grid = {"BLOCK_M": (128,), "BLOCK_N": (64,), "num_warps": (8,), "num_stages": (2, 3, 4)} if quick else PREFILL_GRID
    for values in itertools.product(*grid.values()):
        cfg = dict(zip(grid, values))
        for window in (None,) if quick else (None, 128):
            A.paged_attention_prefill(qp, kc, kc, bt, cu, lens, 0.1, qp, window, config=cfg)


def _resource_usage(cubin: bytes) -> str:
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(tool):
        return ""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        res = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True)
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", res.stdout)
    return f"REG={m.group(1)} STACK={m.group(2)} SHARED={m.group(3)} LOCAL={m.group(4)}" if m else res.stdout.strip()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--quick", action="store_true", help="bfloat16, one shape per kernel")
    ap.add_argument("--no-spills", action="store_true", help="count register spills as failures")
    ap.add_argument("--prefill-grid", action="store_true", help="the prefill at every config of the tuner's grid")
    args = ap.parse_args(argv)
    JITFunction.run = _record
    if args.prefill_grid:
        _prefill_grid_scenarios(quick=args.quick)
    else:
        _scenarios(quick=args.quick)
    smem_limit = SMEM_LIMIT.get(args.arch)
    seen = set()
    failures = 0
    target = GPUTarget("cuda", args.arch, 32)
    for fn, signature, constexprs, attrs, options, label in LAUNCHES:
        key = (fn.fn.__name__, tuple(sorted(signature.items())), tuple(sorted(map(str, constexprs.items()))),
               tuple(sorted(map(str, attrs.items()))), tuple(sorted(options.items())))
        if key in seen:
            continue
        seen.add(key)
        src = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
        try:
            ck = triton.compile(src, target=target, options=options)
        except Exception:
            failures += 1
            print(f"FAIL {label} {signature}")
            traceback.print_exc()
            continue
        usage = _resource_usage(ck.asm["cubin"])
        spill = " SPILL" if re.search(r"(STACK|LOCAL)=[1-9]", usage) else ""
        too_big = smem_limit is not None and ck.metadata.shared > smem_limit
        if too_big:
            spill += f" SHARED>{smem_limit // 1024}KiB"
        if args.verbose or spill:
            print(f"{'FAIL' if too_big else 'ok  '} {label} {options} {usage} smem={ck.metadata.shared}{spill}")
        if too_big or (spill and args.no_spills):
            failures += 1
    print(f"compiled {len(seen) - failures}/{len(seen)} kernel variants for sm_{args.arch}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
