"""The default workload's batch for the per-step CPU benchmarks (cpu_step_profile, cpu_step_overhead,
cpu_fused_step_ab): `requests` random prompts of 32-256 tokens, greedy, prefilled, then `settle` decode steps."""

from __future__ import annotations

import random

from hetero_infer.contracts.sampling_params import SamplingParams
from hetero_infer.worker.core.engine import LLMEngine


def fill_decode_batch(engine: LLMEngine, requests: int, max_tokens: int, settle: int = 5) -> None:
    """Add the batch (seed 0) and step until every sequence decodes, then `settle` more steps."""
    rng = random.Random(0)
    for i in range(requests):
        prompt = [rng.randrange(100, 40000) for _ in range(rng.randrange(32, 257))]
        engine.add_request(f"r{i}", None, prompt,
                           SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
    while True:  # prefill, then a few decode steps to settle
        engine.step()
        sched = engine.last_schedule
        if sched is not None and all(not s.seq.is_prefill for s in sched.scheduled):
            break
    for _ in range(settle):
        engine.step()
