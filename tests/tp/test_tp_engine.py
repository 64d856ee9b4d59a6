"""The engine at tensor_parallel_size N (rank 0 in this process, the other ranks in processes of their own, gloo):
greedy float32 outputs token-identical to transformers and to the same engine at N = 1, dense (Llama, Qwen3) and
MoE (Qwen3-MoE), under KV pressure (preemption) with chunked prefill, with prefix reuse; n > 1 and seeded sampling
give the same tokens as at N = 1. The engine's block accounting, prefix cache and stats see one engine."""

from __future__ import annotations

import contextlib

import pytest

from hetero_infer import LLM, SamplingParams
from tests.engine.test_hf_equivalence import MAX_NEW, hf_greedy, random_prompts

GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
# 10 blocks of 16 tokens for 6 requests of ~3 blocks each: recompute preemption; chunks of at most 16 tokens
PRESSURE = dict(block_size=16, max_num_blocks=10, memory_threshold=1.0, max_num_batched_tokens=16)


@contextlib.contextmanager
def engine(folder, tp: int, **kwargs):
    llm = LLM(str(folder), device="cpu", dtype="float32", tensor_parallel_size=tp, **kwargs)
    try:
        yield llm
    finally:
        if tp > 1:
            llm.engine.executor.close()


def _tokens(outs) -> list[list[int]]:
    return [list(c.token_ids) for o in outs for c in o.outputs]


def _value(logprob) -> float:
    return getattr(logprob, "logprob", logprob)


def _pressure_and_prefix_reuse(folder, hf, tp: int) -> None:
    prompts = random_prompts([20, 25, 18, 30, 22, 27], seed=12)
    shared = random_prompts([40], seed=13)[0]
    reuse = random_prompts([5, 12], seed=14, prefix=shared)
    with engine(folder, tp, **PRESSURE) as llm:
        e = llm.engine
        assert e.executor.num_blocks == 10 and e.block_manager.num_blocks == 10  # one pool, whatever N is
        ours = _tokens(llm.generate(prompt_token_ids=prompts, sampling_params=GREEDY))
        assert e.scheduler.num_preemptions_total > 0
        assert ours == [hf_greedy(hf, p) for p in prompts]
        first = _tokens(llm.generate(prompt_token_ids=reuse[:1], sampling_params=GREEDY))
        hits = e.stats().prefix_cache_hits_total
        rest = _tokens(llm.generate(prompt_token_ids=reuse[1:], sampling_params=GREEDY))
        assert e.stats().prefix_cache_hits_total - hits >= 32  # the shared prefix's two full blocks
        assert first + rest == [hf_greedy(hf, p) for p in reuse]
        assert e.block_manager.num_free_blocks == 10


@pytest.mark.parametrize("arch", ["qwen3", "qwen3-moe"])
def test_tp2_greedy_matches_hf_under_pressure_chunked_prefill_and_prefix_reuse(tiny_model, arch):
    folder, hf = tiny_model(arch)
    _pressure_and_prefix_reuse(folder, hf, tp=2)


def test_tp2_llama_matches_tp1_and_hf_with_n_and_seeds(tiny_model):
    folder, hf = tiny_model("llama")
    prompts = random_prompts([3, 17, 40, 1], seed=11)
    sampled = [SamplingParams(temperature=0.8, top_p=0.9, max_tokens=8, seed=7, n=2),
               SamplingParams(temperature=1.0, top_k=50, max_tokens=8, seed=3, n=3, ignore_eos=True)]
    results, logprobs = {}, {}
    for tp in (1, 2):
        with engine(folder, tp, block_size=8) as llm:
            greedy = _tokens(llm.generate(prompt_token_ids=prompts, sampling_params=GREEDY))
            seeded = _tokens(llm.generate(prompt_token_ids=prompts[:2], sampling_params=sampled))
            (scored,) = llm.generate(prompt_token_ids=prompts[2:3], sampling_params=SamplingParams(
                temperature=0.0, max_tokens=3, logprobs=3, prompt_logprobs=2))
            assert llm.engine.block_manager.num_free_blocks == llm.engine.block_manager.num_blocks
            results[tp] = greedy, seeded
            logprobs[tp] = scored.prompt_logprobs[1:] + scored.outputs[0].logprobs
    assert results[2][0] == [hf_greedy(hf, p) for p in prompts]
    assert results[2] == results[1]
    # prompt and sampled logprobs: the same tokens, the same values up to the all-reduces' float rounding
    assert [sorted(d) for d in logprobs[2]] == [sorted(d) for d in logprobs[1]]
    for got, ref in zip(logprobs[2], logprobs[1]):
        for token, value in ref.items():
            assert abs(_value(got[token]) - _value(value)) < 1e-4
    assert len(results[2][1]) == 5 and len({tuple(t) for t in results[2][1]}) > 1  # n samples, not copies


@pytest.mark.slow
@pytest.mark.parametrize("arch, tp", [("llama", 4), ("mixtral", 2), ("qwen3-moe-top4-e16-mixed", 2),
                                      ("qwen2-moe-shared", 2), ("llama3-tied", 2), ("qwen2", 2)])
def test_tp_variants_match_hf_under_pressure_and_prefix_reuse(tiny_model, arch, tp):
    """TP=4 replicates the 2 KV heads; the MoE families; tied embeddings (the vocabulary-parallel LM head is the
    embedding's slice); Qwen2's q/k/v biases."""
    folder, hf = tiny_model(arch)
    _pressure_and_prefix_reuse(folder, hf, tp)


def test_a_model_that_cannot_be_split_is_refused_before_any_rank_starts(tiny_model):
    folder, _ = tiny_model("llama")  # 4 attention heads, 2 KV heads, intermediate 128
    with pytest.raises(ValueError, match=r"cannot be split over tensor_parallel_size=3: num_attention_heads=4 is "
                                         r"not divisible by 3.*num_key_value_heads=2 neither divides"):
        LLM(str(folder), device="cpu", dtype="float32", tensor_parallel_size=3)
    with pytest.raises(ValueError, match="tensor_parallel_size.*needs the torch executor"):
        LLM(str(folder), executor="mock", tensor_parallel_size=2)


@pytest.mark.slow
def test_tp2_host_kv_tier_restores_each_ranks_shard(tiny_model):
    """The host tier's copies (blocks out to host memory, back into the pool) run on every rank's KV shard."""
    folder, hf = tiny_model("llama")
    prompts = random_prompts([8, 9, 7, 10, 8, 9, 11], seed=15)
    with engine(folder, 2, block_size=4, max_num_blocks=8, kv_offloading_size=0.01) as llm:
        first = _tokens(llm.generate(prompt_token_ids=prompts, sampling_params=GREEDY))
        again = _tokens(llm.generate(prompt_token_ids=prompts, sampling_params=GREEDY))
        assert llm.engine.stats().host_prefix_cache_hits_total > 0
    assert first == again == [hf_greedy(hf, p) for p in prompts]
