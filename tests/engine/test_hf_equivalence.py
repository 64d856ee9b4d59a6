"""Greedy float32 decoding must be token-identical to Hugging Face transformers."""

from __future__ import annotations

import random

import pytest
import torch

from hetero_infer import LLM, SamplingParams

ARCHS = ["llama", "llama-hd64", "llama3-tied", "mistral", "qwen2", "qwen3"]  # see conftest.tiny_config

MAX_NEW = 10


def hf_greedy(model, prompt: list[int], max_new: int = MAX_NEW) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new, min_new_tokens=max_new,
        do_sample=False, pad_token_id=0,
    )
    return out[0, len(prompt):].tolist()


def random_prompts(lengths, seed=0, prefix=()):
    rng = random.Random(seed)
    return [list(prefix) + [rng.randrange(100, 49000) for _ in range(n)] for n in lengths]


def run_engine(folder, prompts, **engine_kwargs):
    llm = LLM(str(folder), device="cpu", dtype="float32", **engine_kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=params)
    return llm, [o.outputs[0].token_ids for o in outs]


@pytest.mark.parametrize("arch", ARCHS)
def test_mixed_lengths_match_hf(tiny_model, arch):
    folder, hf = tiny_model(arch)
    prompts = random_prompts([3, 17, 40, 1, 29], seed=1)
    llm, ours = run_engine(folder, prompts, block_size=16)
    assert ours == [hf_greedy(hf, p) for p in prompts]
    assert llm.engine.block_manager.num_free_blocks == llm.engine.block_manager.num_blocks


@pytest.mark.parametrize("cpu_kernel", [True, False], ids=["c-kernel", "torch-reference"])
def test_preemption_keeps_outputs_identical(tiny_model, monkeypatch, cpu_kernel):
    if not cpu_kernel:  # the plain PyTorch path: gathered-block attention, MKL linears
        monkeypatch.setenv("HETERO_INFER_CPU_KERNEL", "0")
        monkeypatch.setenv("HETERO_INFER_ONEDNN", "0")
    folder, hf = tiny_model("llama")
    prompts = random_prompts([20, 25, 18, 30, 22, 27], seed=2)
    # 6 requests need ~6 * 3 blocks of 16 at the end; 10 blocks force recompute preemption
    llm, ours = run_engine(folder, prompts, block_size=16, max_num_blocks=10, memory_threshold=1.0)
    assert llm.engine.scheduler.num_preemptions_total > 0
    assert ours == [hf_greedy(hf, p) for p in prompts]
    assert llm.engine.block_manager.num_free_blocks == 10


def test_chunked_prefill_matches_hf(tiny_model):
    folder, hf = tiny_model("qwen3")
    prompts = random_prompts([45, 7, 33], seed=3)
    # budget of 8 tokens: the 45-token prompt needs 6 chunks sharing steps with decodes
    llm, ours = run_engine(folder, prompts, block_size=4, max_num_batched_tokens=8)
    assert ours == [hf_greedy(hf, p) for p in prompts]


def test_prefix_cache_hits_match_hf(tiny_model):
    folder, hf = tiny_model("qwen2")
    shared = random_prompts([40], seed=9)[0]
    prompts = random_prompts([5, 12, 1], seed=4, prefix=shared)
    llm = LLM(str(folder), device="cpu", dtype="float32", block_size=8)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    first = llm.generate(prompt_token_ids=prompts[:1], sampling_params=params)
    rest = llm.generate(prompt_token_ids=prompts[1:], sampling_params=params)
    ours = [o.outputs[0].token_ids for o in first + rest]
    stats = llm.engine.stats()
    assert stats.prefix_cache_hits_total >= 2 * 40  # both later prompts reuse the 5 full shared blocks
    assert ours == [hf_greedy(hf, p) for p in prompts]


def test_n_greedy_samples_share_blocks_with_copy_on_write(tiny_model):
    folder, hf = tiny_model("mistral")
    prompt = random_prompts([13], seed=5)[0]  # 13 % 4 != 0: the last block is shared and copied on write
    llm = LLM(str(folder), device="cpu", dtype="float32", block_size=4)
    out = llm.generate(prompt_token_ids=[prompt], sampling_params=SamplingParams(
        n=3, temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True))[0]
    expected = hf_greedy(hf, prompt)
    assert [c.token_ids for c in out.outputs] == [expected] * 3
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert llm.engine.block_manager.num_free_blocks == llm.engine.block_manager.num_blocks
