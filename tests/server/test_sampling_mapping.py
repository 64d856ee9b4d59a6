"""The request -> `SamplingParams` mapping, field by field, without a server.

For every field that /v1/completions and /v1/chat/completions accept, setting it changes exactly the
`SamplingParams` attributes it names (a `dataclasses.asdict` diff against the default request's params) and
nothing else: a swapped penalty, a dropped `top_k` or an ignored `seed` changes the diff. What the engine then
does with the params is checked end to end in test_openai_client.py (a mock that returns logits).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero_infer.worker.core.request_check import EngineLimits
from hetero_infer.worker.core.sampling_params import SamplingParams
from hetero_infer.worker.server.errors import APIError
from hetero_infer.worker.server.prompts import DEFAULT_COMPLETION_MAX_TOKENS, Prompt, request_sampling_params
from hetero_infer.worker.server.protocol import ChatCompletionRequest, CompletionRequest

MAX_MODEL_LEN = 512
VOCAB = 1000
PROMPT = Prompt("hi", [11, 12, 13])
ROOM = MAX_MODEL_LEN - len(PROMPT.token_ids)
MESSAGES = [{"role": "user", "content": "hi"}]
FAST = settings(max_examples=25, deadline=None, database=None)


def _state() -> Any:
    """The server limits the mapping reads (ServerState's attributes of the same names)."""
    return SimpleNamespace(limits=EngineLimits("m", MAX_MODEL_LEN, VOCAB, 1 << 20, 16, ()), max_num_seqs=64)


def _params(endpoint: str, **fields: Any) -> SamplingParams:
    if endpoint == "completions":
        req: Any = CompletionRequest.model_validate_json(json.dumps({"prompt": "hi", **fields}))
    else:
        req = ChatCompletionRequest.model_validate_json(json.dumps({"messages": MESSAGES, **fields}))
    return request_sampling_params(_state(), req, PROMPT)


def _changes(endpoint: str, **fields: Any) -> dict[str, Any]:
    """The SamplingParams attributes that differ from the default request's, with their new values."""
    base, new = asdict(_params(endpoint)), asdict(_params(endpoint, **fields))
    return {k: v for k, v in new.items() if v != base[k]}


ENDPOINTS = ["completions", "chat"]

# field -> (strategy for a non-default value, expected changes for that value)
_unit = st.floats(0.01, 1.0)
_penalty = st.floats(-2.0, 2.0).filter(lambda v: v != 0.0)
COMMON: dict[str, tuple[st.SearchStrategy, Any]] = {
    "n": (st.integers(2, 64), lambda v: {"n": v}),
    "temperature": (st.floats(0.0, 2.0).filter(lambda v: v != 1.0), lambda v: {"temperature": v}),
    "top_p": (st.floats(0.01, 1.0, exclude_max=True), lambda v: {"top_p": v}),
    "top_k": (st.integers(1, VOCAB - 1), lambda v: {"top_k": v}),
    "min_p": (_unit, lambda v: {"min_p": v}),
    "min_tokens": (st.integers(1, DEFAULT_COMPLETION_MAX_TOKENS), lambda v: {"min_tokens": v}),
    "stop": (st.lists(st.text("ab\n", min_size=1, max_size=3), min_size=1, max_size=4),
             lambda v: {"stop": v, "stop_strings": v}),
    "stop_token_ids": (st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=5),
                       lambda v: {"stop_token_ids": v}),
    "ignore_eos": (st.just(True), lambda v: {"ignore_eos": True}),
    "seed": (st.integers(-(2**63), 2**63 - 1), lambda v: {"seed": v}),
    "presence_penalty": (_penalty, lambda v: {"presence_penalty": v}),
    "frequency_penalty": (_penalty, lambda v: {"frequency_penalty": v}),
    "repetition_penalty": (st.floats(0.01, 2.0).filter(lambda v: v != 1.0), lambda v: {"repetition_penalty": v}),
    "skip_special_tokens": (st.just(False), lambda v: {"skip_special_tokens": False}),
    "include_stop_str_in_output": (st.just(True), lambda v: {"include_stop_str_in_output": True}),
    # Fields that only shape the response (or name the model): no sampling parameter changes.
    "user": (st.text(max_size=5), lambda v: {}),
    "stream": (st.booleans(), lambda v: {}),
}
COMPLETIONS_ONLY: dict[str, tuple[st.SearchStrategy, Any]] = {
    "max_tokens": (st.integers(1, ROOM).filter(lambda v: v != DEFAULT_COMPLETION_MAX_TOKENS),
                   lambda v: {"max_tokens": v}),
    "logprobs": (st.integers(0, 20), lambda v: {"logprobs": v}),
    "echo": (st.just(True), lambda v: {}),
}
CHAT_ONLY: dict[str, tuple[st.SearchStrategy, Any]] = {
    "max_tokens": (st.integers(1, ROOM - 1), lambda v: {"max_tokens": v}),
    "max_completion_tokens": (st.integers(1, ROOM - 1), lambda v: {"max_tokens": v}),
    "add_generation_prompt": (st.just(False), lambda v: {}),
}
FIELDS = {"completions": {**COMMON, **COMPLETIONS_ONLY}, "chat": {**COMMON, **CHAT_ONLY}}
CASES = [(e, f) for e in ENDPOINTS for f in FIELDS[e]]


def test_default_request() -> None:
    """An empty request samples like SamplingParams' own defaults, with the endpoint's default length."""
    assert _params("completions") == SamplingParams(max_tokens=DEFAULT_COMPLETION_MAX_TOKENS)
    assert _params("chat") == SamplingParams(max_tokens=ROOM)  # chat: the rest of the context


@pytest.mark.parametrize(("endpoint", "name"), CASES, ids=[f"{e}-{f}" for e, f in CASES])
@FAST
@given(data=st.data())
def test_each_field_changes_only_its_parameter(endpoint: str, name: str, data: st.DataObject) -> None:
    strategy, expected = FIELDS[endpoint][name]
    value = data.draw(strategy, label=name)
    assert _changes(endpoint, **{name: value}) == expected(value)


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@FAST
@given(data=st.data())
def test_fields_together(endpoint: str, data: st.DataObject) -> None:
    """Any combination maps to the union of the single-field changes (no field overrides another)."""
    names = data.draw(st.sets(st.sampled_from(sorted(COMMON)), min_size=2), label="fields")
    body = {n: data.draw(COMMON[n][0], label=n) for n in names}
    expected: dict[str, Any] = {}
    for n in names:
        expected.update(COMMON[n][1](body[n]))
    assert _changes(endpoint, **body) == expected


@pytest.mark.parametrize("endpoint", ENDPOINTS)
@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        # Explicit OpenAI defaults are the defaults.
        ({"temperature": 1.0, "top_p": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "n": 1}, {}),
        ({"top_k": -1}, {}), ({"top_k": 0}, {}),  # vLLM: -1 and 0 disable top-k
        ({"top_k": VOCAB}, {}), ({"top_k": VOCAB + 5}, {}),  # at least the vocabulary: no filter
        ({"min_p": 0.0, "repetition_penalty": 1.0, "min_tokens": 0, "stop_token_ids": []}, {}),
        ({"seed": 0}, {"seed": 0}),  # seed 0 is a seed, not "unset"
        ({"temperature": 0.0}, {"temperature": 0.0}),  # greedy, not "unset"
        ({"stop": "ab"}, {"stop": ["ab"], "stop_strings": ["ab"]}),  # one string is a list of one
        ({"stop": ["", "x"]}, {"stop": ["", "x"], "stop_strings": ["x"]}),  # empty stop strings never match
    ],
)
def test_edge_values(endpoint: str, fields: dict[str, Any], expected: dict[str, Any]) -> None:
    assert _changes(endpoint, **fields) == expected


def test_chat_logprobs() -> None:
    assert _changes("chat", logprobs=True) == {"logprobs": 0}  # the chosen token's logprob only
    assert _changes("chat", logprobs=True, top_logprobs=5) == {"logprobs": 5}
    assert _changes("chat", logprobs=False) == {}


def test_chat_max_completion_tokens_wins_over_max_tokens() -> None:
    assert _changes("chat", max_tokens=3, max_completion_tokens=7) == {"max_tokens": 7}
    assert _changes("chat", max_tokens=7, max_completion_tokens=3) == {"max_tokens": 3}


def test_completions_default_length_is_capped_by_the_context() -> None:
    long_prompt = Prompt(None, list(range(MAX_MODEL_LEN - 5)))
    req = CompletionRequest.model_validate_json('{"prompt": "x"}')
    assert request_sampling_params(_state(), req, long_prompt).max_tokens == 5


@pytest.mark.parametrize(
    ("endpoint", "fields", "param"),
    [
        ("completions", {"max_tokens": ROOM + 1}, "max_tokens"),
        ("chat", {"max_tokens": ROOM + 1}, "max_tokens"),
        ("chat", {"max_completion_tokens": ROOM + 1}, "max_completion_tokens"),
        ("completions", {"min_tokens": DEFAULT_COMPLETION_MAX_TOKENS + 1}, "min_tokens"),
        ("chat", {"min_tokens": 5, "max_tokens": 4}, "min_tokens"),
        ("completions", {"n": 65}, "n"),  # more than the server's max_num_seqs
    ],
)
def test_out_of_range_for_this_server(endpoint: str, fields: dict[str, Any], param: str) -> None:
    with pytest.raises(APIError) as e:
        _params(endpoint, **fields)
    assert e.value.status == 400 and e.value.param == param
