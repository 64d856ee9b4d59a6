"""The host KV tier in the engine, against transformers: multi-turn conversations through a pool that holds about
one of them, so earlier turns are evicted to the tier and restored on the next turn. Outputs (greedy, seeded,
n=2) match transformers' recipe and are identical with the tier on and off, under chunked prefill and recompute
preemption; the restored tokens count as cached (usage.prompt_tokens_details.cached_tokens)."""

from __future__ import annotations

from test_reference_kv import MAX_NEW, MIXED, assert_reference, random_prompts

from hetero_infer import LLM

TURNS = 3


def _llm(folder, tier_gib: float) -> LLM:
    # 24 blocks of 4: one conversation's history (~60 tokens) and a turn's batch, not all five histories
    return LLM(str(folder), device="cpu", dtype="float32", block_size=4, max_num_blocks=24, memory_threshold=1.0,
               max_num_batched_tokens=16, kv_offloading_size=tier_gib)


def _conversations(llm: LLM, hf=None) -> list[list[list[int]]]:
    """Each turn: every conversation's history plus a new user message, one request each, one at a time (round
    robin, as a chat service sees them); returns every turn's outputs' token ids."""
    histories = random_prompts([14, 17, 15, 16, 13], seed=11)
    news = random_prompts([5] * (len(histories) * TURNS), seed=12)
    turns = []
    for turn in range(TURNS):
        outs = []
        for i, history in enumerate(histories):
            history.extend(news[turn * len(histories) + i])
            params = MIXED[i]
            (out,) = llm.generate(prompt_token_ids=[list(history)], sampling_params=[params])
            if hf is not None:
                assert_reference(hf, [history], [params], [out], llm.engine.eos_token_ids)
            outs.append([s.token_ids for s in out.outputs])
            history.extend(out.outputs[0].token_ids)
        turns.append(outs)
    return turns


def test_conversations_restore_their_history_and_match_transformers(tiny_model):
    folder, hf = tiny_model("llama")
    on = _llm(folder, tier_gib=0.001)
    with_tier = _conversations(on, hf)
    bm = on.engine.block_manager
    assert bm.blocks_saved > 0 and bm.blocks_restored > 0 and bm.host_hits > 0
    stats = on.engine.stats()
    assert stats.host_prefix_cache_hits_total == bm.host_hits > 0
    assert stats.host_kv_bytes_restored_total == bm.blocks_restored * on.engine.executor.block_bytes

    off = _llm(folder, tier_gib=0)
    assert _conversations(off) == with_tier
    assert off.engine.block_manager.host is None and off.engine.stats().host_prefix_cache_hits_total == 0


def test_preempted_requests_resume_from_the_tier(tiny_model):
    folder, hf = tiny_model("llama")
    prompts = random_prompts([19, 22, 17, 21, 18], seed=7)
    llm = LLM(str(folder), device="cpu", dtype="float32", block_size=4, max_num_blocks=20, memory_threshold=1.0,
              kv_offloading_size=0.001)
    out = llm.generate(prompt_token_ids=prompts, sampling_params=MIXED)
    assert llm.engine.stats().num_preemptions_total > 0
    assert llm.engine.block_manager.blocks_restored > 0  # a resumed request found blocks the pool had evicted
    assert_reference(hf, prompts, MIXED, out, llm.engine.eos_token_ids)
    assert all(len(s.token_ids) == MAX_NEW for o in out for s in o.outputs)
    assert llm.engine.block_manager.num_free_blocks == llm.engine.block_manager.num_blocks


def test_a_tier_that_holds_no_block_or_exceeds_memory_is_refused(tiny_model):
    import pytest

    from hetero_infer.worker.runner.host_kv import host_tier_blocks

    folder, _ = tiny_model("llama")
    with pytest.raises(ValueError, match="holds no KV block"):
        LLM(str(folder), device="cpu", dtype="float32", kv_offloading_size=1e-9)
    with pytest.raises(ValueError, match="more than the host memory"):
        host_tier_blocks(4.0, 4096, available=2**30)
    assert host_tier_blocks(1.0, 2**20, available=2**31) == 1024
