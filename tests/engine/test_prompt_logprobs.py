"""Prompt logprobs (`SamplingParams(prompt_logprobs=k)`, vLLM's; OpenAI's `echo` with `logprobs`) of the real
default model against transformers: each prompt token's logprob given the tokens before it, and the top k at
that position, whatever the chunking of the prompt and of its logits; generation unchanged beside them. (The mock
executor's, through the engine process and the API: tests/server/test_openai_client.py.)"""

from __future__ import annotations

import pytest
import torch

from hetero_infer import LLM, SamplingParams
from hetero_infer.worker.core.request_check import RequestError
from hetero_infer.worker.runner import prompt_logprobs as plp_module
from hetero_infer.worker.runner.loader import resolve_model

PROMPT = ("The capital of France is Paris, and the capital of Germany is Berlin. The capital of Italy is Rome, "
          "and the capital of Spain is")


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(max_num_batched_tokens=16, max_model_len=256)  # a 27-token prompt runs in two chunks


@pytest.fixture(scope="module")
def hf_logprobs(llm: LLM) -> tuple[list[int], torch.Tensor]:
    """The prompt's token ids and transformers' float64 log-softmax after each position (float32 model)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(resolve_model(None)[0], dtype=torch.float32).eval()
    ids = llm.generate([PROMPT], SamplingParams(max_tokens=1, temperature=0))[0].prompt_token_ids
    with torch.inference_mode():
        logits = model(torch.tensor([ids])).logits[0]
    return ids, logits.double().log_softmax(-1)


def _check_against_hf(entries, ids: list[int], reference: torch.Tensor, k: int, ranks=None) -> None:
    """`ranks`: the prompt tokens' ranks beside the entries (vLLM's `Logprob.rank`: the tokens at least as likely,
    itself included), checked where given, within transformers' float64 rounding of float32 near-ties."""
    assert len(entries) == len(ids) and entries[0] is None
    assert ranks is None or (len(ranks) == len(ids) and ranks[0] is None)
    for i in range(1, len(ids)):
        entry, row = entries[i], reference[i - 1]
        assert entry[ids[i]] == pytest.approx(row[ids[i]].item(), abs=1e-4), i
        if ranks is not None:
            mine = row[ids[i]]
            assert int((row > mine + 1e-4).sum()) < ranks[i] <= int((row >= mine - 1e-4).sum()), i
        top = row.topk(k).indices.tolist() if k else []
        assert set(entry) == set(top) | {ids[i]}, i
        for t in top:
            assert entry[t] == pytest.approx(row[t].item(), abs=1e-4), (i, t)


@pytest.mark.parametrize("k", [0, 3])
def test_prompt_logprobs_equal_transformers(llm, hf_logprobs, k):
    ids, reference = hf_logprobs
    out = llm.generate([PROMPT], SamplingParams(max_tokens=4, temperature=0, prompt_logprobs=k))[0]
    assert out.prompt_token_ids == ids and len(ids) > 16  # more than one chunk of the step budget
    _check_against_hf(out.prompt_logprobs, ids, reference, k, out.prompt_logprob_ranks)


def test_chunked_logits_give_the_same_values(llm, hf_logprobs, monkeypatch):
    """Logits taken 5 rows at a time (their cut falls inside and across the prompt's 16-token chunks)."""
    ids, reference = hf_logprobs
    whole = llm.generate([PROMPT], SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=2))[0]
    monkeypatch.setattr(plp_module, "LOGITS_ROWS", 5)
    pieces = llm.generate([PROMPT], SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=2))[0]
    _check_against_hf(pieces.prompt_logprobs, ids, reference, 2)
    for a, b in zip(pieces.prompt_logprobs[1:], whole.prompt_logprobs[1:], strict=True):
        assert a.keys() == b.keys() and all(a[t] == pytest.approx(b[t], abs=1e-5) for t in a)


def test_generation_is_unchanged_and_the_prompt_is_computed_then_cached(llm):
    """The prompt logprobs come from the request's own prefill: the tokens generated beside them are those of a
    request without them; its prompt is computed whole although the prefix cache holds it (a cached block has no
    logits), and its blocks serve the next request; n samples share one list."""
    plain = llm.generate([PROMPT + " Madrid"], SamplingParams(max_tokens=8, temperature=0))[0]
    both = llm.generate([PROMPT + " Madrid"], SamplingParams(max_tokens=8, temperature=0, prompt_logprobs=1, n=2))[0]
    again = llm.generate([PROMPT + " Madrid"], SamplingParams(max_tokens=8, temperature=0))[0]
    assert plain.prompt_logprobs is None
    assert [o.token_ids for o in both.outputs] == [plain.outputs[0].token_ids] * 2
    assert both.num_cached_tokens == 0 and again.num_cached_tokens > 0
    assert len(both.prompt_logprobs) == len(both.prompt_token_ids)
    engine = llm.engine
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_prompt_logprobs_take_the_request_s_own_steps(llm, hf_logprobs):
    """Queued, the request runs nothing; its prompt is computed in the steps' chunks while another request keeps
    decoding (a token every step), and its logprobs come whole with its first token."""
    ids, reference = hf_logprobs
    engine = llm.engine
    engine.add_request("decoding", None, ids[:5], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    engine.step()
    engine.add_request("scored", None, ids, SamplingParams(max_tokens=2, temperature=0, prompt_logprobs=2))
    assert engine.requests["scored"].prompt_logprobs == [None]
    steps = 0
    scored = None
    while scored is None:
        outs = {o.request_id: o for o in engine.step()}
        steps += 1
        assert "decoding" in outs  # the other request got a token in every step
        if "scored" in outs:
            scored = outs["scored"]
    assert steps >= 2  # the prompt took more than one step's token budget
    _check_against_hf(scored.prompt_logprobs, ids, reference, 2, scored.prompt_logprob_ranks)
    while engine.has_unfinished_requests():
        engine.step()


def test_a_preempted_prefill_hands_each_logprob_back_once(llm, hf_logprobs):
    """Preempted after its first chunk, the request recomputes its prompt from the start: the rows already handed
    back are not computed again, and the whole list still equals transformers'."""
    ids, reference = hf_logprobs
    engine = llm.engine
    engine.add_request("preempted", None, ids, SamplingParams(max_tokens=2, temperature=0, prompt_logprobs=1))
    assert engine.step() == []
    seq = engine.requests["preempted"].seqs[0]
    assert seq.prompt_logprob_rows == 16 and len(engine.requests["preempted"].prompt_logprobs) == 17
    engine.scheduler._preempt(seq)
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    assert seq.num_preemptions == 1
    _check_against_hf(outs[0].prompt_logprobs, ids, reference, 1, outs[0].prompt_logprob_ranks)


def test_out_of_range_is_refused_and_changes_nothing(llm):
    engine = llm.engine
    for bad in (-1, 21):
        with pytest.raises(RequestError) as info:
            engine.add_request("bad", PROMPT, [1, 2, 3], SamplingParams(prompt_logprobs=bad))
        assert info.value.param == "prompt_logprobs"
    assert not engine.has_unfinished_requests()


def test_a_step_reads_none_of_its_prompt_logprobs_back(monkeypatch):
    """A step only launches its prompt logprobs (on CUDA the host goes on to the next step meanwhile): on the meta
    device, where reading any value back raises, the step computes them all, and only `entries()` reads them."""
    pinned = []  # the targets go up as CUDA's do, through pinned memory (none on this machine: recorded instead)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda t, *a: pinned.append(t.nbytes) or t)
    rows = [plp_module.PromptRows("a", 0, 0, [5, 7, 9], 2), plp_module.PromptRows("b", 3, 4, [1], 0)]
    copy = plp_module.step_entries(rows, lambda r, i, end: torch.zeros(end - i, 50, device="meta"))
    assert copy.values.device.type == "meta" and tuple(copy.values.shape) == (3 * (2 + 2 * 2) + 1 * 2,)
    assert pinned == [3 * 8, 1 * 8]  # each group's int64 targets
    # torch's own error for reading a meta tensor's values ("Cannot copy out of meta tensor; no data!"): the read is
    # in `entries()`, nowhere before it
    with pytest.raises(NotImplementedError, match="meta tensor"):
        copy.entries()


def test_the_overlapped_steps_hand_them_back_equal(llm, hf_logprobs):
    """The CUDA control flow on the CPU (tokens left a tensor, the next step's inputs patched from it): chunked
    prompt logprobs, while another request decodes, still equal transformers'."""
    ids, reference = hf_logprobs
    ex, engine = llm.engine.executor, llm.engine
    assert not ex.overlaps and not engine._overlap
    ex.overlaps = engine._overlap = True
    try:
        outs = llm.generate([PROMPT[:40], PROMPT], [SamplingParams(max_tokens=6, temperature=0, ignore_eos=True),
                                                    SamplingParams(max_tokens=2, temperature=0, prompt_logprobs=3)])
    finally:
        ex.overlaps = engine._overlap = False
    _check_against_hf(outs[1].prompt_logprobs, ids, reference, 3, outs[1].prompt_logprob_ranks)
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
