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
