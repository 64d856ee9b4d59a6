"""benchmarks/kernels_bench.py runs end to end (tiny shapes, CPU interpreter)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow  # the kernel benchmark script end to end (~35 s)
def test_kernels_bench_smoke(tmp_path):
    out = tmp_path / "bench.json"
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    res = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "kernels_bench.py"), "--smoke", "--json", str(out),
         "--only", "decode", "prefill", "quant", "layers", "tune"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    data = json.loads(out.read_text())
    assert set(data["sections"]) >= {"decode", "decode_plan", "prefill", "quant", "layers", "topk", "tune"}
    for row in data["sections"]["decode"]["rows"] + data["sections"]["decode_plan"]["rows"]:
        assert float(row[-1]) < 2e-2  # the benchmarked kernel agrees with the reference
    prefill = data["sections"]["prefill"]["rows"]  # the built-in schedule beside the old K/V one, both right
    assert {row[2] for row in prefill} >= {"built-in", "2 stages (old K/V)"}
    for row in prefill:
        assert float(row[-1]) < 2e-2
