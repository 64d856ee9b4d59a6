"""CPU quota detection (cgroup v1 and v2, on fake cgroup trees), the torch thread cap that follows from it, and
the thread governor that adapts the count to what a shared CPU gives the process while it runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hetero_infer.kernels.cpu import threads as cpu_threads
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


# -- the thread governor (shared CPUs) ----------------------------------------------------------------------

STAT = """cpu  900 0 100 5000 20 0 0 0 0 0
cpu0 400 0 50 2000 10 0 0 0 0 0
cpu1 500 0 50 3000 10 0 0 5 0 0
cpu2 0 0 0 7 0 0 0 0 0 0
intr 1 2 3
"""


def test_idle_of_own_cpus_from_proc_stat():
    hz = os.sysconf("SC_CLK_TCK")
    assert cpu_threads._read_idle({0, 1}, STAT) == (2010 + 3010) / hz  # idle + iowait, not steal
    assert cpu_threads._read_idle({1}, STAT) == 3010 / hz
    assert cpu_threads._read_idle({7}, STAT) is None


def test_available_cpus_is_own_use_plus_idle():
    a = cpu_threads.CpuSample(wall=10.0, own=3.0, idle=100.0)
    assert cpu_threads.available_cpus(a, cpu_threads.CpuSample(10.5, 3.5, 100.5)) == pytest.approx(2.0)
    # two threads of ours beside a busy process on two cores: we got 2/3 of each core, nothing idle
    assert cpu_threads.available_cpus(a, cpu_threads.CpuSample(11.0, 4.333, 100.0)) == pytest.approx(1.333)
    assert cpu_threads.available_cpus(a, cpu_threads.CpuSample(11.0, 4.0, None)) is None
    assert cpu_threads.available_cpus(a, a) is None


def test_next_threads_down_at_once_up_after_calm_intervals():
    assert cpu_threads.next_threads(2, 2, 1.33, 0) == (1, 0)
    assert cpu_threads.next_threads(2, 2, 0.2, 0) == (1, 0)  # never below one
    assert cpu_threads.next_threads(1, 2, 1.9, 0) == (1, 1)  # room once: wait
    assert cpu_threads.next_threads(1, 2, 1.9, 1) == (2, 0)  # twice in a row: one more thread
    assert cpu_threads.next_threads(1, 2, 1.9, 1, up_after=3) == (1, 2)
    assert cpu_threads.next_threads(2, 2, 5.0, 0) == (2, 0)  # never above the quota's count
    assert cpu_threads.next_threads(1, 8, 7.9, 5) == (2, 0)  # up one at a time
    assert cpu_threads.next_threads(1, 2, 1.9, 1)[0] == 2 and cpu_threads.next_threads(2, 2, 1.8, 0) == (2, 0)


def test_governor_follows_a_busy_neighbour_that_comes_and_goes():
    """Fake samples every 0.3 s: quiet (all we use + idle = 2 CPUs), a busy neighbour (we get 1.33, nothing
    idle), then quiet again."""
    samples = iter([
        cpu_threads.CpuSample(0.0, 0.0, 0.0),
        cpu_threads.CpuSample(0.1, 0.2, 0.0),  # under the interval: ignored
        cpu_threads.CpuSample(0.3, 0.6, 0.0),  # quiet, 2 threads busy
        cpu_threads.CpuSample(0.6, 1.0, 0.0),  # neighbour: 1.33 CPUs for us
        cpu_threads.CpuSample(0.9, 1.3, 0.0),  # one thread, one core for us, none idle
        cpu_threads.CpuSample(1.2, 1.6, 0.3),  # neighbour gone: 1 used + 1 idle
        cpu_threads.CpuSample(1.5, 1.9, 0.6),
        cpu_threads.CpuSample(1.8, 2.5, 0.6),
    ])
    applied: list[int] = []
    gov = cpu_threads.ThreadGovernor(2, interval_s=0.25, read=lambda: next(samples), apply=applied.append)
    assert [gov.tick() for _ in range(7)] == [None, None, 1, None, None, 2, None]
    assert applied == [1, 2] and gov.current == 2 and gov.changes == 2


def test_governor_reads_the_counters_only_after_its_interval_and_still_reacts_at_it():
    """A tick under the interval reads no /proc/stat (a clock check only); the first tick past it reads and
    acts: a neighbour that takes a core from t=0.5 s is answered at the tick of t=0.75 s."""
    now = [0.0]
    reads: list[float] = []

    def read() -> cpu_threads.CpuSample:
        t = now[0]
        reads.append(t)
        own = 2 * t if t <= 0.5 else 1.0 + (t - 0.5)  # two CPUs, then one
        return cpu_threads.CpuSample(t, own, 0.0)

    applied: list[int] = []
    gov = cpu_threads.ThreadGovernor(2, interval_s=0.25, read=read, apply=applied.append, clock=lambda: now[0])
    results = []
    for i in range(1, 7):  # ticks every 0.125 s
        now[0] = i * 0.125
        results.append(gov.tick())
    assert reads == [0.0, 0.25, 0.5, 0.75]
    assert results == [None, None, None, None, None, 1] and applied == [1]


def test_sample_reads_this_machine():
    before = cpu_threads.sample()
    sum(i * i for i in range(300_000))
    after = cpu_threads.sample()
    assert before.idle is not None and after.idle is not None and after.idle >= before.idle
    assert after.own > before.own and after.wall > before.wall
    assert 0 <= cpu_threads.available_cpus(before, after) <= len(os.sched_getaffinity(0)) + 0.5


def test_next_engine_starts_from_the_count_before_the_governor(monkeypatch):
    torch = pytest.importorskip("torch")
    start = torch.get_num_threads()
    monkeypatch.setattr(cpu_threads, "_governed", None)
    try:
        torch.set_num_threads(3)
        cpu_threads._set_threads(1)  # a governor went down to one thread
        assert torch.get_num_threads() == 1 and cpu_threads.base_threads() == 3
        cpu_threads._set_threads(2)
        assert cpu_threads.base_threads() == 3
        torch.set_num_threads(2)  # someone else chose a count since: that one stands
        cpu_threads._governed = (3, 1)
        assert cpu_threads.base_threads() == 2
    finally:
        torch.set_num_threads(start)
