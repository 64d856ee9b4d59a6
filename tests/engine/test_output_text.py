"""The text a finished sample carries, against references the engine does not compute (issue 15, defects 6 and 7).

- A cut (max_tokens, or any finish) inside a multi-byte character: the text is what an incremental UTF-8
  decoder makes of the kept tokens' bytes (GPT-2's byte mapping, which the default tokenizer uses): complete
  characters only, never a trailing U+FFFD.
- A stop token (stop_token_ids, EOS): as vLLM, the token stays in token_ids but its text is left out unless
  include_stop_str_in_output; the reference is the tokenizer's own decode of the ids whose text is kept.

Tokens are scripted with a logits processor on the mock executor's logits, so each case is exact and fast.
"""

from __future__ import annotations

import codecs

import pytest
import torch
from transformers.convert_slow_tokenizer import bytes_to_unicode

from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.contracts.sampling_params import SamplingParams
from hetero_infer.worker.core.detokenizer import DeltaDetokenizer, IncrementalDetokenizer
from hetero_infer.worker.core.engine import LLMEngine

TEXT = "ok 😀 日本語 é!"
PROMPT = [100, 200, 300]
_BYTE_OF = {c: b for b, c in bytes_to_unicode().items()}


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    return LLMEngine(EngineConfig(executor="mock", mock_logits=True, max_model_len=256, max_num_blocks=64))


def reference_text(tokenizer, ids: list[int]) -> str:
    """The complete characters of the tokens' bytes: an incremental decoder holds a trailing incomplete one."""
    data = bytes(_BYTE_OF[c] for tok in tokenizer.hf.convert_ids_to_tokens(ids) for c in tok)
    return codecs.getincrementaldecoder("utf-8")("replace").decode(data, final=False)


def scripted(tokens: list[int]):
    """A logits processor that makes the sampler pick tokens[k] as the k-th output token."""
    def force(output_ids: list[int], row: torch.Tensor) -> torch.Tensor:
        forced = torch.full_like(row, float("-inf"))
        forced[tokens[len(output_ids) % len(tokens)]] = 0.0
        return forced
    return force


def generate(engine: LLMEngine, tokens: list[int], **kw) -> tuple:
    """(final output of sample 0, the text its streamed deltas add up to)."""
    params = SamplingParams(temperature=0.0, logits_processors=[scripted(tokens)], **kw)
    request_id = f"r{id(params)}"
    engine.add_request(request_id, None, PROMPT, params)
    text = DeltaDetokenizer(engine.tokenizer)  # the frontend's: the engine's deltas carry token ids only
    text.add(request_id, PROMPT, params)
    streamed = []
    final = None
    while engine.has_unfinished_requests():
        for delta in engine.step_deltas():
            text.fill(delta)
            streamed.append(delta.samples[0].text)
            if delta.finished:
                final = delta.samples[0]
    return final, "".join(streamed)


def test_the_reference_sees_incomplete_characters(engine):
    ids = engine.tokenizer.encode(TEXT, add_special_tokens=False)
    assert reference_text(engine.tokenizer, ids) == TEXT
    cuts = [k for k in range(1, len(ids)) if engine.tokenizer.decode(ids[:k]).endswith("\ufffd")]
    assert len(cuts) >= 4  # the emoji and the CJK characters span several tokens


def test_a_finished_detokenizer_never_ends_inside_a_character(engine):
    tok = engine.tokenizer
    ids = tok.encode(TEXT, add_special_tokens=False)
    for k in range(1, len(ids) + 1):
        detok = IncrementalDetokenizer(tok, PROMPT, SamplingParams())
        for token in ids[:k]:
            detok.add_token(token)
        assert detok.emittable_text(finished=True) == reference_text(tok, ids[:k]), k


def test_max_tokens_cut_inside_a_character(engine):
    tok = engine.tokenizer
    ids = tok.encode(TEXT, add_special_tokens=False)
    for k in range(1, len(ids) + 1):
        out, streamed = generate(engine, ids, max_tokens=k, ignore_eos=True)
        assert out.finish_reason == "length" and streamed == reference_text(tok, ids[:k]), k
        assert not streamed.endswith("\ufffd")


def test_stop_token_text_is_left_out_unless_asked_for(engine):
    tok = engine.tokenizer
    ids = tok.encode(" one two three four", add_special_tokens=False)
    stop = ids[2]
    out, streamed = generate(engine, ids, max_tokens=8, stop_token_ids=[stop])
    assert (out.finish_reason, out.stop_reason) == ("stop", stop)
    assert streamed == tok.decode(ids[:2]) == " one two"
    out, streamed = generate(engine, ids, max_tokens=8, stop_token_ids=[stop], include_stop_str_in_output=True)
    assert (out.finish_reason, streamed) == ("stop", tok.decode(ids[:3]))


@pytest.mark.parametrize("include", [False, True])
def test_eos_text_is_left_out_unless_asked_for_even_when_special_tokens_are_shown(engine, include):
    tok = engine.tokenizer
    [eos] = engine.eos_token_ids
    ids = tok.encode(" one two", add_special_tokens=False) + [eos]
    out, streamed = generate(engine, ids, max_tokens=8, skip_special_tokens=False, include_stop_str_in_output=include)
    assert (out.finish_reason, out.stop_reason) == ("stop", None)
    assert streamed == tok.decode(ids if include else ids[:-1], skip_special_tokens=False)
