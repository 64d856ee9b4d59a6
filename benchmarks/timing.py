"""Timing helper shared by the CPU microbenchmarks in this folder."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def median_ms(fn: Callable[[], object], repeats: int, flush: torch.Tensor | None = None, warmup: int = 5) -> float:
    """Median wall time of fn() in milliseconds; with `flush`, a buffer larger than the last-level cache is
    read before each call (untimed; read, as weights are), so data comes from memory as in the engine, where
    a step's weights stream through the caches between two calls of one layer's kernel."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if flush is not None:
            flush.sum()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3
