"""Where CPU prefill chunks attend with SDPA instead of the paged kernel: measured at start-up per dtype and head
shape (cpu_backend.measure_sdpa_min_pairs), the threshold the probes imply, and the backend's steps following it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hetero_infer.kernels.cpu import paged_attention
from hetero_infer.worker.runner.attention import cpu_backend
from hetero_infer.worker.runner.attention.base import SeqSpan, StepBatch

pytestmark = pytest.mark.skipif(not paged_attention.available(), reason="no C compiler: the C kernels are not built")


@pytest.mark.parametrize("choices, want", [
    (("paged", "paged", "paged", "sdpa"), cpu_backend.chunk_pairs(0, 2048)),
    (("paged", "sdpa", "sdpa", "sdpa"), cpu_backend.chunk_pairs(0, 256)),
    (("sdpa", "sdpa", "sdpa", "sdpa"), cpu_backend.chunk_pairs(0, 64)),
    (("paged", "paged", "paged", "paged"), None),
    (("sdpa", "paged", "sdpa", "paged"), None),  # the largest probe decides whether SDPA is ever taken
    (("sdpa", "paged", "paged", "sdpa"), cpu_backend.chunk_pairs(0, 2048)),  # from where it wins every larger one
])
def test_threshold_from_the_probes(choices, want):
    assert cpu_backend.sdpa_min_pairs_from(choices) == want


class _Cache:
    def __init__(self):
        self.entries = {}

    def get(self, entry):
        return self.entries.get(entry, (None,))[0]

    def put(self, entry, plan, timings):
        self.entries[entry] = (tuple(plan), timings)


def _timer_favouring(winner: str):
    """A clock under which `winner` takes half the time of the other kernel (told apart by the call's code)."""
    def timer(call):
        name = "sdpa" if ".sdpa." in call.__code__.co_qualname else "paged"
        return 1e-3 if name == winner else 2e-3
    return timer


@pytest.mark.parametrize("winner, want", [("sdpa", cpu_backend.chunk_pairs(0, 64)), ("paged", None)])
def test_measured_once_and_cached(winner, want):
    cache = _Cache()
    got = cpu_backend.measure_sdpa_min_pairs(torch.float32, 4, 2, 16, 16, cache=cache, timer=_timer_favouring(winner))
    assert got == want
    (entry,) = cache.entries
    assert entry == "prefill_attention:float32:4/2x16:16"
    # the second start reads the cache: a clock that would now favour the other kernel is never asked
    other = "paged" if winner == "sdpa" else "sdpa"
    assert cpu_backend.measure_sdpa_min_pairs(torch.float32, 4, 2, 16, 16, cache=cache,
                                              timer=_timer_favouring(other)) == want


def _prefill_batch(n: int, bs: int = 16) -> StepBatch:
    blocks = list(range(-(-n // bs)))
    return StepBatch([SeqSpan(blocks, 0, n, True)], np.arange(n, dtype=np.int64), np.arange(n, dtype=np.int64), bs)


def test_the_backend_follows_its_threshold():
    backend = cpu_backend.CpuBackend(rope=None)
    assert len(backend.prepare(_prefill_batch(100)).prefills) == 1  # the default: 5,050 pairs >= 2,048
    backend.sdpa_min_pairs = None
    assert backend.prepare(_prefill_batch(100)).prefills == ()
    backend.sdpa_min_pairs = cpu_backend.chunk_pairs(0, 101)
    assert backend.prepare(_prefill_batch(100)).prefills == ()
    assert len(backend.prepare(_prefill_batch(101)).prefills) == 1
