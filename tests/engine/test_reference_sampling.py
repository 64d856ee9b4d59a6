"""Sampled outputs against the sampling recipe applied to transformers' logits (tests/engine/hf_reference.py).

For every step of every sample, transformers computes the logits of the engine's own prefix; the reference
applies penalties, min_tokens, temperature, top-k, top-p and min-p to them and, for seeded requests, runs the
exponential race with the request's own noise: the engine must produce the same token (a near-tie in float32,
where either token is right, is allowed and counted). Its logprobs must be transformers' raw log-softmax.
"""

from __future__ import annotations

import random

import pytest
import torch
from hf_reference import check_sample, kept_distribution, mismatches, processed_logits, teacher_forced_logits

from hetero_infer import LLM, SamplingParams

MAX_NEW = 12


def random_prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, 49000) for _ in range(n)]


# One batch mixing every option: each row's token depends only on its own logits and noise.
PARAMS = {
    "temperature": dict(temperature=0.7, seed=11),
    "top_k": dict(temperature=1.3, top_k=20, seed=12),
    "top_p": dict(temperature=1.0, top_p=0.8, seed=13),
    "min_p": dict(temperature=0.9, min_p=0.1, seed=14),
    "all_filters": dict(temperature=1.1, top_k=50, top_p=0.9, min_p=0.05, seed=15),
    "penalties": dict(temperature=1.0, repetition_penalty=1.6, presence_penalty=1.5, frequency_penalty=2.0,
                      top_k=5, seed=16),
    # the other way round: repeats encouraged (a random model rarely repeats by itself, so this is where the
    # penalties change tokens)
    "boosts": dict(temperature=1.0, repetition_penalty=0.4, presence_penalty=-2.0, frequency_penalty=-2.0, seed=18),
    "n3_top_p": dict(n=3, temperature=1.2, top_p=0.95, seed=17),
}


@pytest.fixture(scope="module")
def llama(tiny_model):
    folder, hf = tiny_model("llama")
    return LLM(str(folder), device="cpu", dtype="float32", block_size=4, max_num_blocks=512), hf


def run(llm: LLM, prompts: list[list[int]], params: list[SamplingParams]):
    return llm.generate(prompt_token_ids=prompts, sampling_params=params)


def test_seeded_samples_follow_the_recipe_on_transformers_logits(llama):
    llm, hf = llama
    eos = llm.engine.eos_token_ids
    names = list(PARAMS)
    prompts = [random_prompt(5 + 3 * i, seed=i) for i in range(len(names))]
    params = [SamplingParams(max_tokens=MAX_NEW, ignore_eos=True, logprobs=0, **PARAMS[n]) for n in names]
    outs = run(llm, prompts, params)
    near_ties = 0
    for name, prompt, p, out in zip(names, prompts, params, outs, strict=True):
        assert len(out.outputs) == p.n
        for sample in out.outputs:
            logits = teacher_forced_logits(hf, prompt, sample.token_ids)
            checks = check_sample(logits, prompt, sample.token_ids, p, eos, sample_index=sample.index)
            assert not mismatches(checks), (name, sample.index, mismatches(checks))
            near_ties += sum(c.near_tie and c.token != c.expected for c in checks)
            # logprobs are of the raw distribution, as in vLLM: transformers' log-softmax
            raw = torch.log_softmax(logits, dim=-1)
            ours = torch.tensor([lp[t] for lp, t in zip(sample.logprobs, sample.token_ids, strict=True)])
            torch.testing.assert_close(ours, raw.gather(1, torch.tensor(sample.token_ids)[:, None])[:, 0],
                                       atol=1e-4, rtol=0)
    assert near_ties <= 2
    # the penalties changed something: the same seed without them produces other tokens
    plain = dict(PARAMS["boosts"], repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0)
    i = names.index("boosts")
    [unpenalized] = run(llm, [prompts[i]], [SamplingParams(max_tokens=MAX_NEW, ignore_eos=True, **plain)])
    assert unpenalized.outputs[0].token_ids != outs[i].outputs[0].token_ids
    # n > 1: the forks share the prompt's blocks yet diverge, and sample 0 is the seed's own n=1 sample
    forks = [s.token_ids for s in outs[names.index("n3_top_p")].outputs]
    assert len({tuple(f) for f in forks}) == 3
    single = dict(PARAMS["n3_top_p"], n=1)
    [alone] = run(llm, [prompts[names.index("n3_top_p")]], [SamplingParams(max_tokens=MAX_NEW, ignore_eos=True,
                                                                          **single)])
    assert alone.outputs[0].token_ids == forks[0]


def test_min_tokens_masks_the_stop_tokens(llama):
    llm, hf = llama
    eos = llm.engine.eos_token_ids
    prompt = random_prompt(9, seed=40)
    # the 30 most likely first tokens are stop tokens: unmasked, a cool sample would stop at once
    first = teacher_forced_logits(hf, prompt, [0])[0]
    stops = first.topk(30).indices.tolist()
    params = SamplingParams(temperature=0.5, seed=41, min_tokens=MAX_NEW, max_tokens=MAX_NEW, stop_token_ids=stops)
    [out] = run(llm, [prompt], [params])
    tokens = out.outputs[0].token_ids
    assert len(tokens) == MAX_NEW and not set(tokens) & set(stops)
    assert not mismatches(check_sample(teacher_forced_logits(hf, prompt, tokens), prompt, tokens, params, eos))
    [unmasked] = run(llm, [prompt], [SamplingParams(temperature=0.5, seed=41, max_tokens=MAX_NEW,
                                                    stop_token_ids=stops)])
    assert unmasked.outputs[0].finish_reason == "stop" and len(unmasked.outputs[0].token_ids) < MAX_NEW


def test_top_k_1_is_greedy_and_unseeded_samples_stay_in_the_support(llama):
    llm, hf = llama
    eos = llm.engine.eos_token_ids
    prompts = [random_prompt(n, seed=50 + n) for n in (4, 11, 23)]
    top1 = SamplingParams(temperature=1.5, top_k=1, max_tokens=MAX_NEW, ignore_eos=True)
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    for prompt, out in zip(prompts, run(llm, prompts, [top1] * 3), strict=True):
        tokens = out.outputs[0].token_ids
        # transformers' argmax at every step
        assert not mismatches(check_sample(teacher_forced_logits(hf, prompt, tokens), prompt, tokens, greedy, eos))
    narrow = SamplingParams(n=4, temperature=1.0, top_k=3, max_tokens=MAX_NEW, ignore_eos=True)
    for prompt, out in zip(prompts, run(llm, prompts, [narrow] * 3), strict=True):
        for sample in out.outputs:
            checks = check_sample(teacher_forced_logits(hf, prompt, sample.token_ids), prompt, sample.token_ids,
                                  narrow, eos)
            assert min(c.probability for c in checks) > 0.0  # every token among transformers' top 3


def test_unseeded_draws_follow_the_reference_distribution(llama):
    """One step, many requests: the frequencies of the engine's first tokens against the reference
    probabilities (chi-square, the global RNG seeded: deterministic)."""
    llm, hf = llama
    prompt = random_prompt(6, seed=60)
    params = SamplingParams(temperature=2.0, top_k=6, max_tokens=1)
    logits = teacher_forced_logits(hf, prompt, [0])[0]
    dist = kept_distribution(processed_logits(logits, params, prompt, [], []), params)
    torch.manual_seed(0)
    draws = 1200
    outs = run(llm, [prompt] * draws, [params] * draws)
    counts = torch.zeros_like(dist)
    for o in outs:
        counts[o.outputs[0].token_ids[0]] += 1
    support = dist > 0
    assert counts[~support].sum() == 0
    expected = dist[support] * draws
    chi2 = float(((counts[support] - expected) ** 2 / expected).sum())
    assert expected.min() > 5  # the chi-square approximation holds
    assert chi2 < 20.5  # 5 degrees of freedom: p = 0.001

