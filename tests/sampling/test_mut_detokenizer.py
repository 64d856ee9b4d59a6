"""Detokenizer cases that mutation testing found unchecked (docs/testing.md)."""

from __future__ import annotations

import pytest

from hetero_infer.worker.core.sampling_params import SamplingParams
from hetero_infer.worker.detokenizer import IncrementalDetokenizer
from hetero_infer.worker.tokenizer import Tokenizer


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
