"""`hetero-infer bench` samples the copy bandwidth between our steps (bench/throughput.py CopyProbe)."""

from __future__ import annotations

import torch

from hetero_infer.bench.throughput import CopyProbe


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_probe_samples_only_when_due_and_counts_its_own_time():
    clock = FakeClock()
    probe = CopyProbe(torch.device("cpu"), every_s=0.25, nbytes=1 << 16, clock=clock)
    assert probe.median() is None
    probe.maybe()
    assert len(probe.samples) == 1 and probe.samples[0] > 0  # the first sample is due at once
    clock.now += 0.2
    probe.maybe()
    assert len(probe.samples) == 1  # not due yet
    clock.now += 0.1
    probe.maybe()
    assert len(probe.samples) == 2
    assert probe.spent == 0.0  # the fake clock did not move while copying
    probe.maybe()
    assert len(probe.samples) == 2  # due again only 0.25 s after the last sample
    clock.now += 0.25
    probe.maybe()
    assert len(probe.samples) == 3


def test_probe_time_is_left_out_and_the_median_is_of_the_samples():
    ticks = iter([1.0, 1.5, 3.0, 3.25])  # (now, after) for two samples
    probe = CopyProbe(torch.device("cpu"), every_s=0.5, nbytes=1 << 16, clock=lambda: next(ticks))
    probe.maybe()
    probe.maybe()
    assert probe.spent == 0.75
    probe.samples = [3.0, 1.0, 2.0]
    assert probe.median() == 2.0
