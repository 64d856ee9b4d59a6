"""How many CPUs this process may keep busy at once: its affinity mask capped by its cgroup's CPU quota.

A container's CPU limit (Kubernetes `resources.limits.cpu`, `docker run --cpus`) is a CFS quota, which neither
`os.cpu_count()` nor the affinity mask shows. Torch-free: the server asks this before it listens (one engine
process or a thread), and the engine sizes torch's threads from it (`kernels/cpu/threads.py`).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
_V1_CPU_MOUNTS = ("cpu", "cpu,cpuacct", "cpuacct,cpu")


def _own_cgroups(proc_cgroup: str) -> tuple[str | None, str | None]:
    """(cgroup v2 path, cgroup v1 cpu controller path) of this process, from /proc/self/cgroup's text."""
    v2 = v1 = None
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            v2 = path
        elif "cpu" in controllers.split(","):
            v1 = path
    return v2, v1


def _candidates(mount: Path, path: str | None) -> list[Path]:
    """The process's cgroup directory and its ancestors, innermost first; inside a container the path in
    /proc/self/cgroup can be the host's while the mount shows the container's own cgroup at its root."""
    dirs: list[Path] = []
    if path:
        d = mount / path.lstrip("/")
        if d.is_dir():
            while d != mount and mount in d.parents:
                dirs.append(d)
                d = d.parent
    dirs.append(mount)
    return dirs


def _quota_v2(directory: Path) -> float | None:
    try:
        quota, period = (directory / "cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    return int(quota) / int(period)


def _quota_v1(directory: Path) -> float | None:
    try:
        quota = int((directory / "cpu.cfs_quota_us").read_text())
        period = int((directory / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    if quota <= 0 or period <= 0:
        return None
    return quota / period


def cgroup_cpu_limit(root: Path = CGROUP_ROOT, proc_cgroup: str | None = None) -> float | None:
    """The CPU quota of this process's cgroup (the smallest along its ancestors) in CPUs, or None if unlimited."""
    if proc_cgroup is None:
        try:
            proc_cgroup = Path("/proc/self/cgroup").read_text()
        except OSError:
            proc_cgroup = ""
    v2, v1 = _own_cgroups(proc_cgroup)
    limits: list[float] = []
    if (root / "cgroup.controllers").exists():  # unified hierarchy mounted at the root
        limits += [q for d in _candidates(root, v2) if (q := _quota_v2(d)) is not None]
    else:
        for name in _V1_CPU_MOUNTS:
            mount = root / name
            if mount.is_dir():
                limits += [q for d in _candidates(mount, v1) if (q := _quota_v1(d)) is not None]
                break
        unified = root / "unified"
        if not limits and v2 is not None and unified.is_dir():
            limits += [q for d in _candidates(unified, v2) if (q := _quota_v2(d)) is not None]
    return min(limits) if limits else None


def usable_cpus(limit: float | None = None, affinity: int | None = None) -> int:
    """CPUs this process may keep busy at once: its affinity mask, capped by the cgroup quota (rounded down,
    at least 1). Without arguments both are read from the system."""
    if affinity is None:
        try:
            affinity = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            affinity = os.cpu_count() or 1
    if limit is None:
        limit = cgroup_cpu_limit()
    if limit is not None:
        affinity = min(affinity, max(1, math.floor(limit)))
    return max(1, affinity)
