# ruff: noqa: B023  (the timed closures run inside the loop iteration that defines them)
"""Tune the Triton attention kernels' launch configs on this GPU and write the table kernels/tuned.py reads.

Shapes that matter (bf16, 16-token pages, head dim 128): Qwen3-0.6B (16 query heads, 8 KV) and Llama-3-8B (32/8);
decode at batch 1, 16, 64 and 256 with ragged contexts of 600-2,000 tokens and one long context (16k, batch 1);
prefill chunks of 2,048 tokens (4 fresh prompts, and one chunk after 6k cached tokens) and a 16,384-token step
(8 prompts of 2,048: the size of an H100 engine's prefill steps). Cases that share a
table entry (kernel, shape key, batch or token count) form a bucket, tuned together: a config's score is the
geometric mean of its time over the built-in config's on the bucket's cases.

Search per bucket, bounded: BLOCK_N x num_warps (prefill: BLOCK_M x BLOCK_N x num_warps) at the built-in
num_stages, then num_stages for the best (prefill: 2 stages keep one K/V tile in flight, 3 and 4 two and three, for
more shared memory; tests/kernels/compile_check.py --prefill-grid); for the decode then TARGET_PROGRAMS (1, 4 or 8 programs per SM under
which it splits the KV; built-in 2), then MIN_PARTITION where the best splits; ``--grid full`` tries the whole
product of the tiles and stages first. Configs known to spill registers
on sm_90 are left out (``spills``), and prefill configs whose K/V buffers exceed the device's shared memory per block
(``prefill_shared_bytes``; reported as skipped); buckets go in ``PRIORITY`` order (what the GPU check's workloads use most
first). Every config is checked against
the PyTorch reference (float32) before it is timed, its output poisoned with NaN first; one that fails to
compile or is wrong is reported and skipped. Timings: medians of ``triton.testing.do_bench`` (L2 flushed). The
best config is timed again beside the built-in one and kept only if still >= 2% faster. At ``--budget-s`` the
search stops and keeps the best so far. Prints one table and writes ``--out`` (the loader's format) and
``--json`` (every timing). The built-in configs are the baseline: shipped tables are switched off here.

    python benchmarks/tune_kernels.py --out kernel_configs.json --json tune.json --budget-s 150   # on a GPU
    python benchmarks/tune_kernels.py --smoke --out /tmp/k.json                                    # CPU, interpreter
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

if "--smoke" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

from hetero_infer.kernels import reference, tuned  # noqa: E402

MODELS = {"qwen3-0.6b": (16, 8, 128), "llama-3-8b": (32, 8, 128)}  # query heads, KV heads, head dim
PAGE = 16
KEEP_IF_FASTER = 0.98  # the confirmation's ratio best / built-in under which the best is kept
TOL = {torch.bfloat16: (1.6e-2, 2e-2, 1e-2), torch.float16: (2e-3, 4e-3, 2e-3), torch.float32: (2e-5, 2e-5, 1e-5)}


@dataclass
class Case:
    kernel: str  # "decode" or "prefill"
    model: str
    heads: int
    kv_heads: int
    head_dim: int
    name: str
    contexts: list[int]  # KV length per sequence (the new tokens included)
    q_lens: list[int]  # new tokens per sequence (decode: 1 each)
    dtype: torch.dtype = torch.bfloat16

    @property
    def id(self) -> str:
        return f"{self.kernel} {self.model} {self.name}"

    @property
    def size(self) -> int:  # the table's size: the batch (decode) or the query tokens (prefill)
        return len(self.contexts) if self.kernel == "decode" else sum(self.q_lens)

    @property
    def key(self) -> str:
        return tuned.shape_key(self.head_dim, self.heads // self.kv_heads, self.dtype, PAGE)

    def kv_bytes(self) -> int:
        elem = torch.empty((), dtype=self.dtype).element_size()
        return 2 * sum(self.contexts) * self.kv_heads * self.head_dim * elem

    def flops(self) -> float:  # causal attention FLOPs actually needed
        pairs = sum(ql * (c - ql) + ql * (ql + 1) / 2 for ql, c in zip(self.q_lens, self.contexts))
        return 4 * self.heads * self.head_dim * pairs


@dataclass
class Bucket:
    kernel: str
    key: str
    size: int
    cases: list[Case]
    tried: list[dict] = field(default_factory=list)  # {"config", "score" | "error", "us": [...]}
    best: dict | None = None  # the kept config (None: the built-in stays)
    confirm: dict | None = None


def cases(smoke: bool, seed: int = 0) -> list[Case]:
    import random

    rng = random.Random(seed)
    out: list[Case] = []
    if smoke:
        h, kvh, d = 4, 2, 32
        out.append(Case("decode", "tiny", h, kvh, d, "b1 ctx 40", [40], [1]))
        out.append(Case("decode", "tiny", h, kvh, d, "b2 ctx 10-30", [rng.randint(10, 30) for _ in range(2)], [1] * 2))
        out.append(Case("prefill", "tiny", h, kvh, d, "2 prompts, 12 tokens", [5, 7], [5, 7]))
        return out
    for model, (h, kvh, d) in MODELS.items():
        def ragged(n: int) -> list[int]:
            return [rng.randint(600, 2000) for _ in range(n)]

        for batch in (256, 64, 16):
            out.append(Case("decode", model, h, kvh, d, f"b{batch} ctx 600-2k", ragged(batch), [1] * batch))
        out.append(Case("decode", model, h, kvh, d, "b1 ctx ~1.3k", ragged(1), [1]))
        out.append(Case("decode", model, h, kvh, d, "b1 ctx 16k", [16384], [1]))
        q = [512, 384, 640, 512]
        out.append(Case("prefill", model, h, kvh, d, "4 fresh prompts, 2048 tokens", q, q))
        out.append(Case("prefill", model, h, kvh, d, "2048 after 6k cached", [2048 + 6144], [2048]))
        out.append(Case("prefill", model, h, kvh, d, "8 fresh prompts, 16384 tokens", [2048] * 8, [2048] * 8))
    return sorted(out, key=lambda c: PRIORITY.index((c.model, c.kernel, c.size)))


# The order buckets are tuned in, so a search cut short by its budget has done what the GPU check's workloads
# use most: the nano workload's decode batches on the Qwen3 shape, the Llama-3-8B one-request and 64-request
# decodes, then the rest.
PRIORITY = [("qwen3-0.6b", "decode", 256), ("qwen3-0.6b", "decode", 64), ("qwen3-0.6b", "decode", 16),
            ("qwen3-0.6b", "decode", 1), ("llama-3-8b", "decode", 1), ("llama-3-8b", "decode", 64),
            ("qwen3-0.6b", "prefill", 2048), ("llama-3-8b", "decode", 256), ("llama-3-8b", "decode", 16),
            ("llama-3-8b", "prefill", 2048), ("qwen3-0.6b", "prefill", 16384), ("llama-3-8b", "prefill", 16384)]


def buckets(all_cases: list[Case]) -> list[Bucket]:
    found: dict[tuple, Bucket] = {}
    for c in all_cases:  # in the order of the cases: the nano workload's shape first
        found.setdefault((c.kernel, c.key, c.size), Bucket(c.kernel, c.key, c.size, [])).cases.append(c)
    return list(found.values())


# -- inputs, launch, check ---------------------------------------------------------------------------------------
@dataclass
class Inputs:
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    context_lens: torch.Tensor
    cu_seqlens_q: torch.Tensor
    out: torch.Tensor
    ref: torch.Tensor
    scale: float


def make_inputs(case: Case, device: torch.device, seed: int = 0) -> Inputs:
    g = torch.Generator(device=device).manual_seed(seed)
    blocks = [math.ceil(c / PAGE) for c in case.contexts]
    num_blocks = sum(blocks) + 1
    shape = (num_blocks, PAGE, case.kv_heads, case.head_dim)
    k_cache = torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(case.dtype)
    v_cache = torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(case.dtype)
    perm = torch.randperm(num_blocks, generator=g, device=device).to(torch.int32)
    table = torch.zeros(len(blocks), max(blocks), dtype=torch.int32, device=device)
    start = 0
    for i, n in enumerate(blocks):  # pages scattered at random, as a busy pool leaves them
        table[i, :n] = perm[start:start + n]
        start += n
    lens = torch.tensor(case.contexts, dtype=torch.int32, device=device)
    cu = torch.tensor([0, *itertools.accumulate(case.q_lens)], dtype=torch.int32, device=device)
    q = torch.randn(sum(case.q_lens), case.heads, case.head_dim, generator=g, device=device,
                    dtype=torch.float32).to(case.dtype)
    scale = case.head_dim ** -0.5
    f32 = [t.float() for t in (q, k_cache, v_cache)]
    if case.kernel == "decode":
        ref = reference.paged_attention_decode(*f32, table, lens, scale)
    else:
        ref = reference.paged_attention_prefill(*f32, table, cu, lens, scale)
    return Inputs(q, k_cache, v_cache, table, lens, cu, torch.empty_like(q), ref, scale)


def launch(case: Case, x: Inputs, config: dict | None) -> None:
    """One launch of the case's kernel with ``config`` (None: the built-in config)."""
    from hetero_infer.kernels import _triton_attention as A

    if case.kernel == "decode":
        A.paged_attention_decode(x.q, x.k_cache, x.v_cache, x.block_tables, x.context_lens, x.scale, x.out,
                                 config=config)
    else:
        A.paged_attention_prefill(x.q, x.k_cache, x.v_cache, x.block_tables, x.cu_seqlens_q, x.context_lens,
                                  x.scale, x.out, config=config)


def check(case: Case, x: Inputs, config: dict | None) -> str | None:
    """None if ``config`` computes the case right, else why not."""
    x.out.fill_(float("nan"))
    launch(case, x, config)
    atol, rtol, norm = TOL[case.dtype]
    got = x.out.float()
    if not torch.isfinite(got).all():
        return "wrong: non-finite outputs (unwritten or overflowed)"
    rel = float((got - x.ref).norm() / x.ref.norm().clamp_min(1e-30))
    bad = int(((got - x.ref).abs() > atol + rtol * x.ref.abs()).sum())
    if rel > norm or bad:
        return f"wrong: relative error {rel:.1e}, {bad} elements off"
    return None


class Timer:
    def __init__(self, device: torch.device, smoke: bool) -> None:
        self.device, self.smoke = device, smoke

    def __call__(self, fn) -> float:
        """Median time of ``fn()`` in microseconds (the interpreter: one wall-clock run, not a benchmark)."""
        if self.smoke:
            t = time.perf_counter()
            fn()
            return (time.perf_counter() - t) * 1e6
        import triton.testing

        return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median") * 1e3


# -- the search --------------------------------------------------------------------------------------------------
def grid(kernel: str, smoke: bool) -> dict[str, tuple]:
    """The values tried. TARGET_PER_SM: the decode's TARGET_PROGRAMS (programs under which it splits the KV) per
    SM; the built-in is 2."""
    if smoke:
        return ({"BLOCK_N": (16, 32), "num_warps": (4,), "num_stages": (1,), "TARGET_PER_SM": (4,),
                 "MIN_PARTITION": (32,)}
                if kernel == "decode" else
                {"BLOCK_M": (16,), "BLOCK_N": (16, 32), "num_warps": (4,), "num_stages": (1,)})
    if kernel == "decode":
        return {"BLOCK_N": (32, 64, 128), "num_warps": (2, 4, 8), "num_stages": (2, 3, 4), "TARGET_PER_SM": (1, 4, 8),
                "MIN_PARTITION": (128, 256, 512, 1024)}
    return {"BLOCK_M": (64, 128), "BLOCK_N": (32, 64, 128), "num_warps": (4, 8), "num_stages": (2, 3, 4)}


def spills(kernel: str, cfg: dict) -> bool:
    """Configs that spill registers on sm_90 for head dim 128 (Triton 3.9 ahead of time, every BLOCK_N / BLOCK_M /
    num_warps / num_stages of the grid, GQA 2 and 4): decode BLOCK_N 128 on 2 warps (255 registers + 280 bytes of
    stack), prefill BLOCK_M 128 on 4 warps (8 to 600 bytes of stack; the others, 8 warps or BLOCK_M 64, do not spill
    with the K/V multi-buffered either: tests/kernels/compile_check.py --prefill-grid). Skipped: a compile each
    saved."""
    if kernel == "decode":
        return cfg.get("BLOCK_N") == 128 and cfg.get("num_warps") == 2
    return cfg.get("BLOCK_M") == 128 and cfg.get("num_warps") == 4


def prefill_shared_bytes(cfg: dict, head_dim: int, dtype: torch.dtype) -> int:
    """The prefill's shared memory: its Q tile and ``num_stages`` K and V tiles (the K/V gathers are multi-buffered
    since the block-table entries are loaded a tile ahead). Within 1 KiB of the compiler's for bf16, head dim 128,
    sm_90 (tests/kernels/compile_check.py --prefill-grid): 128 x 64 at 2/3/4 stages 96/128/160 KiB; 64 x 128 at
    4 stages 273 KiB and 128 x 128 at 4 stages 289 KiB, past an H100's 227 KiB."""
    from hetero_infer.kernels._backend import next_pow2

    elem = torch.empty((), dtype=dtype).element_size()
    return (cfg["BLOCK_M"] + 2 * cfg["num_stages"] * cfg["BLOCK_N"]) * next_pow2(head_dim) * elem


def shared_memory_limit(device: torch.device) -> int | None:
    """Shared memory a block may use on ``device`` (opt-in maximum), bytes; None off CUDA or where torch does
    not say (then a config past it fails to launch, and is reported and skipped like any other)."""
    if device.type != "cuda":
        return None
    return getattr(torch.cuda.get_device_properties(device), "shared_memory_per_block_optin", None)


def too_big(bucket: Bucket, cfg: dict, limit: int | None) -> str | None:
    """Why ``cfg`` cannot run on the device (a prefill whose K/V buffers exceed shared memory), else None."""
    if bucket.kernel != "prefill" or limit is None:
        return None
    c = bucket.cases[0]
    need = prefill_shared_bytes(cfg, c.head_dim, c.dtype)
    return f"needs ~{need // 1024} KiB of shared memory, the device has {limit // 1024} KiB" if need > limit else None


def splits(bucket: Bucket, cfg: dict, device: torch.device) -> bool:
    """Whether the decode splits the KV of some case of the bucket under ``cfg`` (batch x KV heads programs
    under its TARGET_PROGRAMS): only then does MIN_PARTITION matter."""
    from hetero_infer.kernels import _backend as B

    target = cfg.get("TARGET_PROGRAMS") or 2 * B.num_sms(device)
    return bucket.kernel == "decode" and any(len(c.contexts) * c.kv_heads < target for c in bucket.cases)


def builtin_config(case: Case, device: torch.device) -> dict:
    from hetero_infer.kernels import _triton_attention as A

    group = case.heads // case.kv_heads
    if case.kernel == "decode":
        return A._decode_config(case.head_dim, case.dtype, device, group=group, page=PAGE, batch=case.size)
    return A._prefill_config(case.head_dim, case.dtype, device, group=group, page=PAGE, tokens=case.size)


class Tuner:
    def __init__(self, device: torch.device, timer: Timer, deadline: float, full: bool, smoke: bool) -> None:
        self.device, self.timer, self.deadline, self.full, self.smoke = device, timer, deadline, full, smoke
        self.stopped = False
        self.smem_limit = shared_memory_limit(device)

    def out_of_time(self) -> bool:
        self.stopped = self.stopped or time.monotonic() > self.deadline
        return self.stopped

    def stages(self, bucket: Bucket) -> list:
        """The search's stages, each a function of the best config so far giving the changes to try on it."""
        from hetero_infer.kernels import _backend as B

        g = grid(bucket.kernel, self.smoke)
        tiles = ("BLOCK_N", "num_warps") if bucket.kernel == "decode" else ("BLOCK_M", "BLOCK_N", "num_warps")

        def product(names):
            return lambda best: [dict(zip(names, values)) for values in itertools.product(*(g[n] for n in names))]

        out = [product([*tiles, "num_stages"])] if self.full else [product(tiles), product(["num_stages"])]
        if bucket.kernel == "decode":
            sms = B.num_sms(self.device)
            out.append(lambda best: [{"TARGET_PROGRAMS": k * sms} for k in g["TARGET_PER_SM"]])
            out.append(lambda best: [{"MIN_PARTITION": p} for p in g["MIN_PARTITION"]]
                       if splits(bucket, best, self.device) else [])
        return out

    def tune(self, bucket: Bucket, inputs: dict[str, Inputs], base_us: dict[str, float]) -> None:
        base = builtin_config(bucket.cases[0], self.device)
        best, best_score = dict(base), 1.0
        for stage in self.stages(bucket):
            start = dict(best)
            for change in stage(start):
                cfg = {**start, **change}
                if (cfg == base or any(t["config"] == cfg for t in bucket.tried) or (not self.smoke and spills(
                        bucket.kernel, cfg)) or self.out_of_time()):
                    continue
                why = too_big(bucket, cfg, self.smem_limit)
                if why:  # skipped without a compile, but reported
                    bucket.tried.append({"config": cfg, "error": f"skipped: {why}"})
                    print(f"  skip {bucket.kernel} {bucket.key} @{bucket.size} {json.dumps(cfg)}: {why}", flush=True)
                    continue
                score = self.try_config(bucket, cfg, inputs, base_us)
                if score is not None and score < best_score:
                    best, best_score = cfg, score
        if best != base:
            self.confirm(bucket, base, best, inputs)

    def try_config(self, bucket: Bucket, cfg: dict, inputs: dict[str, Inputs], base_us: dict[str, float]):
        rec: dict = {"config": cfg}
        bucket.tried.append(rec)
        try:
            for c in bucket.cases:
                why = check(c, inputs[c.id], cfg)
                if why:
                    rec["error"] = why
                    break
        except Exception as exc:  # does not compile (shared memory, registers), or fails to launch
            rec["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ''}"
        if "error" in rec:
            print(f"  skip {bucket.kernel} {bucket.key} @{bucket.size} {json.dumps(cfg)}: {rec['error']}", flush=True)
            return None
        rec["us"] = [self.timer(lambda: launch(c, inputs[c.id], cfg)) for c in bucket.cases]
        rec["score"] = math.exp(sum(math.log(u / base_us[c.id]) for u, c in zip(rec["us"], bucket.cases))
                                / len(bucket.cases))
        return rec["score"]

    def confirm(self, bucket: Bucket, base: dict, best: dict, inputs: dict[str, Inputs]) -> None:
        """Time the best and the built-in again, alternately, and keep the best only if still faster."""
        pairs = [(self.timer(lambda: launch(c, inputs[c.id], base)), self.timer(lambda: launch(c, inputs[c.id], best)))
                 for c in bucket.cases]
        ratio = math.exp(sum(math.log(b / a) for a, b in pairs) / len(pairs))
        bucket.confirm = {"builtin_us": [a for a, _ in pairs], "best_us": [b for _, b in pairs], "ratio": ratio}
        if ratio < KEEP_IF_FASTER:
            bucket.best = best


def run_bucket(tuner: Tuner, bucket: Bucket, device: torch.device, base_us: dict[str, float]) -> None:
    inputs = {c.id: make_inputs(c, device) for c in bucket.cases}
    for c in bucket.cases:  # the built-in config must be right, or nothing here means anything
        why = check(c, inputs[c.id], None)
        if why:
            raise RuntimeError(f"the built-in config is {why} on {c.id}")
        base_us[c.id] = tuner.timer(lambda: launch(c, inputs[c.id], None))
    tuner.tune(bucket, inputs, base_us)


# -- report ------------------------------------------------------------------------------------------------------
def table_rows(done: list[Bucket], base_us: dict[str, float], copy_gbs: float, device: torch.device) -> list[list[str]]:
    rows = []
    for b in done:
        for i, c in enumerate(b.cases):
            base = base_us.get(c.id)
            if base is None:
                continue
            best_us = b.confirm["best_us"][i] if b.best is not None else base
            if b.best is not None:
                base = b.confirm["builtin_us"][i]
            changed = {k: v for k, v in (b.best or {}).items() if builtin_config(c, device).get(k) != v}
            seconds = best_us / 1e6
            gbs = c.kv_bytes() / seconds / 1e9 if c.kernel == "decode" else None
            rows.append([
                f"{c.kernel} {c.model} {c.heads}/{c.kv_heads} d{c.head_dim}", c.name, f"{base:.1f}",
                json.dumps(changed) if changed else "built-in", f"{best_us:.1f}", f"{base / best_us:.2f}x",
                f"{gbs:.0f}" if gbs else "-", f"{100 * gbs / copy_gbs:.0f}%" if gbs else "-",
                f"{c.flops() / seconds / 1e12:.1f}" if c.kernel == "prefill" else "-",
                f"{len(b.tried)} ({sum('error' in t for t in b.tried)} failed)"])
    return rows


HEADER = ["shape", "case", "built-in µs", "best config (changes)", "best µs", "speed-up", "K/V GB/s", "% of copy",
          "TFLOP/s", "configs tried"]


def format_table(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "|".join("---" for _ in HEADER) + "|"]
    return "\n".join([*lines, *("| " + " | ".join(r) + " |" for r in rows)])


def config_table(done: list[Bucket], device_name: str) -> dict:
    import triton

    kernels: dict = {}
    for b in done:
        if b.best is not None:
            kernels.setdefault(b.kernel, {}).setdefault(b.key, {})[str(b.size)] = b.best
    return tuned.validate({"device": device_name, "triton": triton.__version__, "torch": torch.__version__,
                           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "kernels": kernels},
                          "(tuning output)")


def main(argv: list[str] | None = None) -> int:
    """The built-in configs are the baseline: shipped or environment tables are off during the run."""
    from hetero_infer import kernels

    saved = os.environ.get(tuned.ENV_VAR)
    os.environ[tuned.ENV_VAR] = "none"
    tuned.clear_cache()
    try:
        with kernels.use_backend(kernels.get_backend()):  # --smoke forces Triton: not past this call
            return _main(argv)
    finally:
        if saved is None:
            os.environ.pop(tuned.ENV_VAR, None)
        else:
            os.environ[tuned.ENV_VAR] = saved
        tuned.clear_cache()


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="the tuned table (kernels/tuned.py's format)")
    ap.add_argument("--json", type=Path, help="every timing and failure")
    ap.add_argument("--budget-s", type=float, default=150.0, help="stop the search after this many seconds")
    ap.add_argument("--grid", choices=["staged", "full"], default="staged")
    ap.add_argument("--only", choices=["decode", "prefill"], help="one kernel only")
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated: " + ", ".join(MODELS))
    ap.add_argument("--smoke", action="store_true", help="tiny shapes in Triton's interpreter (checks the script)")
    return ap


def _main(argv: list[str] | None) -> int:
    a = build_parser().parse_args(argv)
    t0 = time.monotonic()
    if a.smoke:
        from hetero_infer import kernels

        kernels.set_backend("triton")
        device = torch.device("cpu")
    elif not torch.cuda.is_available():
        print("tune_kernels: no CUDA device (use --smoke to check the script on the CPU)", file=sys.stderr)
        return 2
    else:
        device = torch.device("cuda")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (Triton interpreter)"
    from hetero_infer.bench.throughput import copy_bandwidth

    copy_gbs = copy_bandwidth(device, 1 << 20 if a.smoke else 1 << 30) / 1e9
    print(f"tune_kernels on {name}: copy bandwidth {copy_gbs:.0f} GB/s, budget {a.budget_s:.0f} s", flush=True)
    models = set(a.models.split(","))
    todo = [c for c in cases(a.smoke) if (a.smoke or c.model in models) and (a.only in (None, c.kernel))]
    tuner = Tuner(device, Timer(device, a.smoke), t0 + a.budget_s, a.grid == "full", a.smoke)
    base_us: dict[str, float] = {}
    done: list[Bucket] = []
    failed = False
    for bucket in buckets(todo):
        if tuner.out_of_time():
            print(f"budget spent: {bucket.kernel} {bucket.key} @{bucket.size} not tuned", flush=True)
            continue
        try:
            run_bucket(tuner, bucket, device, base_us)
        except Exception:
            failed = True
            print(f"bucket {bucket.kernel} {bucket.key} @{bucket.size} failed:", flush=True)
            traceback.print_exc()
        done.append(bucket)
        print(f"[{time.monotonic() - t0:.0f}s] {bucket.kernel} {bucket.key} @{bucket.size}: "
              f"{len(bucket.tried)} configs, kept {json.dumps(bucket.best) if bucket.best else 'the built-in'}",
              flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    rows = table_rows(done, base_us, copy_gbs, device)
    print()
    print(format_table(rows))
    table = config_table(done, name)
    if a.out:
        a.out.write_text(json.dumps(table, indent=1) + "\n")
        print(f"wrote {a.out} ({sum(len(s) for k in table['kernels'].values() for s in k.values())} entries)")
    if a.json:
        a.json.write_text(json.dumps({
            "device": name, "copy_gbs": copy_gbs, "seconds": round(time.monotonic() - t0, 1),
            "stopped_by_budget": tuner.stopped, "header": HEADER, "rows": rows,
            "buckets": [{"kernel": b.kernel, "key": b.key, "size": b.size, "cases": [c.name for c in b.cases],
                         "builtin_us": [base_us.get(c.id) for c in b.cases], "best": b.best,
                         "confirm": b.confirm, "tried": b.tried} for b in done]}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
