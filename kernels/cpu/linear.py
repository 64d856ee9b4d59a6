"""Linear layers with weights pre-packed once at load time, for the CPU path.

PyTorch's `F.linear` on CPU goes to MKL; on the AMD EPYC machines this project runs on,
oneDNN's packed-weight GEMM is 2-4x faster in float32 for decode-sized batches (measured:
32x576x3072 0.90 -> 0.35 ms; the 49152-row LM head 32 -> 7.3 ms). It is the same packing
torch.compile's CPU backend applies ("weight prepacking"). In bfloat16, on CPUs with
AVX512_BF16, the project's own GEMM (kernels/cpu/csrc/gemm.c) replaces oneDNN: it overlaps weight
streaming with compute, which oneDNN does not at decode batch sizes (one decode step's linears
of the default model, one thread: 27.5 -> 23.8 ms at 32 rows, 10.8 -> 8.0 ms at one row; equal
or faster at prefill sizes). In float32, on CPUs with AVX-512F, the project's float32 GEMM
(kernels/cpu/csrc/gemm_f32.c, "gemm_f32") is a candidate beside oneDNN and `F.linear` (one thread, weights
from memory: 1.2-1.3x oneDNN at 32 rows, 1.5-3x at one row; docs/benchmarks.md). On CPUs with AVX2 + FMA and no
AVX-512 (and for bfloat16 on AVX-512 CPUs without AVX512_BF16) both GEMMs are built from their AVX2 sections
(bfloat16 widened to float32 in registers; docs/cpu.md, "ISA levels"). HETERO_INFER_ONEDNN=0 keeps plain
`F.linear` everywhere.

Which of these serves a layer is measured, not assumed (`select.py`): for each weight shape and row-count
bucket the candidates of its dtype (`CANDIDATES`: the project's GEMM, oneDNN's packed weights, PyTorch's
default `F.linear`) are timed once on the machine at hand, the fastest kept, and the choice cached on disk.
The vendor-tuned order above is only the tie-break. HETERO_INFER_CPU_SELECT=0 skips the measurement and
takes the first candidate that runs here (the order of `CANDIDATES`). HETERO_INFER_CPU_LINEAR=<kinds> limits
the choice to the kernels named (comma-separated: one name forces it where it runs, for tests and A/B runs).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import statistics
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from hetero_infer.kernels.cpu import native, select, weight_arena

log = logging.getLogger(__name__)

_BATCH_HINT = 32  # the oneDNN packed layout is valid for any batch; the hint only tunes it
_PANEL = 64  # output columns per panel of the bfloat16 GEMM's layout (NR * 16 in gemm.c)
_P, _I = ctypes.c_void_p, ctypes.c_int


def available() -> bool:
    if os.environ.get("HETERO_INFER_ONEDNN", "1") == "0":
        return False
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


@functools.cache
def _onednn_bf16() -> bool:
    """Whether oneDNN runs bfloat16 here (its reorder raises on a CPU without the instructions, e.g. AVX2-only)."""
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(check()) if check is not None else True


@functools.cache
def _gemm_bf16():
    """The C bfloat16 GEMM, or None where the library or AVX512_BF16 / AVX2 + FMA is missing."""
    if native.library() is None:
        return None
    if not native.function("gemm_bf16_available", [], ctypes.c_int)():
        return None
    return native.function("gemm_bf16", [_P, _I, _I, _P, _I, _P, _P], ctypes.c_int)


@functools.cache
def _gemm_f32():
    """The C float32 GEMM, or None where the library or AVX-512F / AVX2 + FMA is missing."""
    if native.library() is None:
        return None
    if not native.function("gemm_f32_available", [], ctypes.c_int)():
        return None
    return native.function("gemm_f32", [_P, _I, _I, _P, _I, _P, _P], ctypes.c_int)


@functools.cache
def _f32_panel() -> int:
    """Output columns per panel of the float32 GEMM's layout (NR * 16 in gemm_f32.c)."""
    return native.function("gemm_f32_panel", [], ctypes.c_int)()


@functools.cache
def _gemm_quantized(bits: int):
    """The C W8A16 / W4A16 GEMM (bfloat16 activations), or None where the bfloat16 GEMM is missing."""
    if _gemm_bf16() is None:
        return None
    if bits == 8:
        return native.function("gemm_w8a16", [_P, _I, _I, _P, _P, _I, _P, _P], ctypes.c_int)
    return native.function("gemm_w4a16", [_P, _I, _I, _P, _P, _P, _I, _I, _P, _P], ctypes.c_int)


def own_bfloat16_gemm() -> bool:
    """Whether the engine packs its linears (`available()`) and the project's bfloat16 GEMM runs here: then its
    bfloat16 linears do not depend on PyTorch's bfloat16 matmul (~100x slower than float32 on CPUs without
    bfloat16 instructions)."""
    return available() and _gemm_bf16() is not None


def quantized_gemm_available() -> bool:
    return _gemm_quantized(8) is not None


@dataclass
class PackedWeight:
    """A weight [N, K] in the layout of the GEMM that will use it: "onednn", "gemm_bf16", "torch" (the weight
    as it is, for `F.linear`), or the weight-only quantized "gemm_w8a16" / "gemm_w4a16" (with their scales,
    and zero points for INT4)."""

    kind: str
    data: torch.Tensor
    out_features: int
    in_features: int
    scales: torch.Tensor | None = None
    zeros: torch.Tensor | None = None
    group_size: int = 0


def _panels(t: torch.Tensor, n: int) -> torch.Tensor:
    """`t` [n, ...] zero-padded to a whole number of panels: [panels, _PANEL, ...]."""
    padded = t.new_zeros((-(-n // _PANEL) * _PANEL, *t.shape[1:]))
    padded[:n] = t
    return padded.view(-1, _PANEL, *t.shape[1:])


def pack_int8(qweight: torch.Tensor, scales: torch.Tensor) -> PackedWeight:
    """INT8 weights [N, K] with per-output-channel scales [N], for `gemm_w8a16`: panels of 64 columns whose
    row kp holds each column's pair (q[n, 2kp], q[n, 2kp + 1]), as the bfloat16 layout does."""
    n, k = qweight.shape
    data = _panels(qweight.detach().to(torch.int8), n).view(-1, _PANEL, k // 2, 2).permute(0, 2, 1, 3).contiguous()
    return PackedWeight("gemm_w8a16", data, n, k, scales=_panels(scales.detach().float(), n).reshape(-1))


def pack_int4(levels: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int) -> PackedWeight:
    """INT4 levels [N, K] (values 0..15) with scales and zero points [N, K / group_size], for `gemm_w4a16`:
    one byte per column and K pair in panels of 64 columns (low nibble k = 2kp, high nibble 2kp + 1); scales
    and zeros as float32 [panels, K / group_size, 64]."""
    n, k = levels.shape
    lv = _panels(levels.detach().to(torch.uint8), n).view(-1, _PANEL, k // 2, 2)
    data = (lv[..., 0] | (lv[..., 1] << 4)).permute(0, 2, 1).contiguous()

    def per_group(t: torch.Tensor) -> torch.Tensor:
        return _panels(t.detach().float(), n).permute(0, 2, 1).contiguous()

    return PackedWeight("gemm_w4a16", data, n, k, scales=per_group(scales), zeros=per_group(zeros),
                        group_size=group_size)


# Candidates per activation dtype, in the order that breaks near-ties (the order tuned on the AMD EPYC).
CANDIDATES: dict[torch.dtype, tuple[str, ...]] = {
    torch.bfloat16: ("gemm_bf16", "onednn", "torch"),
    torch.float32: ("onednn", "gemm_f32", "torch"),
}


class Unsupported(ValueError):
    """The kernel does not run on this CPU, build or shape."""


def unsupported(kind: str, weight: torch.Tensor) -> str | None:
    """Why `kind` cannot run `weight` [N, K] here, or None where it can."""
    if kind == "torch":
        return None
    if kind == "onednn":
        if not available():
            return "oneDNN packing is off or missing in this torch build"
        if weight.dtype == torch.bfloat16 and not _onednn_bf16():
            return "oneDNN's bfloat16 path needs AVX512BW/VL/DQ or AVX-NE-CONVERT, which this CPU lacks"
        return None
    if kind == "gemm_bf16":
        if weight.dtype != torch.bfloat16 or weight.shape[1] % 2:
            return "the bfloat16 GEMM takes bfloat16 weights with an even K"
        return None if _gemm_bf16() is not None else _missing("bfloat16 GEMM", "AVX512_BF16 or AVX2 + FMA")
    if kind == "gemm_f32":
        if weight.dtype != torch.float32:
            return "the float32 GEMM takes float32 weights"
        return None if _gemm_f32() is not None else _missing("float32 GEMM", "AVX-512F or AVX2 + FMA")
    return f"unknown linear kernel {kind!r}"


def _missing(kernel: str, needs: str) -> str:
    """Why the library has no `kernel`: no library, or the ISA level it was built for."""
    if native.library() is None:
        return "the C kernels are off or could not be built"
    return f"no {kernel} in this build of the C kernels (ISA level {native.isa()}; it needs {needs})"


def pack_as(kind: str, weight: torch.Tensor) -> PackedWeight:
    """`weight` [N, K] in `kind`'s layout; Unsupported where that kernel cannot run it here."""
    reason = unsupported(kind, weight)
    if reason:
        raise Unsupported(reason)
    n, k = weight.shape
    weight = weight.detach()
    if kind == "torch":
        return PackedWeight("torch", weight, n, k)
    if kind == "onednn":
        return PackedWeight("onednn", torch.ops.mkldnn._reorder_linear_weight(weight, _BATCH_HINT), n, k)
    if kind == "gemm_f32":  # panels of _f32_panel() columns; row k of a panel holds its columns' W[n, k]
        panel = _f32_panel()
        full = n // panel
        data = weight_arena.ARENA.zeros((-(-n // panel), k, panel), torch.float32)  # the columns past n stay 0
        data[:full] = weight[: full * panel].reshape(full, panel, k).transpose(1, 2)
        if n > full * panel:
            data[full, :, : n - full * panel] = weight[full * panel :].T
        return PackedWeight("gemm_f32", data, n, k)
    # gemm_bf16: panels of 64 columns; row kp of a panel holds each column's pair (W[n, 2kp], W[n, 2kp + 1])
    # (on huge pages: weight_arena.py); the columns past n stay zero
    full = n // _PANEL
    data = weight_arena.ARENA.zeros((-(-n // _PANEL), k // 2, _PANEL, 2), torch.bfloat16)
    data[:full] = weight[: full * _PANEL].reshape(full, _PANEL, k // 2, 2).transpose(1, 2)
    if n > full * _PANEL:
        data[full, :, : n - full * _PANEL] = weight[full * _PANEL :].reshape(-1, k // 2, 2).transpose(0, 1)
    return PackedWeight("gemm_bf16", data, n, k)


def allowed(candidates: tuple[str, ...]) -> tuple[str, ...]:
    """`candidates` restricted to those HETERO_INFER_CPU_LINEAR names (a comma-separated list, e.g. "gemm_f32"
    to force that kernel, "onednn,torch" to leave it out; for A/B runs and tests); all of them when it is unset
    or names none of them."""
    names = os.environ.get("HETERO_INFER_CPU_LINEAR", "").replace(" ", "").split(",")
    return tuple(c for c in candidates if c in names) or candidates


def default_kind(weight: torch.Tensor) -> str:
    """The first candidate of the weight's dtype that runs here (the choice without measuring)."""
    return next((k for k in allowed(CANDIDATES.get(weight.dtype, ())) if unsupported(k, weight) is None), "torch")


def pack_weight(weight: torch.Tensor) -> PackedWeight:
    """`weight` in the layout of its dtype's default kernel here (no measuring)."""
    return pack_as(default_kind(weight), weight)


def packed_linear(x: torch.Tensor, packed: PackedWeight, bias: torch.Tensor | None) -> torch.Tensor:
    if packed.kind == "onednn":
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed.data, bias, "none", [], "")
    if packed.kind == "torch":
        return F.linear(x, packed.data, bias)
    if packed.kind == "gemm_f32":
        return _linear_f32(x, packed, bias)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, packed.in_features).to(torch.bfloat16).contiguous()
    m, k, n = x2.shape[0], packed.in_features, packed.out_features
    out = torch.empty(m, n, dtype=torch.bfloat16)
    b = None if bias is None else bias.float().contiguous()
    b_ptr = None if b is None else b.data_ptr()
    if packed.kind == "gemm_bf16":
        rc = _gemm_bf16()(x2.data_ptr(), m, k, packed.data.data_ptr(), n, b_ptr, out.data_ptr())
    elif packed.kind == "gemm_w8a16":
        rc = _gemm_quantized(8)(x2.data_ptr(), m, k, packed.data.data_ptr(), packed.scales.data_ptr(), n, b_ptr,
                                out.data_ptr())
    else:
        rc = _gemm_quantized(4)(x2.data_ptr(), m, k, packed.data.data_ptr(), packed.scales.data_ptr(),
                                packed.zeros.data_ptr(), packed.group_size, n, b_ptr, out.data_ptr())
    if rc != 0:
        raise RuntimeError(f"{packed.kind} failed ({rc})")
    return out.view(*lead, n)


def _linear_f32(x: torch.Tensor, packed: PackedWeight, bias: torch.Tensor | None) -> torch.Tensor:
    x2 = x.reshape(-1, packed.in_features).to(torch.float32).contiguous()
    m, n = x2.shape[0], packed.out_features
    out = torch.empty(m, n, dtype=torch.float32)
    b = None if bias is None else bias.float().contiguous()
    rc = _gemm_f32()(x2.data_ptr(), m, packed.in_features, packed.data.data_ptr(), n,
                     None if b is None else b.data_ptr(), out.data_ptr())
    if rc != 0:
        raise RuntimeError(f"gemm_f32 failed ({rc})")
    return out.view(*x.shape[:-1], n)


class PackedLinear(nn.Module):
    """Drop-in replacement of an `nn.Linear` (same output) over its weight packed for the kernel `plan` names
    for each row-count bucket of `select.BUCKETS` (one kernel for all when `plan` is None: the default)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 plan: tuple[str, ...] | None = None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.plan = plan or (default_kind(weight),) * len(select.BUCKETS)
        layouts = {kind: pack_as(kind, weight) for kind in dict.fromkeys(self.plan)}
        self.by_bucket = tuple(layouts[kind] for kind in self.plan)
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)

    @property
    def packed(self) -> PackedWeight:
        """The layout of the smallest bucket (decode of one sequence)."""
        return self.by_bucket[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        return packed_linear(x, self.by_bucket[select.bucket_index(rows)], self.bias)


def bfloat16_slowdown(rows: int = 64, size: int = 512, repeats: int = 3) -> float:
    """How many times longer PyTorch's bfloat16 matmul (every bfloat16 linear's fallback) takes than its float32
    one on this CPU, by timing both (medians, after a first call each): around 1 or less with bfloat16
    instructions (AVX512_BF16, AMX), ~100 without (2-vCPU AVX2 AMD EPYC: 1 GFLOP/s against 125)."""
    x, w = torch.randn(rows, size), torch.randn(size, size)

    def median_s(a: torch.Tensor, b: torch.Tensor) -> float:
        torch.mm(a, b)
        return statistics.median(select.clock(lambda: torch.mm(a, b)) for _ in range(repeats))

    return median_s(x.bfloat16(), w.bfloat16()) / max(median_s(x, w), 1e-9)


def bfloat16_warning(slowdown: float) -> str | None:
    """What to tell a user serving in bfloat16 where its matmuls run `slowdown` times slower than float32's."""
    if slowdown <= 2.0:
        return None
    return (f"bfloat16 matmuls run {slowdown:.0f}x slower than float32 on this CPU (it lacks bfloat16 "
            "instructions such as AVX512_BF16 or AMX): --dtype float32 (or auto) serves faster here")


def enabled() -> bool:
    return os.environ.get("HETERO_INFER_CPU_SELECT", "1") != "0"


MEASURE_THREADS = 1


class LinearSelector:
    """The measured plan of each weight shape (see `select.py`): from the disk cache when this machine has
    measured it before, else measured now on the weight itself and saved. `choices` keeps every plan used.

    The candidates are timed on MEASURE_THREADS thread(s): which kernel is fastest is a property of the core
    (its ISA, caches, the kernel's code), and a one-thread call is disturbed only when a neighbour preempts it,
    while every parallel call on a shared machine waits for the slowest of its threads (measured on the dev
    box at load 13: two-thread samples of 20-40 ms for calls that take 0.05 ms, one-thread samples clean).
    How well each kernel scales over many cores is not part of the ranking."""

    def __init__(self, cache: select.ChoiceCache | None = None, timer=select.clock,
                 threads: int = MEASURE_THREADS) -> None:
        self.cache = cache if cache is not None else select.machine_cache(threads)
        self.timer = timer
        self.threads = threads
        self.choices: dict[str, tuple[str, ...]] = {}
        self.measured = 0  # shapes timed by this selector (0 on a start that found every choice cached)

    def plan(self, weight: torch.Tensor) -> tuple[str, ...]:
        n, k = weight.shape
        entry = f"linear:{str(weight.dtype).removeprefix('torch.')}:{n}x{k}"
        if entry in self.choices:
            return self.choices[entry]
        candidates = CANDIDATES.get(weight.dtype, ("onednn", "torch"))
        plan = self.cache.get(entry)
        runnable = [c for c in candidates if unsupported(c, weight) is None]
        chosen_from = tuple(c for c in allowed(candidates) if c in runnable) or candidates
        timed = self.cache.timings(entry) or []
        # a choice made before a candidate existed (or was runnable here) is no choice among it: measure again
        if not all(set(runnable) <= set(t) for t in timed):
            plan = None
        elif plan is not None and chosen_from != candidates:  # restricted: the same timings, fewer choices
            plan = _plan_or_none(timed, chosen_from)
        if plan is None or len(plan) != len(select.BUCKETS) or not set(plan) <= set(runnable):
            before = torch.get_num_threads()
            torch.set_num_threads(self.threads)
            try:
                timings = select.measure(_timed_calls(weight, candidates), select.BUCKETS, self.timer)
            finally:
                torch.set_num_threads(before)
            self.cache.put(entry, select.plan_buckets(timings, candidates), timings)
            plan = select.plan_buckets(timings, chosen_from)
            self.measured += 1
            log.info("%s: measured %s -> %s", entry, _format_timings(timings, candidates), "/".join(plan))
        self.choices[entry] = plan
        return plan


def _plan_or_none(timings: list[dict[str, float | None]], candidates: tuple[str, ...]) -> tuple[str, ...] | None:
    try:
        return select.plan_buckets(timings, candidates)
    except ValueError:  # none of them ran in some bucket
        return None


def _timed_calls(weight: torch.Tensor, candidates: tuple[str, ...]):
    """For `select.measure`: per candidate, rows -> a call of that kernel on `rows` random rows (packed once)."""
    packed: dict[str, PackedWeight] = {}
    gen = torch.Generator().manual_seed(0)

    def maker(kind: str):
        def make(rows: int):
            if kind not in packed:
                packed[kind] = pack_as(kind, weight)
            x = torch.randn(rows, weight.shape[1], generator=gen).to(weight.dtype)
            return lambda: packed_linear(x, packed[kind], None)
        return make

    return {kind: maker(kind) for kind in candidates}


def _format_timings(timings, candidates) -> str:
    return "; ".join(f"{rows} rows " + " ".join(f"{c} {t * 1e3:.3f}ms" if t else f"{c} -" for c, t in
                                               ((c, b.get(c)) for c in candidates))
                     for rows, b in zip(select.BUCKETS, timings))


def pack_linears(model: nn.Module, selector: LinearSelector | None = None) -> int:
    """Replace every plain `nn.Linear` in `model` (CPU, float weights) by a PackedLinear whose kernels the
    selector measured (the defaults without one); return how many."""
    count = 0
    with torch.no_grad():
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is nn.Linear and child.weight.device.type == "cpu":
                    plan = selector.plan(child.weight) if selector is not None else None
                    setattr(parent, name, PackedLinear(child.weight, child.bias, plan))
                    count += 1
    return count


def paths_by_layer(model: nn.Module) -> dict[str, str]:
    """Which kernel serves each layer type (the last part of the module name: qkv_proj, down_proj, lm_head...)
    per row bucket, e.g. {"qkv_proj": "1:gemm_bf16 8:gemm_bf16 32:onednn 256:onednn"}; quantized layers give
    their packed kind; layers of one type that differ are joined by " | "."""
    found: dict[str, dict[str, None]] = {}
    for name, module in model.named_modules():
        if isinstance(module, PackedLinear):
            desc = " ".join(f"{b}:{k}" for b, k in zip(select.BUCKETS, module.plan))
        elif getattr(module, "cpu_packed", None) is not None:
            desc = module.cpu_packed.kind
        else:
            continue
        found.setdefault(name.rsplit(".", 1)[-1].removeprefix("packed_"), {})[desc] = None
    return {kind: " | ".join(descs) for kind, descs in found.items()}
