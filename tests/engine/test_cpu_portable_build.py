"""The CPU kernels' portable C paths, built without AVX-512 (what a CPU without it runs), pass the same tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.mark.slow  # a second build of the CPU kernels and their whole test file (~100 s); the docker suite builds them too
def test_portable_build_passes_the_kernel_tests(tmp_path):
    env = {**os.environ, "HETERO_INFER_CPU_MARCH": "x86-64-v2", "HETERO_INFER_CACHE": str(tmp_path)}
    probe = subprocess.run(
        [sys.executable, "-c", "from hetero_infer.kernels.cpu import paged_attention as c; "
         "assert c.available(); print(c.variant())"], env=env, capture_output=True, text=True, timeout=300)
    assert probe.returncode == 0 and probe.stdout.strip() == "portable", probe.stderr[-2000:]
    tests = [str(HERE / name) for name in ("test_cpu_ops.py", "test_cpu_paged_attention.py", "test_cpu_linear.py")]
    tests.append(str(HERE.parent / "kernels" / "test_kernel_moe.py") + "::test_cpu_decode_kernel_is_the_grouped_path_within_rounding")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests], env=env,
                          capture_output=True, text=True, timeout=600, cwd=HERE.parent.parent)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
