"""Detokenizer cases that mutation testing found unchecked (docs/testing.md)."""

from __future__ import annotations

import pytest

from hetero_infer.contracts.sampling_params import SamplingParams
from hetero_infer.contracts.tokenizer import Tokenizer
from hetero_infer.worker.core.detokenizer import IncrementalDetokenizer


@pytest.mark.parametrize("stops", [[" hel", " hello"], [" hello", " hel"]])
def test_stop_strings_starting_at_the_same_place_the_first_listed_wins(
    smol_tokenizer: Tokenizer, stops: list[str]
) -> None:
    """Both complete on one token (" hello" is a single token) and start at the same character: the
    earlier in the request's list wins, as in vLLM, which checks them in list order."""
    ids = smol_tokenizer.encode("say hello there", add_special_tokens=False)
    assert " hello" in [smol_tokenizer.hf.convert_tokens_to_string([t]) for t in
                        smol_tokenizer.hf.convert_ids_to_tokens(ids)]
    detok = IncrementalDetokenizer(smol_tokenizer, [], SamplingParams(stop=stops, include_stop_str_in_output=True))
    hits = [s for s in (detok.add_token(i) for i in ids) if s is not None]
    assert hits == [stops[0]] and detok.stop_string == stops[0]
    assert detok.text == "say" + stops[0]


def _metaspace_tokenizer() -> Tokenizer:
    """A SentencePiece-style decoder (it drops the space of a text's first word) with a special token."""
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    raw = RawTokenizer(models.WordLevel({"<unk>": 0, "▁Hello": 1, "▁world": 2, "<s>": 3}, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Metaspace()
    raw.decoder = decoders.Metaspace()
    hf = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>", additional_special_tokens=["<s>"])
    tok = Tokenizer(hf)
    assert 3 in tok.special_token_ids
    return tok


def _first_output(tok: Tokenizer, prompt: list[int]) -> str:
    detok = IncrementalDetokenizer(tok, prompt, SamplingParams())  # skip_special_tokens by default
    detok.add_token(2)
    return detok.text


def test_a_word_after_a_skipped_special_token_is_context() -> None:
    """Special tokens inside the prompt's tail are skipped, not an end of the context: the output
    continues the word after them (leading space kept)."""
    tok = _metaspace_tokenizer()
    assert _first_output(tok, [3, 1]) == " world"
    assert _first_output(tok, [3]) == "world"  # no word before: SentencePiece drops the space


@pytest.mark.parametrize("specials", range(7))
def test_the_context_looks_at_the_last_seven_prompt_ids(specials: int) -> None:
    """vLLM's window: the last _PROMPT_CONTEXT + 2 = 7 prompt ids (2 of slack for skipped special
    tokens); a word six special tokens before the output still gives it its leading space."""
    tok = _metaspace_tokenizer()
    assert _first_output(tok, [1] + [3] * specials) == " world"


def test_a_short_text_that_could_begin_a_stop_string_is_held_back(smol_tokenizer: Tokenizer) -> None:
    """Nothing is streamed while the whole text could still be the start of a stop string: "H" may
    become "Hello", which is then cut from the output, so an emitted "H" could never be taken back."""
    h = smol_tokenizer.hf.convert_tokens_to_ids("H")
    rest = smol_tokenizer.encode("ello", add_special_tokens=False)
    detok = IncrementalDetokenizer(smol_tokenizer, [], SamplingParams(stop=["Hello"]))
    assert detok.add_token(h) is None and detok.text == "H"
    assert detok.emittable_text(finished=False) == ""
    hits = [s for s in (detok.add_token(i) for i in rest) if s is not None]
    assert hits == ["Hello"] and detok.text == ""
