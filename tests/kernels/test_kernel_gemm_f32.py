"""The project's float32 GEMM (kernels/cpu/csrc/gemm_f32.c, candidate "gemm_f32") against float64 on shapes that
are not multiples of its tile (8 rows x 48 columns, passes of rows), one and two threads; and its place among
the measured candidates: chosen when it times fastest, cached choices made before it existed measured again,
HETERO_INFER_CPU_LINEAR restricting the choice."""

from __future__ import annotations

import os

import pytest
import torch

from hetero_infer.kernels.cpu import linear as cpu_linear
from hetero_infer.kernels.cpu import native, select

# Skipped only without AVX-512F: test_gemm_f32_runs_where_the_build_has_avx512f (not skipped) fails where the CPU
# has it and the kernel is missing.
needs_gemm_f32 = pytest.mark.skipif(cpu_linear._gemm_f32() is None,
                                    reason="no AVX-512F or AVX2 + FMA build of the C kernels")

# (rows, in K, out N): rows across the micro-kernels' 8/4/2/1 groups, N across masked 16-column vectors of a
# 48-column panel, K = 3000 and 1536 past one pass of rows (PASS_BYTES / 4K rows: 32 and 64)
CASES = [(1, 1, 1), (1, 17, 24), (2, 5, 47), (3, 131, 72), (5, 64, 49), (7, 33, 96), (8, 576, 960),
         (9, 65, 97), (15, 7, 145), (17, 200, 33), (32, 576, 576), (33, 96, 200), (70, 3000, 50),
         (130, 1536, 130)]


def _reference(rows: int, k: int, n: int, bias: bool):
    gen = torch.Generator().manual_seed(rows * 7919 + k * 31 + n)
    w, x = torch.randn(n, k, generator=gen), torch.randn(rows, k, generator=gen)
    b = torch.randn(n, generator=gen) if bias else None
    return w, x, b, x.double() @ w.double().T + (b.double() if bias else 0)


@needs_gemm_f32
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows,k,n", CASES)
def test_gemm_f32_against_float64(rows, k, n, bias, threads):
    w, x, b, ref = _reference(rows, k, n, bias)
    packed = cpu_linear.pack_as("gemm_f32", w)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = cpu_linear.packed_linear(x, packed, b)
        out3 = cpu_linear.packed_linear(x.view(1, rows, k), packed, b)
    finally:
        torch.set_num_threads(before)
    assert out.dtype == torch.float32 and out.shape == (rows, n) and out3.shape == (1, rows, n)
    # float32 sums of float32 products: error ~ eps * sqrt(K) times the terms' size
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=2e-6 * k**0.5 * 4)
    assert torch.equal(out3.view(rows, n), out)


@needs_gemm_f32
def test_gemm_f32_zero_rows_and_layout():
    w = torch.randn(50, 9)
    packed = cpu_linear.pack_as("gemm_f32", w)
    panel = cpu_linear._f32_panel()
    full = 50 // panel  # 50 columns -> whole panels (one of 48 with AVX-512, three of 16 with AVX2), then a part
    assert packed.data.shape == (full + 1, 9, panel)
    for p in range(full):
        assert torch.equal(packed.data[p], w[p * panel : (p + 1) * panel].T)
    assert torch.equal(packed.data[full, :, : 50 - full * panel], w[full * panel :].T)
    assert not packed.data[full, :, 50 - full * panel :].any()  # zero past column 50
    assert cpu_linear.packed_linear(torch.empty(0, 9), packed, None).shape == (0, 50)


def test_gemm_f32_runs_where_the_build_has_avx512f():
    built = native.library() is not None and os.environ.get("HETERO_INFER_CPU_MARCH", "native") == "native"
    if built:  # AVX-512F, or AVX2 + FMA (the level HETERO_INFER_CPU_ISA may force: both need the CPU's flags)
        flags = native.cpu_flags()
        level = native.isa_request()
        expected = level != "portable" and ("avx512f" in flags or {"avx2", "fma"} <= flags)
        assert (cpu_linear._gemm_f32() is not None) == expected
    w = torch.randn(4, 4)
    assert "gemm_f32" in cpu_linear.CANDIDATES[torch.float32]
    assert (cpu_linear.unsupported("gemm_f32", w) is None) == (cpu_linear._gemm_f32() is not None)
    assert cpu_linear.unsupported("gemm_f32", w.to(torch.bfloat16)) is not None  # float32 weights only


KEY = select.MachineKey("AMD EPYC", "abc", 1, "2.13.0+cpu", "0.1.0", "deadbeef")


def _fake_timer(fast: str, monkeypatch):
    """A timer that says `fast` takes 1 ms and every other kernel 2 ms (the kernel is read off the call)."""
    called: list[str] = []
    real = cpu_linear.packed_linear

    def spy(x, packed, bias):
        called.append(packed.kind)
        return real(x, packed, bias)

    monkeypatch.setattr(cpu_linear, "packed_linear", spy)

    def timer(fn):
        fn()
        return 1e-3 if called[-1] == fast else 2e-3

    return timer, called


@needs_gemm_f32
def test_selector_times_gemm_f32_and_keeps_it_when_fastest(tmp_path, monkeypatch):
    timer, called = _fake_timer("gemm_f32", monkeypatch)
    selector = cpu_linear.LinearSelector(select.ChoiceCache(tmp_path, KEY), timer=timer)
    weight = torch.randn(40, 24)
    assert selector.plan(weight) == ("gemm_f32",) * len(select.BUCKETS)
    assert {"gemm_f32", "onednn", "torch"} <= set(called) or not cpu_linear.available()
    layer = cpu_linear.PackedLinear(weight, None, selector.plan(weight))
    assert cpu_linear.paths_by_layer(torch.nn.Sequential(layer)) == {"0": " ".join(
        f"{b}:gemm_f32" for b in select.BUCKETS)}
    # slower than oneDNN: not chosen
    timer, _ = _fake_timer("onednn", monkeypatch)
    other = cpu_linear.LinearSelector(select.ChoiceCache(tmp_path / "b", KEY), timer=timer)
    assert "gemm_f32" not in other.plan(weight)


@needs_gemm_f32
def test_selector_measures_again_a_choice_cached_before_gemm_f32(tmp_path, monkeypatch):
    entry = "linear:float32:40x24"
    old = [{"onednn": 1e-3, "torch": 2e-3}] * len(select.BUCKETS)  # the cache of a build without gemm_f32
    select.ChoiceCache(tmp_path, KEY).put(entry, ("onednn",) * len(select.BUCKETS), old)
    timer, _ = _fake_timer("gemm_f32", monkeypatch)
    selector = cpu_linear.LinearSelector(select.ChoiceCache(tmp_path, KEY), timer=timer)
    assert selector.plan(torch.randn(40, 24)) == ("gemm_f32",) * len(select.BUCKETS)
    assert selector.measured == 1
    again = cpu_linear.LinearSelector(select.ChoiceCache(tmp_path, KEY), timer=timer)
    assert again.plan(torch.randn(40, 24)) == ("gemm_f32",) * len(select.BUCKETS) and again.measured == 0


@needs_gemm_f32
def test_cpu_linear_env_restricts_the_choice(tmp_path, monkeypatch):
    timer, _ = _fake_timer("gemm_f32", monkeypatch)
    weight = torch.randn(40, 24)
    monkeypatch.setenv("HETERO_INFER_CPU_LINEAR", "onednn,torch")  # leave the fastest out
    restricted = cpu_linear.LinearSelector(select.ChoiceCache(tmp_path, KEY), timer=timer)
    assert "gemm_f32" not in restricted.plan(weight)
    monkeypatch.delenv("HETERO_INFER_CPU_LINEAR")  # the timings cached above included it: no new measurement
    free = cpu_linear.LinearSelector(select.ChoiceCache(tmp_path, KEY), timer=timer)
    assert free.plan(weight) == ("gemm_f32",) * len(select.BUCKETS) and free.measured == 0
    monkeypatch.setenv("HETERO_INFER_CPU_LINEAR", "gemm_f32")  # forced, also without measuring
    assert cpu_linear.default_kind(weight) == "gemm_f32"
    assert cpu_linear.PackedLinear(weight).plan == ("gemm_f32",) * len(select.BUCKETS)
