"""The sampler's grammar mask on a tiny vocabulary against an oracle that knows only the finite language: a token is
allowed iff the text so far plus the token is a prefix of some word of the language, EOS iff the text so far is
a word. The languages come from Python's `re` (regex), the choice list itself, or the JSON texts of an enum."""

from __future__ import annotations

import itertools
import json
import re

import pytest
import torch
import xgrammar as xgr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetero_infer.contracts.sampling_params import SamplingParams, StructuredOutputsParams
from hetero_infer.worker.runner.sampler import SamplingRow, process_logits
from hetero_infer.worker.structured import GrammarCache
from hetero_infer.worker.structured.mask import grammar_bitmasks

LETTERS = "abc\""
VOCAB = ([c for c in LETTERS] + ["".join(p) for p in itertools.product(LETTERS, repeat=2)]
         + ["".join(p) for p in itertools.product("abc", repeat=3)] + ["<eos>"])
EOS = len(VOCAB) - 1


@pytest.fixture(scope="module")
def cache() -> GrammarCache:
    info = xgr.TokenizerInfo(VOCAB, xgr.VocabType.RAW, vocab_size=len(VOCAB), stop_token_ids=[EOS])
    return GrammarCache(lambda: info)


def oracle(language: set[str], text: str) -> set[int]:
    allowed = {t for t, tok in enumerate(VOCAB[:EOS]) if any(w.startswith(text + tok) for w in language)}
    return allowed | ({EOS} if text in language else set())


def allowed_by_sampler(state, output: list[int]) -> set[int]:
    """The tokens process_logits leaves finite in a constrained row of a 3-row batch (rows 0 and 2 free), the row's
    mask filled from the matcher as the engine fills it."""
    logits = torch.randn(3, len(VOCAB))
    free = SamplingRow(SamplingParams(), [1], [])
    [mask] = grammar_bitmasks([state], [output], len(VOCAB))  # the engine's side: the grammar's next tokens, as data
    row = SamplingRow(SamplingParams(), [1], output, token_bitmask=mask)
    x = process_logits(logits, [free, row, free])
    assert torch.equal(x[0], logits[0]) and torch.equal(x[2], logits[2])  # unconstrained rows untouched
    finite = torch.isfinite(x[1])
    assert torch.equal(x[1][finite], logits[1][finite])  # allowed tokens keep their logits
    return set(finite.nonzero().flatten().tolist())


def walk(cache: GrammarCache, params: StructuredOutputsParams, language: set[str], choose) -> None:
    """Follow the grammar token by token (choose picks among the allowed), checking every mask."""
    state = cache.new_state(params)
    output: list[int] = []
    text = ""
    while True:
        allowed = allowed_by_sampler(state, output)
        assert allowed == oracle(language, text), (text, output)
        token = choose(sorted(allowed), text)
        output.append(token)
        if token == EOS:
            assert text in language
            state.sync(output)
            assert state.is_terminated
            return
        text += VOCAB[token]


def regex_language(pattern: str, max_len: int = 5) -> set[str]:
    return {"".join(p) for n in range(max_len + 1) for p in itertools.product(LETTERS, repeat=n)
            if re.fullmatch(pattern, "".join(p))}


words = st.text(alphabet="abc", min_size=1, max_size=4)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(choices=st.lists(words, min_size=1, max_size=4, unique=True), data=st.data())
def test_choice_mask_matches_the_oracle(cache, choices, data):
    walk(cache, StructuredOutputsParams(choice=choices), set(choices), lambda ts, _: data.draw(st.sampled_from(ts)))


@pytest.mark.parametrize("pattern", ["(ab|c){1,2}", "a+b?", "[ab]c{0,2}", "\"(a|bc)\"", "(a|b)(b|c)?a"])
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_regex_mask_matches_the_oracle(cache, pattern, data):
    # a+ is infinite: the walk's mask checks hold while the text is within the enumerated length, so pick EOS
    # once it is allowed from 3 characters on
    language = regex_language(pattern, 8)

    def choose(ts, text):
        return EOS if EOS in ts and len(text) >= 3 else data.draw(st.sampled_from(ts))

    walk(cache, StructuredOutputsParams(regex=pattern), language, choose)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(words, min_size=1, max_size=3, unique=True), data=st.data())
def test_json_enum_mask_matches_the_oracle(cache, values, data):
    params = StructuredOutputsParams(json={"enum": values}, disable_any_whitespace=True)
    walk(cache, params, {json.dumps(v) for v in values}, lambda ts, _: data.draw(st.sampled_from(ts)))


def test_every_sequence_has_its_own_state_and_grammars_compile_once(cache):
    params = StructuredOutputsParams(choice=["ab", "ca"])
    before = cache.compilations
    first, second = cache.new_state(params), cache.new_state(StructuredOutputsParams(choice=["ab", "ca"]))
    assert cache.compilations - before <= 1  # an equal spec is a cache hit
    a = VOCAB.index("a")
    assert allowed_by_sampler(first, [a]) == oracle({"ab", "ca"}, "a")
    assert allowed_by_sampler(second, []) == oracle({"ab", "ca"}, "")  # not moved by the first one's token


def test_eos_only_where_the_grammar_accepts(cache):
    state = cache.new_state(StructuredOutputsParams(regex="ab(c)?"))
    assert EOS not in allowed_by_sampler(state, [VOCAB.index("a")])
    assert EOS in allowed_by_sampler(state, [VOCAB.index("a"), VOCAB.index("b")])
    state = cache.new_state(StructuredOutputsParams(regex="abc"))
    assert allowed_by_sampler(state, [VOCAB.index("abc")]) == {EOS}
