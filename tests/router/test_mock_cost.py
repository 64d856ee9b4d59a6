"""The mock executor's cost model: step time grows with the tokens a step computes and the sequences it runs,
so a prefix-cache hit (tokens not computed) takes less time, as on a real engine."""

from __future__ import annotations

import pytest

from hetero_infer import LLM, SamplingParams
from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.worker.runner import mock_executor

PROMPT = list(range(1000, 1200))  # 200 tokens: 12 full blocks of 16


@pytest.fixture
def slept(monkeypatch):
    """The modelled device seconds of each step the mock executor ran, in order (nothing really sleeps: the
    modelled device's timeline runs ahead of the clock, so the waits themselves add up across steps)."""
    steps: list[float] = []
    cost = mock_executor.MockExecutor.step_seconds

    def recorded(self, sched):
        steps.append(cost(self, sched))
        return steps[-1]

    monkeypatch.setattr(mock_executor.MockExecutor, "step_seconds", recorded)
    monkeypatch.setattr(mock_executor.time, "sleep", lambda seconds: None)
    return steps


def test_step_time_counts_tokens_computed_and_sequences(slept):
    llm = LLM(executor="mock", mock_step_latency_s=0.5, mock_token_latency_s=0.01, mock_seq_latency_s=0.1,
              max_num_batched_tokens=64)
    llm.generate(prompt_token_ids=[PROMPT], sampling_params=SamplingParams(max_tokens=3, ignore_eos=True))
    # a 200-token prefill in chunks of 64, 64, 64 and 8, then two one-token decodes; one sequence throughout
    chunks = [0.5 + 0.64 + 0.1] * 3 + [0.5 + 0.08 + 0.1]
    assert slept == pytest.approx(chunks + [0.5 + 0.01 + 0.1] * 2)


def test_a_prefix_hit_saves_the_time_of_the_cached_tokens(slept):
    llm = LLM(executor="mock", mock_token_latency_s=0.01, max_num_batched_tokens=4096)
    params = SamplingParams(max_tokens=1, ignore_eos=True)
    llm.generate(prompt_token_ids=[PROMPT], sampling_params=params)
    cold = sum(slept)
    slept.clear()
    llm.generate(prompt_token_ids=[PROMPT[:192] + [7, 8, 9]], sampling_params=params)
    warm = sum(slept)
    assert cold == pytest.approx(2.0)
    assert warm == pytest.approx((195 - 192) * 0.01)  # the 12 cached blocks are not computed again


def test_negative_costs_are_refused():
    for name in ("mock_token_latency_s", "mock_seq_latency_s"):
        with pytest.raises(ValueError, match=name):
            EngineConfig(**{name: -1.0})
