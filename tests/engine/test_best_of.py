"""best_of > n: best_of samples drawn, the n with the highest cumulative logprob returned (vLLM's rule), ranked on
transformers' logits; and the request check of best_of."""

from __future__ import annotations

import pytest
import torch
from hf_reference import teacher_forced_logits

from hetero_infer import LLM, SamplingParams
from hetero_infer.worker.core.request_check import EngineLimits, RequestError, check_request

MAX_NEW = 8
PROMPT = [812, 4410, 1200, 33, 9071, 20001]


@pytest.fixture(scope="module")
def llama(tiny_model):
    folder, hf = tiny_model("llama")
    return LLM(str(folder), device="cpu", dtype="float32", block_size=4, max_num_blocks=256), hf


def hf_cumulative_logprob(hf, tokens: list[int]) -> float:
    raw = torch.log_softmax(teacher_forced_logits(hf, PROMPT, tokens).double(), dim=-1)
    return float(raw.gather(1, torch.tensor(tokens)[:, None]).sum())


@pytest.mark.parametrize("logprobs", [None, 2])
def test_best_of_returns_the_n_most_likely_of_its_samples(llama, logprobs):
    llm, hf = llama
    common = dict(temperature=1.0, seed=5, max_tokens=MAX_NEW, ignore_eos=True)
    # the candidates: sample i of a seeded request is the same whatever n or best_of (make_generator(seed, i))
    [every] = llm.generate(prompt_token_ids=[PROMPT], sampling_params=[SamplingParams(n=4, **common)])
    candidates = [c.token_ids for c in every.outputs]
    scores = [hf_cumulative_logprob(hf, t) for t in candidates]
    ranked = sorted(range(4), key=lambda i: -scores[i])
    assert ranked[:2] != [0, 1], "a seed whose best samples are not simply the first ones"
    assert min(abs(a - b) for i, a in enumerate(scores) for b in scores[i + 1:]) > 1e-3  # no near-tie to rank

    params = SamplingParams(n=2, best_of=4, logprobs=logprobs, **common)
    [out] = llm.generate(prompt_token_ids=[PROMPT], sampling_params=[params])
    assert [c.index for c in out.outputs] == [0, 1]
    assert [c.token_ids for c in out.outputs] == [candidates[i] for i in ranked[:2]]
    if logprobs is None:
        assert all(c.cumulative_logprob is None and c.logprobs is None for c in out.outputs)
    else:
        for c, i in zip(out.outputs, ranked[:2], strict=True):
            assert c.cumulative_logprob == pytest.approx(scores[i], abs=1e-3)
            assert len(c.logprobs) == MAX_NEW and all(len(d) >= 2 for d in c.logprobs)
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks  # the samples not returned hold no block either


def test_best_of_streams_nothing_until_the_best_are_known(llama):
    llm, _ = llama
    engine = llm.engine
    engine.add_request("b", None, PROMPT, SamplingParams(n=1, best_of=3, seed=1, max_tokens=4, ignore_eos=True))
    deltas = []
    while engine.has_unfinished_requests():
        deltas += engine.step_deltas()
    *running, last = deltas
    assert running and all(d.samples == [] and not d.finished for d in running)
    assert last.finished and len(last.samples) == 1 and len(last.samples[0].token_ids) == 4


LIMITS = EngineLimits("m", 128, 1000, 64, 16, (0,))


@pytest.mark.parametrize(("params", "message"), [
    (SamplingParams(n=3, best_of=2), "best_of must be an integer >= n (3) or None, got 2"),
    (SamplingParams(n=1, best_of=0), "best_of must be an integer >= n (1) or None, got 0"),
    (SamplingParams(n=1, best_of=2.5), "best_of must be an integer >= n (1) or None, got 2.5"),
])
def test_best_of_below_n_is_refused(params, message):
    with pytest.raises(RequestError) as err:
        check_request([1, 2], params, LIMITS)
    assert (err.value.param, err.value.message) == ("best_of", message)


def test_best_of_above_the_servers_cap_is_refused():
    check_request([1, 2], SamplingParams(n=1, best_of=4), LIMITS, max_n=4)
    with pytest.raises(RequestError) as err:
        check_request([1, 2], SamplingParams(n=1, best_of=5), LIMITS, max_n=4)
    assert err.value.param == "best_of" and "max_num_seqs (4)" in err.value.message
