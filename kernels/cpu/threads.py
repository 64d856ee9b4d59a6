"""The intra-op thread count of torch that follows from the CPUs this process may really use
(`hetero_infer/cpu_quota.py`), and its adaptation to the CPU the process gets while it runs.

A container's CPU limit (Kubernetes `resources.limits.cpu`, `docker run --cpus`) is a CFS quota, which neither
`os.cpu_count()` nor the affinity mask shows: torch would start one OpenMP thread per CPU of the node and, with
a few hundred parallel regions per decode step, spend most of each step throttled or waiting on threads that
are not running. So on the CPU the engine uses min(affinity, floor(quota)) threads unless the user chose a
count with OMP_NUM_THREADS (a smaller count set with torch.set_num_threads stays as it is).
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

from hetero_infer.cpu_quota import cgroup_cpu_limit, usable_cpus  # noqa: F401 (this module's API too)

log = logging.getLogger(__name__)


def configure_torch_threads(environ: dict[str, str] | os._Environ[str] = os.environ) -> int | None:
    """Cap torch's intra-op threads at `usable_cpus()` unless OMP_NUM_THREADS chooses the count. Returns the new
    count, or None if nothing changed."""
    import torch

    if environ.get("OMP_NUM_THREADS"):
        return None
    n = usable_cpus()
    if torch.get_num_threads() <= n:
        return None
    log.info("CPU quota: %d usable CPUs, torch threads %d -> %d (set OMP_NUM_THREADS to choose)",
             n, torch.get_num_threads(), n)
    torch.set_num_threads(n)
    return n


# -- adapting to a shared CPU ------------------------------------------------------------------------------
# A decode step runs a few hundred OpenMP parallel regions; each waits for its slowest thread. When another
# process holds one of our cores, that thread runs only part of the time and every region waits for it: two
# threads then run slower than one (on the dev box, one busy process beside the engine: bfloat16 134 tok/s
# with two threads, 366 with one). So the engine measures, while it runs, how much CPU it can really have (its
# own CPU time plus the idle time of its CPUs, from /proc/stat) and runs no more threads than that.

@dataclass(frozen=True)
class CpuSample:
    wall: float  # seconds (monotonic)
    own: float  # this process's CPU seconds, all threads
    idle: float | None  # idle seconds summed over this process's CPUs; None where /proc/stat is unreadable


def _read_idle(cpus: set[int], stat_text: str | None = None) -> float | None:
    """Idle + iowait seconds of `cpus` from /proc/stat (in USER_HZ ticks)."""
    try:
        text = stat_text if stat_text is not None else Path("/proc/stat").read_text()
    except OSError:
        return None
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total = 0
    found = False
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu" or not name[3:].isdigit() or int(name[3:]) not in cpus:
            continue
        fields = rest.split()
        total += int(fields[3]) + int(fields[4])
        found = True
    return total / hz if found else None


def sample(cpus: set[int] | None = None) -> CpuSample:
    if cpus is None:
        cpus = os.sched_getaffinity(0)
    return CpuSample(time.monotonic(), time.process_time(), _read_idle(cpus))


def available_cpus(before: CpuSample, after: CpuSample) -> float | None:
    """CPUs this process could have used between two samples: what it used plus what stayed idle."""
    wall = after.wall - before.wall
    if wall <= 0 or before.idle is None or after.idle is None:
        return None
    return max(0.0, (after.own - before.own) + (after.idle - before.idle)) / wall


def next_threads(current: int, most: int, available: float, calm: int, up_after: int = 2) -> tuple[int, int]:
    """(threads for the next interval, calm intervals counted): down at once to what is available (rounded
    to the nearest core, at least one); up one at a time, only after `up_after` intervals in a row had room."""
    target = min(most, max(1, math.floor(available + 0.25)))
    if target < current:
        return target, 0
    if target > current:
        calm += 1
        return (current + 1, 0) if calm >= up_after else (current, calm)
    return current, 0


_governed: tuple[int, int] | None = None  # (torch's count before a governor first changed it, the count set last)


def _set_threads(n: int) -> None:
    """torch.set_num_threads, remembering the count before the first change (see `base_threads`)."""
    import torch

    global _governed
    before = _governed[0] if _governed is not None and _governed[1] == torch.get_num_threads() else None
    _governed = (before if before is not None else torch.get_num_threads(), n)
    torch.set_num_threads(n)


def base_threads() -> int:
    """torch's thread count as the user or `configure_torch_threads` left it: a count a governor of an earlier
    engine in this process set is undone (so the next engine starts from the full count, not from 1)."""
    import torch

    now = torch.get_num_threads()
    return _governed[0] if _governed is not None and _governed[1] == now else now


class ThreadGovernor:
    """Keeps torch's (and the C kernels') thread count at what the CPUs can give this process, measured every
    `interval_s` of engine steps. HETERO_INFER_CPU_ADAPT=0 turns it off."""

    def __init__(self, most: int, interval_s: float = 0.25, read=sample, apply=None, clock=time.monotonic) -> None:
        self.most = most
        self.current = most
        self.interval_s = interval_s
        self._read = read
        self._clock = clock  # the clock of `read`'s wall: checked first, so most ticks read nothing
        self._apply = apply or _set_threads
        self._last = read()
        self._calm = 0
        self.changes = 0
        self.seen: dict[int, int] = {most: 0}  # thread count -> intervals run with it

    def tick(self) -> int | None:
        """Call before a step: a new thread count when it changed, else None. Reads /proc/stat only once the
        interval has passed (the read costs ~0.2 ms, a few percent of a one-row decode step)."""
        if self._clock() - self._last.wall < self.interval_s:
            return None
        now = self._read()
        if now.wall - self._last.wall < self.interval_s:
            return None
        avail = available_cpus(self._last, now)
        self._last = now
        self.seen[self.current] = self.seen.get(self.current, 0) + 1
        if avail is None:
            return None
        threads, self._calm = next_threads(self.current, self.most, avail, self._calm)
        if threads == self.current:
            return None
        log.debug("CPU available %.2f: threads %d -> %d", avail, self.current, threads)
        self.current = threads
        self.changes += 1
        self._apply(threads)
        return threads


def adapt_enabled(environ: dict[str, str] | os._Environ[str] = os.environ) -> bool:
    return environ.get("HETERO_INFER_CPU_ADAPT", "1") != "0"
