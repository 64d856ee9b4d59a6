"""The Triton kernels compile for NVIDIA GPUs (ahead of time, no GPU needed).

Triton's CPU interpreter does not apply the compiler's type and layout rules, so a kernel
can pass every interpreter test and still fail to build for a GPU. This compiles one
variant of every kernel for Ampere (sm_80) and Hopper (sm_90) with the installed Triton
and fails on a compile error (or, for Hopper, a register spill). The full matrix (all dtypes and head
sizes) is ``python tests/kernels/compile_check.py`` (marked slow here).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    return subprocess.run(
        [sys.executable, os.path.join(HERE, "compile_check.py"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )


@pytest.mark.parametrize("arch", ["90", "80"])
def test_kernels_compile_for_gpu(arch):
    # the tile choices are tuned for Hopper: no spills allowed there; Ampere must compile
    res = _run("--quick", "--arch", arch, *(["--no-spills"] if arch == "90" else []))
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    m = re.search(r"compiled (\d+)/(\d+) kernel variants", res.stdout)
    assert m and m.group(1) == m.group(2) and int(m.group(2)) >= 13, res.stdout[-2000:]


@pytest.mark.slow
def test_all_kernel_variants_compile_sm90():
    res = _run("--arch", "90")
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]


_PREFILL = re.compile(r"_prefill_kernel\[.*BLOCK_M=(\d+),BLOCK_N=(\d+),USE_WINDOW=(\w+).*'num_warps': (\d+), "
                      r"'num_stages': (\d+)\} REG=\d+ STACK=(\d+) SHARED=\d+ LOCAL=(\d+) smem=(\d+)")


def _prefill_grid(*args: str) -> dict[tuple, tuple[int, bool]]:
    """compile_check --prefill-grid for sm_90: {(BLOCK_M, BLOCK_N, window, num_warps, num_stages): (shared bytes,
    spilled)}."""
    res = _run("--prefill-grid", "--verbose", "--arch", "90", *args)
    found = {}
    for m in _PREFILL.finditer(res.stdout):
        bm, bn, window, warps, stages, stack, local, smem = m.groups()
        found[(int(bm), int(bn), window == "True", int(warps), int(stages))] = (int(smem), stack != "0" or local != "0")
    assert found, res.stdout[-4000:] + res.stderr[-4000:]
    return found


def _tune_kernels():
    import importlib.util

    path = os.path.join(HERE, "..", "..", "benchmarks", "tune_kernels.py")
    spec = importlib.util.spec_from_file_location("tune_kernels_for_compile_test", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def _shared_estimate(tk, bm: int, bn: int, stages: int) -> int:
    import torch

    return tk.prefill_shared_bytes({"BLOCK_M": bm, "BLOCK_N": bn, "num_stages": stages}, 128, torch.bfloat16)


def test_prefill_kv_tiles_are_multibuffered_sm90():
    """The prefill's block-table entries are loaded a tile ahead, so each stage past the first buys one more K/V
    tile pair in flight (2 x 64 x 128 bf16 = 32 KiB at the built-in 128 x 64 tiles): with the entries loaded in
    the K/V's own iteration, 2, 3 and 4 stages all compiled to 96 KiB. No spills; the tuner's estimate holds."""
    found = _prefill_grid("--quick")
    smem = [found[(128, 64, False, 8, s)][0] for s in (2, 3, 4)]
    assert smem[1] - smem[0] == smem[2] - smem[1] == 32 * 1024, smem
    assert not any(spilled for _, spilled in found.values()), found
    tk = _tune_kernels()
    for s, got in zip((2, 3, 4), smem, strict=True):
        assert abs(got - _shared_estimate(tk, 128, 64, s)) <= 1024, (s, got)


@pytest.mark.slow
def test_prefill_tuning_grid_sm90():
    """Every config of the tuner's prefill grid: its shared-memory estimate within 1 KiB of the compiler's, and
    every config that spills is one the tuner skips as spilling."""
    found = _prefill_grid()
    tk = _tune_kernels()
    for (bm, bn, window, warps, stages), (smem, spilled) in found.items():
        assert abs(smem - _shared_estimate(tk, bm, bn, stages)) <= 1024, (bm, bn, window, warps, stages, smem)
        cfg = {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": warps, "num_stages": stages}
        assert not spilled or tk.spills("prefill", cfg), cfg
