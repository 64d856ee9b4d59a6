"""`hetero-infer bench --contention`: the busy processes start, burn CPU, and are gone after the block."""

from __future__ import annotations

import os
import time

import pytest

from hetero_infer.bench import contention


def _cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def test_commands_per_mode():
    assert contention.commands("none") == []
    assert len(contention.commands("steady")) == 1
    assert len(contention.commands("bursty", cpus=3)) == 3
    with pytest.raises(ValueError):
        contention.commands("heavy")


@pytest.mark.parametrize("mode", ["steady", "bursty"])
def test_busy_processes_burn_cpu_and_stop(mode):
    with contention.contention(mode, on_s=0.3, off_s=0.3) as procs:
        assert procs
        deadline = time.monotonic() + 60
        while not all(_cpu_seconds(p.pid) >= 0.1 for p in procs):  # a busy machine may start them late
            assert time.monotonic() < deadline, "the busy processes never ran"
            assert all(p.poll() is None for p in procs)
            time.sleep(0.05)
    assert all(p.poll() is not None for p in procs)


def _state(pid: int) -> str:
    return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]


def test_bursty_rests_between_bursts_steady_never_does():
    """A bursty process sleeps between bursts (state S in /proc); a steady one is always runnable (R), however
    little CPU a busy machine gives it."""
    for mode, sleeps in (("bursty", True), ("steady", False)):
        with contention.contention(mode, on_s=0.2, off_s=0.3) as procs:
            started = time.monotonic() + 60
            while _cpu_seconds(procs[0].pid) < 0.05:  # past the interpreter's start (file reads may sleep)
                assert time.monotonic() < started
                time.sleep(0.01)
            states = set()
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline and not (sleeps and "S" in states):
                states.add(_state(procs[0].pid))
                time.sleep(0.01)
        assert ("S" in states) == sleeps, (mode, states)
