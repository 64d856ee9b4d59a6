"""Mixture-of-Experts models (Qwen3-MoE, Mixtral): greedy float32 decoding token-identical to transformers, with
every routing option of their configs (top-k 1-4, renormalised or not, 4-16 experts, dense layers between sparse
ones), under KV pressure (preemption), chunked prefill and prefix reuse."""

from __future__ import annotations

import pytest

from hetero_infer import LLM, SamplingParams
from tests.engine.conftest import MOE
from tests.engine.test_hf_equivalence import MAX_NEW, hf_greedy, random_prompts, run_engine


@pytest.mark.parametrize("arch", list(MOE))
def test_moe_mixed_lengths_match_hf(tiny_model, arch):
    folder, hf = tiny_model(arch)
    prompts = random_prompts([3, 17, 40, 1, 29], seed=11)
    llm, ours = run_engine(folder, prompts, block_size=16)
    assert ours == [hf_greedy(hf, p) for p in prompts]
    assert llm.engine.block_manager.num_free_blocks == llm.engine.block_manager.num_blocks


@pytest.mark.parametrize("arch", ["qwen3-moe", "mixtral"])
def test_moe_preemption_chunked_prefill_match_hf(tiny_model, arch):
    folder, hf = tiny_model(arch)
    prompts = random_prompts([20, 25, 18, 30, 22, 27], seed=12)
    # 10 blocks of 16 for 6 requests of ~3 blocks each: recompute preemption; chunks of at most 8 tokens
    llm, ours = run_engine(folder, prompts, block_size=16, max_num_blocks=10, memory_threshold=1.0,
                           max_num_batched_tokens=16)
    assert llm.engine.scheduler.num_preemptions_total > 0
    assert ours == [hf_greedy(hf, p) for p in prompts]
    assert llm.engine.block_manager.num_free_blocks == 10


@pytest.mark.parametrize("arch", ["qwen3-moe-top4-e16-mixed", "mixtral-top1-e4"])
def test_moe_prefix_cache_hits_match_hf(tiny_model, arch):
    folder, hf = tiny_model(arch)
    shared = random_prompts([40], seed=13)[0]
    prompts = random_prompts([5, 12, 1], seed=14, prefix=shared)
    llm = LLM(str(folder), device="cpu", dtype="float32", block_size=8)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    first = llm.generate(prompt_token_ids=prompts[:1], sampling_params=params)
    rest = llm.generate(prompt_token_ids=prompts[1:], sampling_params=params)
    assert llm.engine.stats().prefix_cache_hits_total >= 2 * 40
    assert [o.outputs[0].token_ids for o in first + rest] == [hf_greedy(hf, p) for p in prompts]
