# ruff: noqa: B023  (the timed closures run inside the loop iteration that defines them)
"""Microbenchmarks of hetero_infer.kernels on a CUDA GPU.

What it measures (results as Markdown tables on stdout, and JSON with ``--json``):

* the device's copy bandwidth: a 1 GiB device-to-device copy, bytes read + written;
* decode paged attention (Llama-3-8B shapes: 32 query heads, 8 KV heads, head_dim 128,
  bf16, 16-token blocks scattered at random) at 1k / 4k / 16k context for several batch
  sizes: time, achieved bandwidth (K/V bytes read once + q/out) and its share of the copy
  bandwidth; PyTorch SDPA over contiguous (unpaged) K/V as a baseline;
* the decode's split plan under CUDA-graph block tables (40,960 tokens wide) on the
  nano-vllm workload's Qwen3-0.6B shape (256 ragged sequences of 600-2,000 tokens) and
  small batches of long contexts: the old plan (one partition size from the table's
  width) against the new (splits from the batch, partitions per sequence);
* prefill attention over paged KV: TFLOP/s, against SDPA (flash) on contiguous K/V, at 2,048-token chunks and
  16,384-token steps (an H100 engine's), each under the built-in schedule (3 stages: two K/V tiles in flight)
  beside 2 stages (one tile in flight: the K/V schedule before the block-table entries were loaded a tile
  ahead) and 4 stages;
* W8A16 / W4A16 matmuls against the bf16 matmul (cuBLAS through torch) at decode batch
  sizes M = 1..256 for the Llama-3-8B projection shapes;
* RMSNorm(+residual), SiLU-and-mul, rotary and KV-cache write bandwidth, and the
  top-k/top-p filter.

Every timing is the median of ``triton.testing.do_bench`` (which flushes the L2 cache
before each run) on fresh random inputs. Usage on a GPU machine::

    python benchmarks/kernels_bench.py --json kernels_bench.json

``--smoke`` runs tiny shapes on the CPU through Triton's interpreter (wall-clock, not a
benchmark) to check that the script itself works.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
import traceback

if "--smoke" in sys.argv and not os.environ.get("TRITON_INTERPRET"):
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from hetero_infer import kernels  # noqa: E402
from hetero_infer.kernels import reference  # noqa: E402

RESULTS: dict = {"sections": {}}


def log(*a):
    print(*a, flush=True)


class Timer:
    def __init__(self, device: torch.device, smoke: bool):
        self.device = device
        self.smoke = smoke

    def __call__(self, fn) -> float:
        """Median time of ``fn()`` in microseconds."""
        if self.smoke:
            fn()
            t = time.perf_counter()
            fn()
            return (time.perf_counter() - t) * 1e6
        import triton.testing

        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3


def table(title: str, header: list[str], rows: list[list], key: str) -> None:
    RESULTS["sections"][key] = {"title": title, "header": header, "rows": rows}
    log(f"\n### {title}\n")
    log("| " + " | ".join(header) + " |")
    log("|" + "|".join("---:" if i else "---" for i in range(len(header))) + "|")
    for r in rows:
        log("| " + " | ".join(_fmt(x) for x in r) + " |")


def _fmt(x) -> str:
    if isinstance(x, float):
        if x >= 100:
            return f"{x:.0f}"
        if x >= 10:
            return f"{x:.1f}"
        return f"{x:.2f}"
    return str(x)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


# --------------------------------------------------------------------------- environment


def environment(device: torch.device) -> None:
    import triton

    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
    }
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        env.update(
            device=p.name,
            sms=p.multi_processor_count,
            memory_gib=round(p.total_memory / 2**30, 1),
            l2_mib=round(getattr(p, "L2_cache_size", 0) / 2**20, 1),
            capability=f"{p.major}.{p.minor}",
        )
    else:
        env["device"] = "cpu (interpreter smoke run)"
    RESULTS["env"] = env
    log("environment: " + ", ".join(f"{k}={v}" for k, v in env.items()))


def copy_bandwidth(timer: Timer, device: torch.device, smoke: bool) -> float:
    n = (1 << 20) if smoke else (1 << 29)  # bf16 elements: 1 GiB
    src = torch.randn(n, device=device, dtype=torch.float32).to(torch.bfloat16)
    dst = torch.empty_like(src)
    us = timer(lambda: dst.copy_(src))
    gbs = 2 * src.numel() * src.element_size() / us / 1e3
    RESULTS["copy_bandwidth_gbs"] = gbs
    log(f"\ndevice copy bandwidth (read + write, {src.numel() * 2 / 2**30:.2f} GiB copied): {gbs:.0f} GB/s")
    return gbs


# --------------------------------------------------------------------------- attention


def _paged(batch: int, ctx: int, kvh: int, d: int, bs: int, dtype, device):
    blocks_per_seq = math.ceil(ctx / bs)
    num_blocks = batch * blocks_per_seq + 1
    k_cache = torch.randn(num_blocks, bs, kvh, d, device=device, dtype=dtype)
    v_cache = torch.randn(num_blocks, bs, kvh, d, device=device, dtype=dtype)
    perm = torch.randperm(num_blocks - 1, device=device)[: batch * blocks_per_seq].to(torch.int32)
    table = perm.reshape(batch, blocks_per_seq).contiguous()
    lens = torch.full((batch,), ctx, dtype=torch.int32, device=device)
    return k_cache, v_cache, table, lens


def bench_decode(timer: Timer, device, copy_gbs: float, smoke: bool) -> None:
    h, kvh, d, bs, dtype = 32, 8, 128, 16, torch.bfloat16
    if smoke:
        cases = [(64, 2), (200, 1)]
        h, kvh, d = 4, 2, 32
    else:
        cases = [
            (1024, 1), (1024, 16), (1024, 64), (1024, 256),
            (4096, 1), (4096, 16), (4096, 64),
            (16384, 1), (16384, 4), (16384, 16),
        ]
    rows = []
    for ctx, batch in cases:
        k_cache, v_cache, block_table, lens = _paged(batch, ctx, kvh, d, bs, dtype, device)
        q = torch.randn(batch, h, d, device=device, dtype=dtype)
        out = torch.empty_like(q)
        scale = d**-0.5

        def run():
            kernels.paged_attention_decode(q, k_cache, v_cache, block_table, lens, scale, out)

        run()
        ref = reference.paged_attention_decode(q, k_cache, v_cache, block_table, lens, scale)
        err = rel_err(out, ref)
        us = timer(run)
        kv_bytes = batch * ctx * kvh * d * 2 * k_cache.element_size()
        io_bytes = 2 * q.numel() * q.element_size() + block_table.numel() * 4
        gbs = (kv_bytes + io_bytes) / us / 1e3
        # baseline: SDPA over contiguous K/V (no paging), GQA through enable_gqa if available
        sdpa_us = float("nan")
        if not smoke and batch * ctx <= 1 << 20:
            kk = torch.randn(batch, kvh, ctx, d, device=device, dtype=dtype)
            vv = torch.randn(batch, kvh, ctx, d, device=device, dtype=dtype)
            qq = q[:, :, None, :]
            try:
                sdpa_us = timer(lambda: F.scaled_dot_product_attention(qq, kk, vv, enable_gqa=True))
            except TypeError:
                pass
            del kk, vv
        rows.append([ctx, batch, us, gbs, 100 * gbs / copy_gbs, sdpa_us, f"{err:.1e}"])
    table_title = (
        "Decode paged attention (bf16, 32 q heads / 8 KV heads, head_dim 128, block 16)"
        if not smoke
        else "Decode paged attention (smoke)"
    )
    table(
        table_title,
        ["context", "batch", "time µs", "GB/s", "% of copy BW", "SDPA unpaged µs", "rel err"],
        rows,
        "decode",
    )

    bench_decode_plan(timer, device, copy_gbs, smoke)
    if smoke:
        return
    # GQA ratios at 4k context
    rows = []
    for kvh_ in (32, 8, 4, 1):
        batch, ctx = 16, 4096
        k_cache, v_cache, table_, lens = _paged(batch, ctx, kvh_, d, bs, dtype, device)
        q = torch.randn(batch, h, d, device=device, dtype=dtype)
        out = torch.empty_like(q)
        us = timer(lambda: kernels.paged_attention_decode(q, k_cache, v_cache, table_, lens, d**-0.5, out))
        gbs = batch * ctx * kvh_ * d * 4 / us / 1e3
        rows.append([f"{h}/{kvh_}", h // kvh_, us, gbs, 100 * gbs / copy_gbs])
    table("Decode at 4k context, batch 16, by GQA ratio", ["heads q/kv", "ratio", "time µs", "GB/s", "% of copy BW"],
          rows, "decode_gqa")


def _paged_ragged(lens: list[int], kvh: int, d: int, bs: int, width: int, dtype, device):
    """A paged cache holding ``lens`` tokens per sequence in scattered blocks, tables ``width`` blocks wide
    (a CUDA graph's: max_model_len / block size), zeros past each sequence's blocks."""
    need = [math.ceil(n / bs) for n in lens]
    num_blocks = sum(need) + 1
    k_cache = torch.randn(num_blocks, bs, kvh, d, device=device, dtype=dtype)
    v_cache = torch.randn(num_blocks, bs, kvh, d, device=device, dtype=dtype)
    perm = torch.randperm(num_blocks - 1, device=device).to(torch.int32)
    table = torch.zeros(len(lens), width, dtype=torch.int32, device=device)
    used = 0
    for b, n in enumerate(need):
        table[b, :n] = perm[used : used + n]
        used += n
    return k_cache, v_cache, table, torch.tensor(lens, dtype=torch.int32, device=device)


def _old_plan(batch: int, kvh: int, max_len: int, device, block_n: int, min_partition: int) -> tuple[int, int]:
    """The split plan before per-sequence partitions: (splits, one partition size) from a host bound on the
    contexts, the block tables' width when the caller gave none (the engine never did)."""
    from hetero_infer.kernels import _backend as B

    def cdiv(a: int, b: int) -> int:
        return -(-a // b)

    programs, target = batch * kvh, 2 * B.num_sms(device)
    splits = 1 if programs >= target or max_len <= min_partition else min(cdiv(target, programs),
                                                                         cdiv(max_len, min_partition))
    partition = cdiv(cdiv(max_len, splits), block_n) * block_n
    return cdiv(max_len, partition), partition


def bench_decode_plan(timer: Timer, device, copy_gbs: float, smoke: bool) -> None:
    """The split plan where the engine runs decode: CUDA-graph tables max_model_len wide (40,960 tokens for
    Qwen3), the nano-vllm workload's shape (Qwen3-0.6B: 16 query / 8 KV heads of 128, bf16, 16-token blocks;
    256 sequences of 600-2,000 tokens) and the small batches of its tail, old plan (one partition size from the
    table's width) against the new (splits from the batch, each sequence's partition from its own length),
    the new one with the preallocated workspace the engine passes."""
    from hetero_infer.kernels import _triton_attention as A
    from hetero_infer.kernels._backend import next_pow2

    dtype, bs = torch.bfloat16, 16
    if smoke:
        h, kvh, d, width = 4, 2, 32, 16
        cases = [("ragged", [20, 150, 90, 200]), ("one long", [200]), ("full grid", [100] * 8)]
    else:
        h, kvh, d, width = 16, 8, 128, 40960 // bs
        gen = torch.Generator().manual_seed(0)
        nano = torch.randint(600, 2001, (256,), generator=gen).tolist()
        cases = [("nano 256 x 600-2000", nano), ("nano 64 x 600-2000", nano[:64]), ("16 x 1500", [1500] * 16),
                 ("4 x 1500", [1500] * 4), ("1 x 1500", [1500]), ("1 x 8000", [8000]), ("4 x 8000", [8000] * 4)]
    workspace = kernels.decode_workspace(h, kvh, d, bs, dtype, device)
    rows = []
    for name, lens in cases:
        k_cache, v_cache, table_, ctx = _paged_ragged(lens, kvh, d, bs, width, dtype, device)
        q = torch.randn(len(lens), h, d, device=device, dtype=dtype)
        out = torch.empty_like(q)
        cfg = A._decode_settings(d, dtype, device, None, group=h // kvh, page=bs, batch=len(lens))
        old_splits, old_partition = _old_plan(len(lens), kvh, width * bs, device, cfg["BLOCK_N"],
                                              cfg["MIN_PARTITION"])
        new_splits = A._plan(cfg, len(lens), kvh, device, width * bs)
        ref = reference.paged_attention_decode(q, k_cache, v_cache, table_, ctx, d**-0.5)
        nbytes = sum(lens) * kvh * d * 2 * k_cache.element_size() + 2 * q.numel() * q.element_size()
        plans = [
            (f"old: {old_splits} x {old_partition}", lambda: A.paged_attention_decode(
                q, k_cache, v_cache, table_, ctx, d**-0.5, out, num_splits=old_splits,
                config={"PARTITION": old_partition})),
            (f"new: {new_splits} per sequence", lambda: kernels.paged_attention_decode(
                q, k_cache, v_cache, table_, ctx, d**-0.5, out, workspace=workspace)),
        ]
        if new_splits == 1:  # a full grid: would 2 splits of the long contexts even out the programs' lengths?
            extra = torch.empty(len(lens) * h * 2 * (next_pow2(d) + 2), dtype=torch.float32, device=device)
            plans.append(("new, 2 per sequence (TARGET_PROGRAMS)", lambda: A.paged_attention_decode(
                q, k_cache, v_cache, table_, ctx, d**-0.5, out, num_splits=2, workspace=extra)))
        for plan, run in plans:
            run()
            err = rel_err(out, ref)
            us = timer(run)
            gbs = nbytes / us / 1e3
            rows.append([name, plan, us, gbs, 100 * gbs / copy_gbs, f"{err:.1e}"])
    table(f"Decode split plan under CUDA-graph tables ({width * bs} tokens wide; bf16, {h} q / {kvh} KV heads, "
          f"head_dim {d}, block {bs})", ["batch x context", "plan (splits x partition)", "time µs", "GB/s",
                                         "% of copy BW", "rel err"], rows, "decode_plan")


#: The prefill's K/V schedules compared: the built-in config (3 stages: two K/V tiles in flight at 128 x 64),
#: 2 stages (one tile in flight, 96 KiB: the schedule before the block-table entries were loaded a tile ahead)
#: and 4 stages (three in flight, 160 KiB).
PREFILL_SCHEDULES = [("built-in", None), ("2 stages (old K/V)", {"num_stages": 2}), ("4 stages", {"num_stages": 4})]


def bench_prefill(timer: Timer, device, smoke: bool) -> None:
    from hetero_infer.kernels import _triton_attention as A

    h, kvh, d, bs, dtype = 32, 8, 128, 16, torch.bfloat16
    if smoke:
        h, kvh, d = 4, 2, 32
        cases = [("smoke", [20], [20])]
    else:
        cases = [
            ("one 2k prompt", [2048], [2048]),
            ("chunk 2k after 14k cached", [2048], [16384]),
            ("one 4k prompt", [4096], [4096]),
            ("8 x 512 new, 0-3.5k cached", [512] * 8, [512 * (i + 1) for i in range(8)]),
            ("16k step: 8 x 2k prompts", [2048] * 8, [2048] * 8),
            ("16k step: 8 x 2k chunks, 0-14k cached", [2048] * 8, [2048 * (i + 1) for i in range(8)]),
        ]
    rows = []
    for name, q_lens, ctxs in cases:
        batch = len(q_lens)
        max_ctx = max(ctxs)
        k_cache, v_cache, table_, _ = _paged(batch, max_ctx, kvh, d, bs, dtype, device)
        lens = torch.tensor(ctxs, dtype=torch.int32, device=device)
        t = sum(q_lens)
        q = torch.randn(t, h, d, device=device, dtype=dtype)
        cu = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32, device=device)
        out = torch.empty_like(q)
        ref = reference.paged_attention_prefill(q, k_cache, v_cache, table_, cu, lens, d**-0.5)
        # causal FLOPs actually needed: query i of a sequence sees (ctx - q_len + i + 1) keys
        pairs = sum(ql * (c - ql) + ql * (ql + 1) / 2 for ql, c in zip(q_lens, ctxs, strict=True))
        sdpa = float("nan")
        if not smoke and batch == 1 and q_lens[0] == ctxs[0]:
            qq = q.view(1, t, h, d).transpose(1, 2)
            kk = torch.randn(1, h, t, d, device=device, dtype=dtype)
            vv = torch.randn(1, h, t, d, device=device, dtype=dtype)
            sdpa_us = timer(lambda: F.scaled_dot_product_attention(qq, kk, vv, is_causal=True))
            sdpa = 4 * h * d * pairs / sdpa_us / 1e6
        base_us = None
        for schedule, config in PREFILL_SCHEDULES if not smoke else PREFILL_SCHEDULES[:2]:
            def run():
                A.paged_attention_prefill(q, k_cache, v_cache, table_, cu, lens, d**-0.5, out, config=config)

            try:
                out.fill_(float("nan"))
                run()
                err = rel_err(out, ref)
                us = timer(run)
            except Exception as e:  # a schedule that does not fit this GPU's shared memory
                log(f"prefill {name} {schedule}: {type(e).__name__}")
                continue
            base_us = base_us or us
            rows.append([name, t, schedule, us, 4 * h * d * pairs / us / 1e6, f"{base_us / us:.2f}x", sdpa,
                         f"{err:.1e}"])
    table("Prefill attention over paged KV (bf16, 32/8 heads, head_dim 128)",
          ["case", "tokens", "schedule", "time µs", "TFLOP/s", "vs built-in", "SDPA unpaged TFLOP/s", "rel err"],
          rows, "prefill")


# --------------------------------------------------------------------------- quantized matmuls


def bench_quant(timer: Timer, device, smoke: bool) -> None:
    dtype = torch.bfloat16
    if smoke:
        shapes = [("tiny", 64, 256)]
        ms = [1, 17]
    else:
        shapes = [("qkv 6144x4096", 6144, 4096), ("o 4096x4096", 4096, 4096),
                  ("gate_up 28672x4096", 28672, 4096), ("down 4096x14336", 4096, 14336)]
        ms = [1, 4, 16, 32, 64, 128, 256]
    rows = []
    for name, n, k in shapes:
        w = torch.randn(n, k, device=device, dtype=torch.float32) * 0.02
        wb = w.to(dtype)
        q8, s8 = kernels.quantize_int8(w)
        p4, s4, z4 = kernels.quantize_int4(w, 128)
        for m in ms:
            x = torch.randn(m, k, device=device, dtype=dtype)
            y8 = torch.empty(m, n, device=device, dtype=dtype)
            y4 = torch.empty(m, n, device=device, dtype=dtype)
            kernels.int8_matmul(x, q8, s8, out=y8)
            kernels.int4_matmul(x, p4, s4, z4, 128, out=y4)
            e8 = rel_err(y8, reference.int8_matmul(x, q8, s8))
            e4 = rel_err(y4, reference.int4_matmul(x, p4, s4, z4, 128))
            t16 = timer(lambda: F.linear(x, wb))
            t8 = timer(lambda: kernels.int8_matmul(x, q8, s8, out=y8))
            t4 = timer(lambda: kernels.int4_matmul(x, p4, s4, z4, 128, out=y4))
            w8_bytes = n * k + n * 4
            w4_bytes = n * k // 2 + 5 * n * (k // 128)
            rows.append([name, m, t16, t8, t4, t16 / t8, t16 / t4,
                         w8_bytes / t8 / 1e3, w4_bytes / t4 / 1e3, f"{max(e8, e4):.1e}"])
    table("Weight-only quantized matmuls vs bf16 (cuBLAS via torch), Llama-3-8B projections",
          ["weight", "M", "bf16 µs", "W8A16 µs", "W4A16 µs", "W8 speedup", "W4 speedup",
           "W8 weight GB/s", "W4 weight GB/s", "max rel err"], rows, "quant")


# --------------------------------------------------------------------------- element-wise ops


def bench_layers(timer: Timer, device, copy_gbs: float, smoke: bool) -> None:
    dtype = torch.bfloat16
    t = 64 if smoke else 4096
    hidden, inter = (256, 512) if smoke else (4096, 14336)
    h, kvh, d = (4, 2, 32) if smoke else (32, 8, 128)
    rows = []

    x = torch.randn(t, hidden, device=device, dtype=dtype)
    r = torch.randn(t, hidden, device=device, dtype=dtype)
    w = torch.randn(hidden, device=device, dtype=dtype)
    nbytes = 4 * x.numel() * x.element_size()
    tk = timer(lambda: kernels.rms_norm(x, w, 1e-5, r))
    tr = timer(lambda: reference.rms_norm(x, w, 1e-5, r))
    rows.append([f"rms_norm + residual [{t}, {hidden}]", tk, tr, nbytes / tk / 1e3, 100 * nbytes / tk / 1e3 / copy_gbs])

    g = torch.randn(t, 2 * inter, device=device, dtype=dtype)
    nbytes = g.numel() * g.element_size() * 3 // 2
    tk = timer(lambda: kernels.silu_and_mul(g))
    tr = timer(lambda: reference.silu_and_mul(g))
    rows.append([f"silu_and_mul [{t}, 2x{inter}]", tk, tr, nbytes / tk / 1e3, 100 * nbytes / tk / 1e3 / copy_gbs])

    qkv = torch.randn(t, (h + 2 * kvh) * d, device=device, dtype=dtype)
    q = qkv[:, : h * d].view(t, h, d)
    k = qkv[:, h * d : (h + kvh) * d].view(t, kvh, d)
    v = qkv[:, (h + kvh) * d :].view(t, kvh, d)
    cache = kernels.compute_cos_sin_cache(d, 8192, 500000.0, device=device)
    pos = torch.randint(0, 8192, (t,), device=device)
    nbytes = 2 * (q.numel() + k.numel()) * q.element_size()
    tk = timer(lambda: kernels.rotary_embedding(pos, q, k, cache, inplace=True))
    tr = timer(lambda: reference.rotary_embedding(pos, q, k, cache, inplace=True))
    rows.append([f"rotary in place, q/k views of qkv [{t}, {h}+{kvh}, {d}]", tk, tr, nbytes / tk / 1e3,
                 100 * nbytes / tk / 1e3 / copy_gbs])

    bs = 16
    nb = t // bs + 8
    kc = torch.randn(nb, bs, kvh, d, device=device, dtype=dtype)
    vc = torch.randn(nb, bs, kvh, d, device=device, dtype=dtype)
    slots = torch.randperm(nb * bs, device=device)[:t]
    nbytes = 4 * k.numel() * k.element_size()
    tk = timer(lambda: kernels.write_kv_cache(k, v, kc, vc, slots))
    tr = timer(lambda: reference.write_kv_cache(k, v, kc, vc, slots))
    rows.append([f"write_kv_cache [{t}, {kvh}, {d}] x2", tk, tr, nbytes / tk / 1e3, 100 * nbytes / tk / 1e3 / copy_gbs])

    table("Element-wise kernels (bf16)", ["op", "Triton µs", "PyTorch reference µs", "GB/s", "% of copy BW"], rows,
          "layers")

    vocab = 512 if smoke else 128256
    rows = []
    for b in (1, 64) if smoke else (1, 64, 256):
        logits = torch.randn(b, vocab, device=device, dtype=torch.float32)
        top_k = torch.randint(1, 100, (b,), device=device)
        top_p = torch.rand(b, device=device) * 0.5 + 0.5
        rows.append([b, vocab, timer(lambda: kernels.top_k_top_p_filter(logits, top_k, top_p))])
    table("top-k + top-p filter (PyTorch sort-based, float32 logits)", ["batch", "vocab", "time µs"], rows, "topk")


# --------------------------------------------------------------------------- tuning sweep


def bench_tune(timer: Timer, device, copy_gbs: float, smoke: bool) -> None:
    """Time alternative tile configurations against the defaults (to retune heuristics)."""
    import itertools

    from hetero_infer.kernels import _triton_attention as A
    from hetero_infer.kernels import _triton_quant as Q

    dtype = torch.bfloat16
    h, kvh, d, bs = (4, 2, 32, 16) if smoke else (32, 8, 128, 16)
    rows = []
    decode_cases = [(64, 2)] if smoke else [(1024, 64), (4096, 16), (16384, 1), (16384, 4)]
    decode_cfgs = [None] + (
        [{"BLOCK_N": 16}] if smoke else [
            {"BLOCK_N": bn, "num_warps": nw, "num_stages": ns}
            for bn, nw, ns in itertools.product((32, 64, 128), (4, 8), (2, 3, 4))
        ] + [{"MIN_PARTITION": mp} for mp in (128, 512, 1024)]
    )
    for ctx, batch in decode_cases:
        k_cache, v_cache, block_table, lens = _paged(batch, ctx, kvh, d, bs, dtype, device)
        q = torch.randn(batch, h, d, device=device, dtype=dtype)
        out = torch.empty_like(q)
        nbytes = batch * ctx * kvh * d * 4
        best = None
        for cfg in decode_cfgs:
            try:
                us = timer(lambda: A.paged_attention_decode(q, k_cache, v_cache, block_table, lens, 0.1, out,
                                                            config=cfg))
            except Exception as e:  # a configuration that does not fit (shared memory, ...)
                log(f"decode {ctx}x{batch} {cfg}: {type(e).__name__}")
                continue
            pct = 100 * nbytes / us / 1e3 / copy_gbs
            if cfg is None:
                default = (us, pct)
            if best is None or us < best[0]:
                best = (us, pct, cfg)
        rows.append([f"decode ctx {ctx} batch {batch}", default[0], default[1], best[0], best[1], json.dumps(best[2])])

    mm_cases = [(1, 64, 256), (17, 64, 256)] if smoke else [(1, 4096, 4096), (16, 4096, 4096), (64, 4096, 4096),
                                                           (1, 28672, 4096), (16, 28672, 4096)]
    for m, n, k in mm_cases:
        w = torch.randn(n, k, device=device) * 0.02
        q8, s8 = kernels.quantize_int8(w)
        p4, s4, z4 = kernels.quantize_int4(w, 128)
        x = torch.randn(m, k, device=device, dtype=dtype)
        y = torch.empty(m, n, device=device, dtype=dtype)
        bm = 16 if m <= 16 else (32 if m <= 32 else 64)
        cfgs = [None] + (
            [{"BLOCK_N": 32, "SPLIT_K": 2}] if smoke else [
                {"BLOCK_M": bm, "BLOCK_N": bn, "SPLIT_K": sk}
                for bn, sk in itertools.product((32, 64, 128), (1, 2, 4, 8, 16))
            ] + [{"num_stages": ns, "num_warps": nw} for ns, nw in ((3, 4), (5, 4), (4, 8))]
        )
        for name, fn, wbytes in (
            ("W8A16", lambda cfg: Q.int8_matmul(x, q8, s8, None, y, config=cfg), n * k + 4 * n),
            ("W4A16", lambda cfg: Q.int4_matmul(x, p4, s4, z4, 128, None, y, config=cfg), n * k // 2 + 5 * n * k // 128),
        ):
            best = None
            for cfg in cfgs:
                try:
                    us = timer(lambda: fn(cfg))
                except Exception as e:
                    log(f"{name} {m}x{n}x{k} {cfg}: {type(e).__name__}")
                    continue
                pct = 100 * wbytes / us / 1e3 / copy_gbs
                if cfg is None:
                    default = (us, pct)
                if best is None or us < best[0]:
                    best = (us, pct, cfg)
            rows.append([f"{name} M={m} {n}x{k}", default[0], default[1], best[0], best[1], json.dumps(best[2])])
    table("Tuning sweep: default configuration vs the best one tried",
          ["case", "default µs", "default % BW", "best µs", "best % BW", "best config"], rows, "tune")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write all results to this JSON file")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU interpreter (checks the script)")
    ap.add_argument("--only", nargs="*", choices=["decode", "prefill", "quant", "layers", "tune"],
                    help="sections to run (default: all but tune)")
    args = ap.parse_args(argv)
    with kernels.use_backend(kernels.get_backend()):  # --smoke forces Triton: not past this call
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    if args.smoke:
        device = torch.device("cpu")
        kernels.set_backend("triton")
    else:
        if not torch.cuda.is_available():
            log("no CUDA device: run on a GPU machine, or use --smoke to check the script on the CPU")
            return 2
        device = torch.device("cuda")
    torch.manual_seed(0)
    timer = Timer(device, args.smoke)
    environment(device)
    copy_gbs = copy_bandwidth(timer, device, args.smoke)
    sections = args.only or ["decode", "prefill", "quant", "layers"]
    failed = []
    for name in sections:
        try:
            if name == "decode":
                bench_decode(timer, device, copy_gbs, args.smoke)
            elif name == "prefill":
                bench_prefill(timer, device, args.smoke)
            elif name == "quant":
                bench_quant(timer, device, args.smoke)
            elif name == "layers":
                bench_layers(timer, device, copy_gbs, args.smoke)
            elif name == "tune":
                bench_tune(timer, device, copy_gbs, args.smoke)
        except Exception:
            failed.append(name)
            log(f"section {name} failed:")
            traceback.print_exc()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(RESULTS, f, indent=1, default=str)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
