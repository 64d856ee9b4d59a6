"""`GrammarCache.prepare`: grammars compile on the cache's own threads, never the caller's; one compile per spec
however many wait for it; a compile still queued at its deadline is dropped (CompileTimeout), one that fails is
a ConstraintError for its waiters; once prepared, `new_state` (the engine loop) finds the grammar compiled.
And characters beyond U+FFFF in `choice`: the grammar holds their UTF-8 bytes, not two surrogate halves."""

from __future__ import annotations

import threading
import time

import pytest
import xgrammar as xgr

from hetero_infer.contracts.sampling_params import StructuredOutputsParams
from hetero_infer.worker.structured import CompileTimeout, ConstraintError, GrammarCache, spec_of

VOCAB = ["a", "b", "ab", "🌍", "🚀", "日本", "é", "x", "\U0001d11e", '"', "\n", "\\", "<eos>"]
EOS = len(VOCAB) - 1


def _info() -> xgr.TokenizerInfo:
    return xgr.TokenizerInfo(VOCAB, xgr.VocabType.RAW, vocab_size=len(VOCAB), stop_token_ids=[EOS])


class GatedInfo:
    """A tokenizer-info factory that blocks the first compile until `release()`, recording its thread."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.threads: list[str] = []

    def __call__(self) -> xgr.TokenizerInfo:
        self.threads.append(threading.current_thread().name)
        assert self.gate.wait(30)
        return _info()


def spec(**kw):
    return spec_of(StructuredOutputsParams(**kw))


def test_prepare_compiles_on_its_own_threads_once_per_spec() -> None:
    info = GatedInfo()
    cache = GrammarCache(info, threads=2)
    first = cache.prepare(spec(choice=["ab", "b"]))
    again = cache.prepare(spec(choice=["ab", "b"]), deadline=time.monotonic() - 1)  # joins the first: no timeout
    assert again is first and not first.done()  # the caller did not wait for the compile
    info.gate.set()
    assert first.result(30) is None
    assert info.threads and all(t.startswith("grammar-compile") for t in info.threads)
    assert cache.compilations == 1
    state = cache.new_state(StructuredOutputsParams(choice=["ab", "b"]))  # what the engine loop does: a cache hit
    assert cache.compilations == 1 and state.accept(VOCAB.index("ab"))
    assert cache.prepare(spec(choice=["ab", "b"])).done()  # cached: done at once


def test_a_compile_still_queued_at_its_deadline_is_dropped() -> None:
    info = GatedInfo()
    cache = GrammarCache(info, threads=1)
    blocker = cache.prepare(spec(regex="a+"))
    late = cache.prepare(spec(regex="b+"), deadline=time.monotonic() + 0.05)
    time.sleep(0.1)
    info.gate.set()
    assert blocker.result(30) is None
    with pytest.raises(CompileTimeout):
        late.result(30)
    assert cache.compilations == 1  # b+ was never compiled
    assert cache.prepare(spec(regex="b+")).result(30) is None  # asked again without a deadline: compiled


def test_a_grammar_that_does_not_parse_fails_its_waiters_only() -> None:
    cache = GrammarCache(_info)
    bad = cache.prepare(spec(grammar="root ::= (("))
    with pytest.raises(ConstraintError, match="invalid grammar"):
        bad.result(30)
    assert cache.prepare(spec(choice=["a"])).result(30) is None  # the threads live on


@pytest.mark.parametrize("choices", [["🌍"], ["🌍", "🚀"], ["日本🌍", "é\U0001d11e"], ['"🌍"\n', "\\🚀"]])
def test_astral_choices_are_their_utf8_bytes(choices: list[str]) -> None:
    """The matcher walks the exact characters of each choice, token by token, to its end."""
    cache = GrammarCache(_info)
    for choice in choices:
        state = cache.new_state(StructuredOutputsParams(choice=choices))
        text = choice
        while text:
            token = next(t for t in sorted(VOCAB[:EOS], key=len, reverse=True) if text.startswith(t))
            assert state.accept(VOCAB.index(token)), (choice, text)
            text = text[len(token):]
        assert state.accept(EOS) and state.is_terminated


def test_an_astral_choice_rejects_what_is_not_it() -> None:
    cache = GrammarCache(_info)
    state = cache.new_state(StructuredOutputsParams(choice=["🌍"]))
    assert not state.accept(VOCAB.index("🚀"))


def test_a_cancelled_waiter_leaves_the_compile_threads_working() -> None:
    info = GatedInfo()
    cache = GrammarCache(info, threads=1)
    shared = cache.prepare(spec(regex="a+"))
    assert shared.cancel()  # an asyncio waiter that gave up would cancel the future it wraps
    info.gate.set()
    assert cache.prepare(spec(regex="b+")).result(30) is None  # the only thread survived
    assert cache.prepare(spec(regex="a+")).result(30) is None and cache.compilations == 2  # a+ was cached
