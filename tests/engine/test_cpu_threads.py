"""CPU quota detection (cgroup v1 and v2, on fake cgroup trees) and the torch thread cap that follows from it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hetero_infer.kernels.cpu.threads import cgroup_cpu_limit, usable_cpus


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_v2_quota_of_own_cgroup_and_ancestors(tmp_path: Path) -> None:
    _write(tmp_path / "cgroup.controllers", "cpu memory\n")
    _write(tmp_path / "cpu.max", "max 100000\n")
    _write(tmp_path / "kubepods" / "cpu.max", "800000 100000\n")
    _write(tmp_path / "kubepods" / "pod1" / "cpu.max", "250000 100000\n")
    assert cgroup_cpu_limit(tmp_path, "0::/kubepods/pod1\n") == 2.5
    _write(tmp_path / "kubepods" / "pod1" / "cpu.max", "max 100000\n")
    assert cgroup_cpu_limit(tmp_path, "0::/kubepods/pod1\n") == 8.0  # the parent's limit still applies


def test_v2_unlimited_and_container_view(tmp_path: Path) -> None:
    _write(tmp_path / "cgroup.controllers", "cpu\n")
    _write(tmp_path / "cpu.max", "max 100000\n")
    assert cgroup_cpu_limit(tmp_path, "0::/\n") is None
    # In a container the path is the host's, the mount shows the container's own cgroup at its root.
    _write(tmp_path / "cpu.max", "150000 100000\n")
    assert cgroup_cpu_limit(tmp_path, "0::/kubepods/burstable/pod9/abc\n") == 1.5


def test_v1_cpu_controller(tmp_path: Path) -> None:
    _write(tmp_path / "cpu,cpuacct" / "docker" / "c1" / "cpu.cfs_quota_us", "300000\n")
    _write(tmp_path / "cpu,cpuacct" / "docker" / "c1" / "cpu.cfs_period_us", "100000\n")
    _write(tmp_path / "cpu,cpuacct" / "cpu.cfs_quota_us", "-1\n")
    _write(tmp_path / "cpu,cpuacct" / "cpu.cfs_period_us", "100000\n")
    proc = "12:memory:/docker/c1\n4:cpu,cpuacct:/docker/c1\n0::/\n"
    assert cgroup_cpu_limit(tmp_path, proc) == 3.0
    assert cgroup_cpu_limit(tmp_path, "4:cpu,cpuacct:/\n") is None


def test_no_cgroup_files(tmp_path: Path) -> None:
    assert cgroup_cpu_limit(tmp_path, "") is None
    assert cgroup_cpu_limit(tmp_path / "missing", "0::/x\n") is None


@pytest.mark.parametrize(("limit", "affinity", "expected"), [
    (None, 8, 8), (2.5, 8, 2), (0.5, 8, 1), (16.0, 4, 4), (4.0, 4, 4),
])
def test_usable_cpus(limit: float | None, affinity: int, expected: int) -> None:
    assert usable_cpus(limit, affinity) == expected


def _threads_after_configure(env_threads: str | None, torch_threads: int) -> str:
    code = (
        "import torch\n"
        f"torch.set_num_threads({torch_threads})\n"
        "from hetero_infer.kernels.cpu import threads as cpu_threads\n"
        "cpu_threads.usable_cpus = lambda limit=None, affinity=None: 1\n"  # a 1-CPU quota
        "cpu_threads.configure_torch_threads()\n"
        "print(torch.get_num_threads())\n"
    )
    env = {"PATH": "/usr/bin:/bin"}
    if env_threads is not None:
        env["OMP_NUM_THREADS"] = env_threads
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_configure_caps_torch_threads_unless_omp_num_threads_is_set() -> None:
    assert _threads_after_configure(None, 3) == "1"
    assert _threads_after_configure("3", 3) == "3"  # the user's choice stands
