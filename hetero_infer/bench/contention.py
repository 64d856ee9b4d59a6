"""Other work on the same CPUs during a benchmark run (`hetero-infer bench --contention`), the same for every
system measured: started before each system's run and stopped after it.

- none: nothing.
- steady: one process spinning on one core for the whole run (a busy neighbour).
- bursty: one spinning process per usable CPU, all busy for `on_s` then idle for `off_s`, phased on the wall
  clock (another service whose requests come and go).

The busy processes are plain Python loops (no torch, no memory traffic): they take CPU time and nothing else.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from hetero_infer.kernels.cpu.threads import usable_cpus

MODES = ("none", "steady", "bursty")

_SPIN = "while True:\n    pass\n"
_BURST = """
import time
on, off = {on}, {off}
period = on + off
while True:
    phase = time.time() % period
    if phase < on:
        end = time.time() + (on - phase)
        while time.time() < end:
            pass
    else:
        time.sleep(period - phase)
"""


def commands(mode: str, on_s: float = 1.0, off_s: float = 1.0, cpus: int | None = None) -> list[list[str]]:
    """The busy processes of `mode`, as argument lists."""
    if mode == "none":
        return []
    if mode == "steady":
        return [[sys.executable, "-c", _SPIN]]
    if mode == "bursty":
        code = _BURST.format(on=float(on_s), off=float(off_s))
        return [[sys.executable, "-c", code] for _ in range(cpus or usable_cpus())]
    raise ValueError(f"unknown contention {mode!r} (one of {', '.join(MODES)})")


@contextmanager
def contention(mode: str, on_s: float = 1.0, off_s: float = 1.0) -> Iterator[list[subprocess.Popen]]:
    """Run the busy processes of `mode` for the duration of the block; they are killed and reaped after it."""
    procs = [subprocess.Popen(cmd, stdin=subprocess.DEVNULL) for cmd in commands(mode, on_s, off_s)]
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
