"""benchmarks/cpu_speed_probe.py: one row per usable CPU, each sample a positive time."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_cpu_speed_probe_samples_every_cpu() -> None:
    res = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "cpu_speed_probe.py"), "--seconds", "0.3",
                          "--loop", "20000"], capture_output=True, text=True, timeout=120, check=True)
    rows = [line.split("|")[1:-1] for line in res.stdout.splitlines() if line.startswith("| ") and "CPU" not in line]
    assert sorted(int(r[0]) for r in rows) == sorted(os.sched_getaffinity(0))
    for r in rows:
        samples, fastest, median = int(r[1]), float(r[2]), float(r[4])
        assert samples >= 1 and 0 < fastest <= median
