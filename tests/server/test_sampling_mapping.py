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

from hetero_infer.contracts.protocol import ChatCompletionRequest, CompletionRequest
from hetero_infer.contracts.sampling_params import SamplingParams, StructuredOutputsParams
from hetero_infer.worker.core.request_check import EngineLimits
from hetero_infer.worker.server.errors import APIError
from hetero_infer.worker.server.prompts import (
    DEFAULT_COMPLETION_MAX_TOKENS,
    Prompt,
    parse_request,
    request_sampling_params,
)

MAX_MODEL_LEN = 512
VOCAB = 1000
PROMPT = Prompt("hi", [11, 12, 13])
ROOM = MAX_MODEL_LEN - len(PROMPT.token_ids)
MESSAGES = [{"role": "user", "content": "hi"}]
WEATHER_ARGS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_ARGS}}
TIME = {"type": "function", "function": {"name": "get_time"}}
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
_schema = st.fixed_dictionaries({"type": st.just("object"), "properties": st.dictionaries(
    st.text("abc", min_size=1, max_size=3), st.sampled_from([{"type": "string"}, {"type": "integer"}]), max_size=3)})
_regex = st.lists(st.sampled_from(["a", "b+", "[ab]", "c*", "(x|y)", "[0-9]{2}"]), min_size=1, max_size=4).map("".join)
_choices = st.lists(st.text("xyz", min_size=1, max_size=3), min_size=1, max_size=4)


def _so(**kw: Any) -> Any:
    return lambda v: {"structured_outputs": asdict(StructuredOutputsParams(**{k: (v if f is None else f(v))
                                                                              for k, f in kw.items()}))}


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
    "logit_bias": (st.dictionaries(st.integers(0, VOCAB - 1).map(str), st.floats(-100.0, 100.0), min_size=1,
                                   max_size=5), lambda v: {"logit_bias": {int(k): b for k, b in v.items()}}),
    # Structured outputs: each form sets the one constraint it names.
    "response_format": (st.sampled_from([{"type": "json_object"}, {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "required": ["a"]}, "strict": True}}]),
        lambda v: {"structured_outputs": asdict(StructuredOutputsParams(json_object=True) if v["type"] == "json_object"
                                                else StructuredOutputsParams(json=v["json_schema"]["schema"]))}),
    "guided_json": (_schema, _so(json=None)),
    "guided_regex": (_regex, _so(regex=None)),
    "guided_choice": (_choices, _so(choice=None)),
    "guided_grammar": (st.sampled_from(['root ::= "a" | "b"', "root ::= [0-9]+"]), _so(grammar=None)),
    "structured_outputs": (st.one_of(st.builds(lambda r: {"regex": r}, _regex),
                                     st.builds(lambda s: {"json": s}, _schema),
                                     st.builds(lambda c: {"choice": c, "disable_any_whitespace": True}, _choices)),
                           lambda v: {"structured_outputs": asdict(StructuredOutputsParams(**v))}),
    # Fields that only shape the response (or name the model, or are ignored): no sampling parameter changes.
    "user": (st.text(max_size=5), lambda v: {}),
    "stream": (st.booleans(), lambda v: {}),
    "guided_decoding_backend": (st.sampled_from(["xgrammar", "outlines"]), lambda v: {}),
    "guided_whitespace_pattern": (st.just(r"[ ]?"), lambda v: {}),
}
COMPLETIONS_ONLY: dict[str, tuple[st.SearchStrategy, Any]] = {
    "max_tokens": (st.integers(1, ROOM).filter(lambda v: v != DEFAULT_COMPLETION_MAX_TOKENS),
                   lambda v: {"max_tokens": v}),
    "logprobs": (st.integers(0, 20), lambda v: {"logprobs": v}),
    "echo": (st.just(True), lambda v: {}),
    "best_of": (st.integers(1, 64), lambda v: {"best_of": v}),
}
CHAT_ONLY: dict[str, tuple[st.SearchStrategy, Any]] = {
    "max_tokens": (st.integers(1, ROOM - 1), lambda v: {"max_tokens": v}),
    "max_completion_tokens": (st.integers(1, ROOM - 1), lambda v: {"max_tokens": v}),
    "add_generation_prompt": (st.just(False), lambda v: {}),
    "parallel_tool_calls": (st.booleans(), lambda v: {}),
    "tools": (st.just([WEATHER]), lambda v: {}),  # auto: parsed from the output, no constraint
    "tool_choice": (st.sampled_from(["none", "auto"]), lambda v: {}),
}
CONSTRAINTS = {"response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
               "structured_outputs"}  # at most one per request
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
    names = data.draw(st.sets(st.sampled_from(sorted(set(COMMON) - CONSTRAINTS)), min_size=2), label="fields")
    names |= data.draw(st.sets(st.sampled_from(sorted(CONSTRAINTS)), max_size=1), label="constraint")
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


def test_echo_with_logprobs_asks_for_the_prompts_logprobs() -> None:
    assert _changes("completions", echo=True, logprobs=3) == {"logprobs": 3, "prompt_logprobs": 3}
    assert _changes("completions", echo=True, logprobs=0) == {"logprobs": 0, "prompt_logprobs": 0}
    assert _changes("completions", echo=False, logprobs=3) == {"logprobs": 3}


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


def test_best_of_more_than_max_num_seqs() -> None:
    with pytest.raises(APIError) as e:
        _params("completions", best_of=65)
    assert e.value.status == 400 and e.value.param == "best_of"
    assert _changes("completions", n=3, best_of=64) == {"n": 3, "best_of": 64}


def test_logit_bias_outside_the_vocabulary() -> None:
    assert _changes("chat", logit_bias={str(VOCAB - 1): -100}) == {"logit_bias": {VOCAB - 1: -100.0}}
    with pytest.raises(APIError) as e:
        _params("chat", logit_bias={str(VOCAB): 1})
    assert e.value.status == 400 and e.value.param == "logit_bias" and str(VOCAB) in e.value.message


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_response_format_text_is_no_constraint(endpoint: str) -> None:
    assert _changes(endpoint, response_format={"type": "text"}) == {}
    assert _changes(endpoint, structured_outputs={}) == {}


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_guided_json_as_text(endpoint: str) -> None:
    schema = {"type": "object", "properties": {"a": {"enum": [1, 2]}}}
    assert _params(endpoint, guided_json=json.dumps(schema)).structured_outputs == StructuredOutputsParams(json=schema)
    assert _params(endpoint, structured_outputs={"json": json.dumps(schema)}).structured_outputs == \
        StructuredOutputsParams(json=schema)


def test_tool_choice_named_constrains_to_the_functions_parameters() -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    assert _changes("chat", tools=[TIME, WEATHER], tool_choice=named) == {
        "structured_outputs": asdict(StructuredOutputsParams(json=WEATHER_ARGS, disable_any_whitespace=True))}
    named_time = {"type": "function", "function": {"name": "get_time"}}  # no parameters: an empty object
    assert _params("chat", tools=[TIME, WEATHER], tool_choice=named_time).structured_outputs == \
        StructuredOutputsParams(json={"type": "object", "properties": {}}, disable_any_whitespace=True)


@pytest.mark.parametrize("parallel", [True, False])
def test_tool_choice_required_constrains_to_a_list_of_calls(parallel: bool) -> None:
    """vLLM's schema: an array of at least one {"name", "parameters"} object, one alternative per tool."""
    jsonschema = pytest.importorskip("jsonschema")
    so = _params("chat", tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=parallel).structured_outputs
    assert so is not None and so.disable_any_whitespace and set(asdict(so)) - {"json", "disable_any_whitespace"} == {
        k for k, v in asdict(so).items() if v is None}
    schema = so.json
    jsonschema.Draft202012Validator.check_schema(schema)
    ok = [{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "get_time", "parameters": {}}]
    assert jsonschema.Draft202012Validator(schema).is_valid(ok[:1])
    assert jsonschema.Draft202012Validator(schema).is_valid(ok) is parallel
    for bad in ([], [{"name": "get_weather", "parameters": {}}], [{"name": "nope", "parameters": {}}],
                [{"name": "get_weather"}], {"name": "get_time", "parameters": {}}):
        assert not jsonschema.Draft202012Validator(schema).is_valid(bad), bad


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_null_is_the_default(endpoint: str) -> None:
    """Defect 2: every field OpenAI or vLLM lets be null is accepted as null and means its default."""
    nullable = ["n", "stream", "min_tokens", "ignore_eos", "skip_special_tokens", "include_stop_str_in_output",
                "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed", "stop", "stop_token_ids",
                "presence_penalty", "frequency_penalty", "logit_bias", "stream_options", "user", "max_tokens",
                "logprobs", "response_format", "guided_json", "structured_outputs"]
    nullable += ["echo", "best_of", "suffix"] if endpoint == "completions" else [
        "max_completion_tokens", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls", "add_generation_prompt"]
    assert _changes(endpoint, **dict.fromkeys(nullable)) == {}


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_unknown_fields_are_ignored_with_a_warning(endpoint: str, caplog: pytest.LogCaptureFixture) -> None:
    """Defect 8, vLLM's behaviour: the request is served and a warning names each ignored top-level field."""
    model = CompletionRequest if endpoint == "completions" else ChatCompletionRequest
    body = {"prompt": "hi"} if endpoint == "completions" else {"messages": MESSAGES}
    with caplog.at_level("WARNING", logger="hetero_infer.server"):
        req = parse_request(json.dumps({**body, "temprature": 0.5, "zz_future": {"a": 1}, "n": 2}), model)
    assert req.n == 2 and req.temperature is None
    assert [r.getMessage() for r in caplog.records] == [
        "The following fields were present in the request but ignored: ['temprature', 'zz_future']"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="hetero_infer.server"):
        parse_request(json.dumps(body), model)
    assert caplog.records == []
