"""A bfloat16 engine on a CPU whose bfloat16 matmuls are slow (no AVX512_BF16 or AMX: PyTorch's fallback ran at
1 GFLOP/s against 125 in float32 on the 2-vCPU AVX2 AMD EPYC) says so at start-up, with the option that serves
faster; float32 engines, and bfloat16 on CPUs that run it well, say nothing."""

from __future__ import annotations

import logging
import math

import pytest

from hetero_infer import LLM
from hetero_infer.kernels.cpu import linear as cpu_linear


def test_the_slowdown_is_measured() -> None:
    slowdown = cpu_linear.bfloat16_slowdown(rows=8, size=128, repeats=1)
    assert math.isfinite(slowdown) and slowdown > 0


def test_the_warning_names_the_slowdown_and_the_option() -> None:
    assert cpu_linear.bfloat16_warning(1.0) is None and cpu_linear.bfloat16_warning(2.0) is None
    text = cpu_linear.bfloat16_warning(72.4)
    assert "72x slower than float32" in text and "--dtype float32" in text


@pytest.mark.parametrize("dtype,slowdown,own_gemm,warned", [("bfloat16", 72.0, False, True),
                                                             ("bfloat16", 0.8, False, False),
                                                             ("float32", 72.0, False, False),
                                                             ("bfloat16", 72.0, True, False)])
def test_an_engine_warns_only_in_slow_bfloat16(tiny_model, monkeypatch, caplog, dtype, slowdown, own_gemm,
                                               warned) -> None:
    """Not where the project's bfloat16 GEMM runs (AVX512_BF16 or AVX2 + FMA): the linears do not fall back to
    PyTorch's bfloat16 matmul there."""
    folder, _ = tiny_model("llama")
    monkeypatch.setattr(cpu_linear, "bfloat16_slowdown", lambda: slowdown)
    monkeypatch.setattr(cpu_linear, "own_bfloat16_gemm", lambda: own_gemm)
    with caplog.at_level(logging.WARNING, logger="hetero_infer.worker.runner.executor"):
        LLM(str(folder), device="cpu", dtype=dtype, max_num_blocks=16)
    said = [r.getMessage() for r in caplog.records if "bfloat16 matmuls run" in r.getMessage()]
    assert len(said) == int(warned), said
