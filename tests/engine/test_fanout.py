"""n > 1 fanned out as vLLM V1 does: every sample is a sequence of its own, admitted against max_num_seqs, sharing
the prompt's full blocks through the prefix cache; the outputs come back as one request with indices 0..n-1."""

from __future__ import annotations

import pytest

from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.contracts.sampling_params import SamplingParams
from hetero_infer.worker.core.engine import LLMEngine


def mock_engine(**overrides) -> LLMEngine:
    config = dict(executor="mock", max_model_len=256, max_num_blocks=256, block_size=4, max_num_seqs=8)
    return LLMEngine(EngineConfig(**(config | overrides)))


def run(engine: LLMEngine, check=lambda: None) -> dict:
    outputs = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs[out.request_id] = out
        check()
    return outputs


def test_max_num_seqs_holds_for_n_greater_than_one():
    # issue 15, defect 1: forks used to join the running batch unchecked (four n=100 requests ran 400 sequences)
    engine = mock_engine(max_num_seqs=8)
    for i in range(4):
        engine.add_request(f"r{i}", None, [10 + i, 11, 12], SamplingParams(n=5, max_tokens=6, ignore_eos=True))
    peak = []
    outputs = run(engine, lambda: peak.append(len(engine.scheduler.running)))
    assert max(peak) == 8
    for out in outputs.values():
        assert out.finished and [c.index for c in out.outputs] == list(range(5))
        assert all(len(c.token_ids) == 6 for c in out.outputs)
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_later_samples_reuse_the_prompt_blocks_from_the_prefix_cache():
    engine = mock_engine()
    prompt = list(range(100, 113))  # 13 tokens: 3 full blocks of 4 to share
    engine.add_request("r", None, prompt, SamplingParams(n=4, max_tokens=3, ignore_eos=True))
    run(engine)
    bm = engine.block_manager
    assert bm.prefix_hits == 3 * 12  # each later sample found the first one's 12 tokens
    assert bm.num_free_blocks == bm.num_blocks


def test_samples_are_those_of_n_separate_sample_indices():
    # sample i of an n-request is the mock's sample i of the same prompt (its own index, not a copy of 0)
    engine = mock_engine()
    prompt = [7, 8, 9, 10, 11]
    engine.add_request("r", None, prompt, SamplingParams(n=3, max_tokens=5, ignore_eos=True))
    [out] = run(engine).values()
    for sample in out.outputs:
        tokens = list(prompt)
        for _ in range(5):
            tokens.append(engine.executor.next_token(tokens, sample.index))
        assert sample.token_ids == tokens[len(prompt):]
    assert len({tuple(s.token_ids) for s in out.outputs}) == 3


def test_abort_of_the_request_aborts_every_sample_and_frees_every_block():
    engine = mock_engine(max_num_seqs=3)
    engine.add_request("r", None, list(range(20, 30)), SamplingParams(n=6, max_tokens=50, ignore_eos=True))
    for _ in range(4):
        engine.step()
    assert engine.scheduler.running and engine.scheduler.waiting  # some samples run, some still wait
    engine.abort_request("r")
    assert not engine.scheduler.has_unfinished() and not engine.has_unfinished_requests()
    bm = engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks and all(b.ref_count == 0 for b in bm.blocks)


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_streamed_deltas_add_up_per_sample_index(prefix_caching):
    engine = mock_engine(max_num_seqs=2, enable_prefix_caching=prefix_caching)
    engine.add_request("r", None, list(range(30, 39)), SamplingParams(n=3, max_tokens=4, ignore_eos=True))
    tokens: dict[int, list[int]] = {}
    finished = False
    while engine.has_unfinished_requests():
        for delta in engine.step_deltas():
            for i, sample in enumerate(delta.samples):
                tokens.setdefault(i, []).extend(sample.token_ids)
            finished = delta.finished
    assert finished and sorted(tokens) == [0, 1, 2] and all(len(t) == 4 for t in tokens.values())
