"""The AVX2 + FMA level of the CPU kernels (HETERO_INFER_CPU_ISA=avx2: -march=x86-64-v3, the library an AVX2-only
CPU builds for itself), on any CPU that has AVX2: every kernel of that level is built, and the kernel tests pass
against their references there (float64 for the GEMMs, PyTorch for the fused ops, the per-op path bit for bit for
the fused decode step). On an AVX2-only CI machine the rest of the suite runs these kernels natively as well; on
an AVX-512 one only this file does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hetero_infer.kernels.cpu import native

HERE = Path(__file__).parent
ROOT = HERE.parent.parent

pytestmark = pytest.mark.skipif(not {"avx2", "fma"} <= native.cpu_flags(),
                                reason="this CPU has no AVX2 + FMA, so it cannot run that level's kernels")

PROBE = """
import json, torch
from hetero_infer.kernels.cpu import decode_step, linear, native, paged_attention
print(json.dumps({"isa": native.isa(), "march": native._march(), "gemm_f32": linear._gemm_f32() is not None,
                  "gemm_bf16": linear._gemm_bf16() is not None, "quantized": linear.quantized_gemm_available(),
                  "step_f32": decode_step.available(torch.float32), "step_bf16": decode_step.available(torch.bfloat16),
                  "attention": paged_attention.variant()}))
"""


def _env() -> dict[str, str]:
    env = {**os.environ, "HETERO_INFER_CPU_ISA": "avx2"}
    env.pop("HETERO_INFER_CPU_MARCH", None)  # a named target would override the level
    return env


def _pytest(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", *args],
                          env=_env(), capture_output=True, text=True, timeout=900, cwd=ROOT)


def _assert_all_passed(proc: subprocess.CompletedProcess, at_least: int) -> None:
    """The run passed, ran at least `at_least` tests and skipped none (a skip would hide a missing kernel)."""
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    passed = int(summary.split(" passed")[0].split()[-1]) if " passed" in summary else 0
    assert passed >= at_least and "skipped" not in summary, summary


def test_avx2_level_builds_every_kernel():
    probe = subprocess.run([sys.executable, "-c", PROBE], env=_env(), capture_output=True, text=True, timeout=300)
    assert probe.returncode == 0, probe.stderr[-2000:]
    found = json.loads(probe.stdout.strip().splitlines()[-1])
    assert found == {"isa": "avx2", "march": "-march=x86-64-v3", "gemm_f32": True, "gemm_bf16": True,
                     "quantized": True, "step_f32": True, "step_bf16": True, "attention": "avx2"}


def test_avx2_gemms_and_ops_pass_their_tests():
    """The float32 and bfloat16 GEMMs against float64 (every tile and tail, 1-3 threads), the INT8 / INT4 linears
    against theirs, silu * up and the norms against PyTorch, all at the AVX2 level."""
    proc = _pytest(str(ROOT / "tests/kernels/test_kernel_gemm_f32.py"), str(ROOT / "tests/kernels/test_kernel_gemm_bf16.py"),
                   str(HERE / "test_cpu_linear.py"), str(HERE / "test_cpu_ops.py"))
    _assert_all_passed(proc, at_least=170)


def test_avx2_moe_decode_kernel_equals_the_grouped_path():
    """The MoE experts' C kernel (kernels/cpu/moe.py) at the AVX2 level: both dtypes against the grouped GEMM."""
    proc = _pytest(str(ROOT / "tests/kernels/test_kernel_moe.py"), "-k", "cpu_decode_kernel")
    _assert_all_passed(proc, at_least=8)


def test_avx2_paged_attention_against_float64():
    """The AVX2 attention kernel (D = 40, 64, 128; GQA 1-8; blocks of 16) against float64, and the CPU backend's
    mixed decode / prefill / SDPA step against the reference backend (the whole file under -m slow)."""
    proc = _pytest(str(HERE / "test_cpu_paged_attention.py"), "-k", "(matches_float64_reference and -16-) or mixed_step")
    _assert_all_passed(proc, at_least=40)


def test_avx2_fused_decode_step_equals_the_per_op_path():
    """Both dtypes' fused steps at the AVX2 level, bit for bit the per-op path's logits (one model shape, 1-37
    rows; the whole file under -m slow: test_avx2_fused_step_file)."""
    proc = _pytest(str(HERE / "test_cpu_fused_step.py"), "-k",
                   "built_wherever or (every_row_count and llama-hd64-2)")
    _assert_all_passed(proc, at_least=3)


def test_avx2_lora_in_the_fused_step():
    """The C LoRA row kernels against float64 and LoRA adapters inside the fused step (float32 tokens against
    transformers + peft; both dtypes against the per-op path with the LoRA hooks), at the AVX2 level."""
    proc = _pytest(str(ROOT / "tests/kernels/test_kernel_lora_cpu.py"), str(ROOT / "tests/lora/test_lora_fused_cpu.py"))
    _assert_all_passed(proc, at_least=32)


@pytest.mark.slow  # ~3 min: every model shape and thread count of the fused step, and the paged attention
def test_avx2_fused_step_file():
    proc = _pytest(str(HERE / "test_cpu_fused_step.py"), str(HERE / "test_cpu_paged_attention.py"))
    _assert_all_passed(proc, at_least=100)
