"""The decoder stack of a decode step in one C call (kernels/cpu/csrc/decode_step.c), bfloat16 or float32, for
the row counts whose linears the project's GEMM of that dtype serves.

The per-op CPU path spends ~270 Python/ctypes dispatches and ~200 OpenMP fork/joins a step (about 8 ms of a
37 ms 32-row bfloat16 step; as long as the weight stream at one row). This runs all layers in one parallel
region, with the per-op path's own kernels (bit for bit its hidden states).

It engages only where its preconditions hold (`FusedDecodeStack.build` logs why not otherwise): the C library
with the dtype's fused step (bfloat16: AVX512_BF16 or AVX2 + FMA; float32: AVX-512F or AVX2 + FMA), a bfloat16 or float32 model on the C
attention backend, no per-head q/k norms (Qwen3), and at least one row bucket of `select.BUCKETS` in which
every projection is served by the dtype's GEMM (`gemm_bf16`, `gemm_f32`) on the one packed weight the C step
reads. It takes the decode steps (one new token a row) whose row count falls in such a bucket (`covered`):
where the measurement chose another kernel for some projection in a bucket (oneDNN on an AMX CPU, say), that
bucket's steps run the per-op path, so the logits stay the per-op path's. Where such a bucket's projections all
have the GEMM's weight anyway (packed for their other buckets) and the kernel choice is measured, the fused step
is timed against the per-op step on a probe decode step (`measure_uncovered`): the plan timed each linear alone,
with its weight in cache, and cannot see the glue the fused step removes. Where the fused step wins, that
bucket's projections move onto the GEMM (per op too) and the bucket is covered. Prefill and mixed steps always
run per op. HETERO_INFER_CPU_FUSED=0 turns it off.
"""

from __future__ import annotations

import ctypes
import logging
import os

import numpy as np
import torch
from torch import nn

from hetero_infer.kernels.cpu import native, select

log = logging.getLogger(__name__)

_P, _I, _F, _L = ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ctypes.c_long

# The decoder layouts the C step computes (a model names its own: `model.decode_layout`), each with what it reads of
# a layer (`model.decode_weights()`: per layer, these keys). "llama": pre-norm, fused q/k/v (+ bias), rotary GQA
# attention, o, fused gate|up SiLU MLP, down; no per-head q/k norm, no experts.
LAYOUTS = {"llama": ("input_norm", "post_norm", "qkv", "o", "gate_up", "down")}
_PROJECTIONS = ("qkv", "o", "gate_up", "down")

# per model dtype: the C step's name suffix and the GEMM every projection must be packed for
_KERNELS: dict[torch.dtype, tuple[str, str]] = {torch.bfloat16: ("bf16", "gemm_bf16"),
                                                 torch.float32: ("f32", "gemm_f32")}


class _Layer(ctypes.Structure):
    _fields_ = [(name, _P) for name in (
        "input_norm", "post_norm", "qkv", "qkv_bias", "o", "o_bias", "gate_up", "gate_up_bias", "down", "down_bias",
        "k_cache", "v_cache")]


class _Shape(ctypes.Structure):
    _fields_ = [(name, _I) for name in (
        "layers", "rows", "hidden", "heads", "kv_heads", "head_dim", "intermediate", "block_size", "max_blocks")] + [
        ("eps", _F), ("scale", _F)]


class LoraTarget(ctypes.Structure):
    """One projection's slots of stacked LoRA weights (a [slots, n*rank, in], b [slots, out, rank]); a = None: no
    adapter of the step updates it."""
    _fields_ = [("a", _P), ("b", _P)]


class StepLora(ctypes.Structure):
    """A step's adapters as the C step reads them: `targets` [layers * 4] (per layer its qkv, o, gate_up and down,
    `LORA_PROJECTIONS`), `slots` int32 [rows] (-1: the base model alone), the slots' rank."""
    _fields_ = [("targets", ctypes.POINTER(LoraTarget)), ("slots", _P), ("rank", _I)]


# the order of a layer's LoRA targets in StepLora.targets (decode_step.c's LORA_QKV .. LORA_DOWN)
LORA_PROJECTIONS = _PROJECTIONS


def enabled() -> bool:
    return os.environ.get("HETERO_INFER_CPU_FUSED", "1") != "0"


def available(dtype: torch.dtype = torch.bfloat16) -> bool:
    """The C library is built with the fused step of `dtype` (where its GEMM is: see `missing_step_reason`)."""
    if dtype not in _KERNELS or native.library() is None:
        return False
    return bool(native.function("decode_step_available", [_I], _I)(int(dtype == torch.bfloat16)))


def _step_fn(dtype: torch.dtype):
    return native.function(f"decode_step_{_KERNELS[dtype][0]}", [_P] * 10 + [_P, _L, _P], _L)


def covered_buckets(plans: list[tuple[str, ...]], kind: str) -> tuple[bool, ...]:
    """Per bucket of `select.BUCKETS`: whether every projection serves it with `kind` on the weight the C step
    reads (`plans`: each projection's kinds by bucket, "another weight" where a bucket has another copy)."""
    return tuple(all(plan[i] == kind for plan in plans) for i in range(len(select.BUCKETS)))


def rows_label(covered: tuple[bool, ...]) -> str:
    """The row counts of the covered buckets, e.g. "1 row", "1-32 rows", "9 rows and more", "any row count"."""
    if all(covered):
        return "any row count"
    parts, i = [], 0
    while i < len(covered):
        if not covered[i]:
            i += 1
            continue
        j = i
        while j + 1 < len(covered) and covered[j + 1]:
            j += 1
        lo = 1 if i == 0 else select.BUCKETS[i - 1] + 1
        hi = select.BUCKETS[j]
        parts.append(f"{lo} rows and more" if j == len(covered) - 1 else f"{lo}-{hi} rows" if hi > lo else f"{lo} row")
        i = j + 1
    return ", ".join(parts)


class FusedDecodeStack:
    """A model's decoder layers with their packed weights and KV caches, as the C step takes them."""

    def __init__(self, model: nn.Module, backend, kv_caches, dtype: torch.dtype, keep: list[torch.Tensor],
                 layers: ctypes.Array, shape: _Shape, covered: tuple[bool, ...]) -> None:
        self.model, self.backend, self.rope, self.kv_caches = model, backend, backend.rope, kv_caches
        self._keep = keep  # float32 biases: the C step holds their pointers
        self._layers, self._shape = layers, shape
        self._step, self._dtype = _step_fn(dtype), dtype
        self._scratch = torch.empty(0, dtype=torch.uint8)  # the C step's buffers, kept from step to step
        self.covered = covered  # per row bucket of select.BUCKETS: whether it takes that bucket's decode steps

    @property
    def label(self) -> str:
        """Which steps it takes, as `hetero-infer bench` prints it."""
        return f"fused (decode steps of {rows_label(self.covered)})"

    @classmethod
    def build(cls, model: nn.Module, backend, kv_caches, dtype: torch.dtype) -> FusedDecodeStack | None:
        """The fused stack of `model` (a decoder of a layout in `LAYOUTS`, packed for the CPU), or None with the reason
        logged."""
        reason, covered = _unsupported(model, backend, dtype)
        if reason:
            log.info("fused CPU decode step off: %s", reason)
            return None
        cfg, kind = model.config, _KERNELS[dtype][1]
        keep: list[torch.Tensor] = []

        def ptr(t: torch.Tensor | None) -> int | None:
            return None if t is None else t.data_ptr()

        def bias(linear) -> int | None:
            if linear.bias is None:
                return None
            keep.append(linear.bias.detach().float().contiguous())
            return keep[-1].data_ptr()

        weights = model.decode_weights()
        layers = (_Layer * len(weights))()
        for entry, layer, (k_cache, v_cache) in zip(layers, weights, kv_caches):
            entry.input_norm, entry.post_norm = ptr(layer["input_norm"]), ptr(layer["post_norm"])
            for name in _PROJECTIONS:
                linear = layer[name]
                setattr(entry, name, ptr(_first(linear.by_bucket, kind).data))
                setattr(entry, name + "_bias", bias(linear))
            entry.k_cache, entry.v_cache = ptr(k_cache), ptr(v_cache)
        k0 = kv_caches[0][0]  # [blocks, block_size, kv_heads, head_dim]
        kv_heads, head_dim = k0.shape[2], k0.shape[3]
        heads = weights[0]["qkv"].out_features // head_dim - 2 * kv_heads
        shape = _Shape(layers=len(weights), rows=0, hidden=weights[0]["o"].out_features, heads=heads,
                       kv_heads=kv_heads, head_dim=head_dim, intermediate=weights[0]["down"].in_features,
                       block_size=k0.shape[1], max_blocks=0, eps=cfg.rms_norm_eps, scale=head_dim**-0.5)
        stack = cls(model, backend, kv_caches, dtype, keep, layers, shape, covered)
        from hetero_infer.kernels.cpu import linear as cpu_linear

        if cpu_linear.enabled():  # the kernel choice is measured: so is the fused step against the plan
            threads = cpu_linear.MEASURE_THREADS
            stack.measure_uncovered(threads=threads, cache=select.machine_cache(threads))
        log.info("fused CPU decode step on: decode steps of %s", rows_label(stack.covered))
        return stack

    def measure_uncovered(self, timer=select.clock, rounds: select.Rounds = select.Rounds(budget_s=0.5),
                          cache: select.ChoiceCache | None = None, threads: int | None = None) -> None:
        """Decide by measurement the buckets left out only because the plan put some projection on another kernel
        while the projection also has the GEMM's weight (packed for another bucket). The plan timed each linear
        alone, with its weight in cache; the fused step also removes the glue between them. So the fused step
        (with that weight) is timed against the per-op step (with the plan's kernels) on a probe decode step of
        the bucket's rows; where it is faster (or within select.TIE), those projections take the GEMM in that
        bucket, for the per-op path too (its logits stay the fused step's), and the bucket is covered. The last
        bucket (more than 32 rows) is left as the plan has it: it serves prefill-sized calls too. With a `cache`,
        each outcome is kept on disk (per model shape, bucket and the per-op kernels it was timed against), so a
        second start on the same machine times nothing. `threads`: how many the probe runs on (the kernel
        choice's one thread: with two on a shared CPU every barrier of the fused step waits for a descheduled
        thread; at load 2-4 here a one-row float32 probe took 1096 ms fused against 488 ms per op, about 20
        ms each when quiet, and the outcome would be cached)."""
        kind = _KERNELS[self._dtype][1]
        linears = _projections(self.model)
        covered = list(self.covered)
        for b, on in enumerate(covered[:-1]):  # not the last: it also serves prefill, which the probe does not time
            if on or any(_first(linear.by_bucket, kind) is None for linear in linears):
                continue
            entry = self._probe_entry(b, linears)
            if cache is not None and cache.get(entry):
                choice, timings = cache.get(entry)[0], (cache.timings(entry) or [{}])[0]
            else:
                before = torch.get_num_threads()
                torch.set_num_threads(threads or before)
                try:
                    timings = self._time_probe(min(select.BUCKETS[b], self.kv_caches[0][0].shape[0]), timer, rounds)
                finally:
                    torch.set_num_threads(before)
                choice = select.choose(timings, ("fused", "per op"))
                if cache is not None and choice:
                    cache.put(entry, (choice,), [timings])
            log.info("row bucket %d: fused step %s, per-op step %s: %s", select.BUCKETS[b],
                     _ms(timings.get("fused")), _ms(timings.get("per op")), choice)
            if choice != "fused":
                continue
            for linear in linears:
                weight = _first(linear.by_bucket, kind)
                linear.by_bucket = tuple(weight if i == b else p for i, p in enumerate(linear.by_bucket))
                linear.plan = tuple(kind if i == b else k for i, k in enumerate(linear.plan))
            covered[b] = True
        self.covered = tuple(covered)

    def _probe_entry(self, bucket: int, linears: list) -> str:
        """The disk cache's name of a probe: the dtype, the model's shape, the bucket and the per-op kernels."""
        sh = self._shape
        shape = f"{sh.layers}x{sh.hidden}x{sh.intermediate}x{sh.heads}/{sh.kv_heads}x{sh.head_dim}"
        per_op = "+".join(sorted({linear.plan[bucket] for linear in linears}))
        return f"fused_step:{str(self._dtype).removeprefix('torch.')}:{shape}:{select.BUCKETS[bucket]}:{per_op}"

    def probe_step(self, rows: int) -> tuple[torch.Tensor, object]:
        """(input ids, attention metadata) of a decode step of `rows` fake sequences (one KV block each, a full
        block of context) over the engine's cache, for timing: its blocks must hold nothing a sequence still needs
        (an idle engine's)."""
        from hetero_infer.worker.runner.attention.base import SeqSpan, StepBatch

        bs = self._shape.block_size
        batch = StepBatch([SeqSpan([r], bs - 1, 1, False) for r in range(rows)],
                          np.full(rows, bs - 1, dtype=np.int64), np.arange(rows, dtype=np.int64) * bs + bs - 1, bs)
        input_ids = torch.randint(100, 1000, (rows,), generator=torch.Generator().manual_seed(0))
        return input_ids, self.backend.prepare(batch)

    def _time_probe(self, rows: int, timer, rounds: select.Rounds) -> dict[str, float | None]:
        """The fused and the per-op step timed on a probe decode step of `rows` rows (`probe_step`)."""
        input_ids, meta = self.probe_step(rows)
        with torch.inference_mode():
            return select.measure({"fused": lambda _: lambda: self.run(input_ids, meta),
                                   "per op": lambda _: lambda: self.model(input_ids, self.backend, meta, self.kv_caches)},
                                  buckets=[rows], timer=timer, rounds=rounds)[0]

    def accepts(self, rows: int, sampled: int) -> bool:
        """A step of `rows` rows of which `sampled` produce logits: a decode step (every row a sequence's one new
        token, so every row samples) in a covered row bucket."""
        return 1 <= rows == sampled and self.covered[select.bucket_index(rows)]

    def run(self, input_ids: torch.Tensor, meta, lora: StepLora | None = None) -> torch.Tensor:
        """Hidden states [T, hidden] of the step's rows (the final norm applied), as the model's forward; with
        `lora`, each row's adapter update added to every projection it targets (the LoRA hooks' computation)."""
        model = self.model
        h = model.embed_tokens(input_ids).contiguous()  # a fresh tensor: the C step writes into it
        residual = torch.empty_like(h)
        tables, lens = meta.block_tables, meta.context_lens
        positions, slots = meta.positions, meta.slot_mapping
        assert tables.dtype == lens.dtype == torch.int32 and positions.dtype == slots.dtype == torch.int64
        assert tables.is_contiguous() and lens.is_contiguous() and positions.is_contiguous() and slots.is_contiguous()
        shape = self._shape
        shape.rows, shape.max_blocks = h.shape[0], tables.shape[1]
        args = (ctypes.addressof(self._layers), ctypes.addressof(shape), h.data_ptr(), residual.data_ptr(),
                positions.data_ptr(), slots.data_ptr(), self.rope.cos.data_ptr(), self.rope.sin.data_ptr(),
                tables.data_ptr(), lens.data_ptr())
        extra = None if lora is None else ctypes.addressof(lora)
        rc = self._step(*args, self._scratch.data_ptr(), self._scratch.numel(), extra)
        if rc > 0:  # the scratch buffer is too small for this step: grown (with room), then the step runs
            self._scratch = torch.empty(rc + rc // 4, dtype=torch.uint8)
            rc = self._step(*args, self._scratch.data_ptr(), self._scratch.numel(), extra)
        if rc != 0:
            raise RuntimeError(f"the fused decode step failed ({rc})")
        return model.norm(h, self.backend, residual)[0]


def _unsupported(model: nn.Module, backend, dtype: torch.dtype) -> tuple[str | None, tuple[bool, ...]]:
    """(why the fused step cannot run `model` here, or None where it can; the row buckets it covers)"""
    from hetero_infer.kernels.cpu.linear import PackedLinear

    if not enabled():
        return "HETERO_INFER_CPU_FUSED=0", ()
    if dtype not in _KERNELS:
        return f"dtype {dtype} (not {', '.join(str(d) for d in _KERNELS)})", ()
    if getattr(backend, "name", None) != "cpu":
        return f"attention backend {getattr(backend, 'name', backend)!r} (the C backend only)", ()
    if not available(dtype):
        return missing_step_reason(dtype), ()
    layout = getattr(model, "decode_layout", None)
    if layout not in LAYOUTS:
        return f"decoder layout {layout!r} (the C step computes {', '.join(map(repr, LAYOUTS))})", ()
    kind = _KERNELS[dtype][1]
    plans: list[tuple[str, ...]] = []
    for i, layer in enumerate(model.decode_weights()):
        for linear in (layer[name] for name in _PROJECTIONS):
            if not isinstance(linear, PackedLinear):
                return f"layer {i}: {type(linear).__name__} is not a packed linear", ()
            weight = _first(linear.by_bucket, kind)
            plans.append(tuple(p.kind if p is weight else "another weight" for p in linear.by_bucket))
    covered = covered_buckets(plans, kind)
    if not any(covered):
        return f"no row bucket has every projection on {kind}", ()
    if backend.rope.cos.dtype != dtype or not backend.rope.cos.is_contiguous():
        return f"rotary tables not {dtype}", ()
    return None, covered


# what running per op costs, as measured (docs/cpu.md, "The decode step in one C call")
PER_OP_COST = ("each decode step runs per op instead: ~270 Python/ctypes calls and ~200 thread fork/joins more a "
               "step (on the dev box 23.4 against 17.4 ms a one-row float32 step, and worse beside other work)")


def missing_step_reason(dtype: torch.dtype) -> str:
    """Why the library has no fused step of `dtype`, and what that costs (the log line of `build`)."""
    if native.library() is None:
        return f"the C kernels are off or could not be built; {PER_OP_COST}"
    needs = "AVX512_BF16 or AVX2 + FMA" if dtype == torch.bfloat16 else "AVX-512F or AVX2 + FMA"
    return (f"no fused {dtype} step in this build of the C kernels: it needs {needs}, and the library was built at "
            f"ISA level {native.isa()} ({native.level_reason()}); {PER_OP_COST}")


def _projections(model: nn.Module) -> list:
    return [layer[name] for layer in model.decode_weights() for name in _PROJECTIONS]


def _ms(t: float | None) -> str:
    return "failed" if t is None else f"{1e3 * t:.2f} ms"


def _first(by_bucket, kind: str):
    """The first packed weight of `kind` among a linear's buckets (the one the C step reads), or None."""
    return next((p for p in by_bucket if p.kind == kind), None)
