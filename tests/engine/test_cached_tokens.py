"""`RequestOutput.num_cached_tokens` (vLLM's): the prompt tokens the prefix cache served at the request's first
admission, through LLM.generate as through the server's usage and metrics."""

from __future__ import annotations

from hetero_infer import LLM, SamplingParams
from hetero_infer.worker.core.outputs import OutputAccumulator, RequestDelta


def test_a_repeated_prompt_reports_its_cached_tokens() -> None:
    llm = LLM(executor="mock", block_size=8, max_model_len=256, enable_prefix_caching=True)
    prompt = list(range(1, 82))  # 81 tokens: ten full blocks of 8
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    first = llm.generate(prompt_token_ids=[prompt], sampling_params=params)[0]
    second = llm.generate(prompt_token_ids=[prompt], sampling_params=params)[0]
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens == 80  # every full block of the prompt


def test_the_first_admissions_count_is_kept() -> None:
    """A request preempted and admitted again reports what its first admission found, as vLLM does."""
    acc = OutputAccumulator("r", None, [1, 2, 3])
    acc.add(RequestDelta("r", [], False, None, [1.0], first_scheduled_time=1.0, num_cached_tokens=16))
    acc.add(RequestDelta("r", [], False, None, [2.0], first_scheduled_time=1.0, num_cached_tokens=0))
    assert acc.output().num_cached_tokens == 16
    merged = RequestDelta("r", [], False, None, [], num_cached_tokens=0)
    merged.merge(RequestDelta("r", [], False, None, [1.0], first_scheduled_time=1.0, num_cached_tokens=16))
    merged.merge(RequestDelta("r", [], True, None, [2.0], first_scheduled_time=1.0, num_cached_tokens=0))
    assert merged.num_cached_tokens == 16
