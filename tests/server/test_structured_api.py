"""Structured outputs and constrained tool calls end to end with the official `openai` client: on the mock
that returns pseudo-random logits (`sampling_server`: the real sampler and grammar mask, any token possible),
and on the real default model (torch executor, CPU). Every answer parses and validates against its JSON schema
(checked with `jsonschema`), whole and streamed; tool calls come back with arguments valid for their tool."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import jsonschema
import openai
import pytest
from server_proc import ServerProcess

# Strings are bounded: on random logits an unbounded string ends only by chance.
PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 10},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "role": {"enum": ["admin", "user", "guest"]},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 3},
    "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                                 "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["city", "zip"], "additionalProperties": False}},
    "required": ["name", "age", "role", "tags", "address"], "additionalProperties": False}
SCORES = {"type": "array", "items": {"type": "number", "minimum": 0, "maximum": 1}, "minItems": 1, "maxItems": 4}
FLAG = {"type": "object", "properties": {"ok": {"type": "boolean"}, "level": {"enum": [1, 2, 3]}},
        "required": ["ok", "level"]}
SCHEMAS = {"person": PERSON, "scores": SCORES, "flag": FLAG}
WEATHER_ARGS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                 "unit": {"enum": ["celsius", "fahrenheit"]}},
                "required": ["city", "unit"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city.",
                                           "parameters": WEATHER_ARGS}},
         {"type": "function", "function": {"name": "get_time", "description": "The time now.",
                                           "parameters": {"type": "object", "properties": {}}}}]
ASK = [{"role": "user", "content": "Describe a user of our site as JSON."}]
WEATHER_Q = [{"role": "user", "content": "What is the weather in Paris?"}]
RANDOM = {"temperature": 1.0, "seed": 11, "max_tokens": 200}


def _fmt(name: str) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name], "strict": True}}


def _compact(name: str) -> dict[str, Any]:
    """vLLM's form with whitespace off: random logits would otherwise spend the budget on JSON whitespace."""
    return {"structured_outputs": {"json": SCHEMAS[name], "disable_any_whitespace": True}}


def _streamed_text(stream: Any) -> tuple[str, str | None]:
    text, reason = "", None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            reason = chunk.choices[0].finish_reason or reason
    return text, reason


def _args(tool_calls: Any) -> list[tuple[str, Any]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in tool_calls]


def _valid_call(name: str, args: Any) -> None:
    schema = next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == name)
    jsonschema.validate(args, schema)


# ------------------------------------------------------------------------------------------ mock logits


@pytest.fixture(scope="module")
def sclient(sampling_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=sampling_server.base_url, api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def smodel(sclient: openai.OpenAI) -> str:
    return sclient.models.list().data[0].id


@pytest.mark.parametrize("name", [pytest.param(n, marks=[] if n == "flag" else pytest.mark.slow)
                                  for n in sorted(SCHEMAS)])  # the grammar mask costs ~0.1 s a step on 2 cores
def test_json_schema_whole_and_streamed(sclient: openai.OpenAI, smodel: str, name: str) -> None:
    r = sclient.chat.completions.create(model=smodel, messages=ASK, extra_body=_compact(name), n=2, **RANDOM)
    for choice in r.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content or ""), SCHEMAS[name])
    text, reason = _streamed_text(sclient.chat.completions.create(
        model=smodel, messages=ASK, extra_body=_compact(name), stream=True, **RANDOM))
    assert reason == "stop"
    jsonschema.validate(json.loads(text), SCHEMAS[name])


@pytest.mark.slow
def test_completions(sclient: openai.OpenAI, smodel: str) -> None:
    c = sclient.completions.create(model=smodel, prompt="JSON:", extra_body=_compact("person"), **RANDOM)
    jsonschema.validate(json.loads(c.choices[0].text), PERSON)


def test_vllm_guided_fields(sclient: openai.OpenAI, smodel: str) -> None:
    r = sclient.chat.completions.create(model=smodel, messages=ASK, extra_body={"guided_choice": ["yes", "no"]},
                                        n=4, **RANDOM)
    assert {c.message.content for c in r.choices} <= {"yes", "no"}
    r = sclient.chat.completions.create(model=smodel, messages=ASK, extra_body={"guided_regex": r"[a-c]{3}-\d\d"},
                                        **RANDOM)
    assert re.fullmatch(r"[a-c]{3}-\d\d", r.choices[0].message.content or "")
    r = sclient.chat.completions.create(model=smodel, messages=ASK, **RANDOM,
                                        extra_body={"structured_outputs": {"choice": ["left", "right"]}})
    assert r.choices[0].message.content in ("left", "right")


def test_an_invalid_schema_is_a_400_naming_the_field(sclient: openai.OpenAI, smodel: str) -> None:
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "minProperties": "2"}}}
    with pytest.raises(openai.BadRequestError) as info:
        sclient.chat.completions.create(model=smodel, messages=ASK, response_format=bad)  # type: ignore[arg-type]
    assert info.value.body["param"] == "response_format" and "minProperties" in info.value.message  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as info:
        sclient.completions.create(model=smodel, prompt="x", extra_body={"guided_regex": "(unclosed"})
    assert info.value.body["param"] == "guided_regex"  # type: ignore[index]


@pytest.mark.parametrize("seeds", [range(1), pytest.param(range(1, 4), marks=pytest.mark.slow)])
@pytest.mark.parametrize("stream", [False, True])
def test_required_tool_calls_validate(sclient: openai.OpenAI, smodel: str, stream: bool, seeds: range) -> None:
    for seed in seeds:
        kw = {**RANDOM, "seed": seed}
        if stream:
            with sclient.chat.completions.stream(model=smodel, messages=WEATHER_Q, tools=TOOLS,  # type: ignore[arg-type]
                                                 tool_choice="required", **kw) as s:
                choice = s.get_final_completion().choices[0]
        else:
            choice = sclient.chat.completions.create(model=smodel, messages=WEATHER_Q, tools=TOOLS,  # type: ignore[arg-type]
                                                     tool_choice="required", **kw).choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
        for name, args in _args(choice.message.tool_calls):
            _valid_call(name, args)


@pytest.mark.parametrize("stream", [False, True])
def test_named_tool_call_validates(sclient: openai.OpenAI, smodel: str, stream: bool) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    if stream:
        with sclient.chat.completions.stream(model=smodel, messages=WEATHER_Q, tools=TOOLS,  # type: ignore[arg-type]
                                             tool_choice=named, **RANDOM) as s:  # type: ignore[arg-type]
            choice = s.get_final_completion().choices[0]
    else:
        choice = sclient.chat.completions.create(model=smodel, messages=WEATHER_Q, tools=TOOLS,  # type: ignore[arg-type]
                                                 tool_choice=named, **RANDOM).choices[0]  # type: ignore[arg-type]
    assert choice.finish_reason == "stop"  # OpenAI's answer for a named tool choice (vLLM PR 25054)
    [(name, args)] = _args(choice.message.tool_calls)
    assert name == "get_weather"
    _valid_call(name, args)


# Characters beyond U+FFFF (4 UTF-8 bytes, a surrogate pair in JSON's \\u escapes): guided_choice once answered
# '\ufffd' * 5 for ["🌍"]; each kind of constraint must give back exactly these characters.
ASTRAL = ["🌍", "🚀", "\U0001d11e", "😀 ok", "日本🌍"]


@pytest.mark.parametrize("stream", [False, True])
def test_characters_beyond_the_bmp(sclient: openai.OpenAI, smodel: str, stream: bool) -> None:
    def ask(**constraint: Any) -> tuple[str, str | None]:
        kw = {"model": smodel, "messages": ASK, "temperature": 1.0, "max_tokens": 40, **constraint}
        if stream:
            return _streamed_text(sclient.chat.completions.create(stream=True, **kw))
        c = sclient.chat.completions.create(**kw).choices[0]
        return c.message.content or "", c.finish_reason

    seen = set()
    for seed in range(6):
        text, reason = ask(seed=seed, extra_body={"guided_choice": ASTRAL})
        assert text in ASTRAL and reason == "stop", (text, reason)
        seen.add(text)
    assert len(seen) > 1  # the mask leaves every choice open, not just one spelling
    text, reason = ask(extra_body={"guided_choice": ["🌍"]})
    assert (text, reason) == ("🌍", "stop")
    text, reason = ask(seed=3, extra_body={"guided_regex": "[🌍🚀\U0001d11e]{3}"})
    assert re.fullmatch("[🌍🚀\U0001d11e]{3}", text) and reason == "stop", text
    schema = {"type": "object", "properties": {"p": {"enum": ASTRAL}}, "required": ["p"], "additionalProperties": False}
    # compact: random logits would otherwise spend the budget on JSON whitespace
    text, reason = ask(seed=4, extra_body={"structured_outputs": {"json": schema, "disable_any_whitespace": True}})
    assert json.loads(text)["p"] in ASTRAL and reason == "stop", text


# ------------------------------------------------------------------------------------- the real model
# slow: a model load (~1.5 min on two loaded cores) and ~1 min of CPU decoding




@pytest.fixture(scope="module")
def real() -> Iterator[ServerProcess]:
    s = ServerProcess("--max-model-len", "1024", executor="torch", start_timeout=300)
    yield s
    assert s.stop() == 0, s.log()


@pytest.fixture(scope="module")
def rclient(real: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=real.base_url, api_key="unused", max_retries=0, timeout=300)


@pytest.mark.slow
def test_real_model_tool_calls(rclient: openai.OpenAI) -> None:
    """The default model with required and named tool choices, greedy and sampled, whole and streamed."""
    model = rclient.models.list().data[0].id
    named = {"type": "function", "function": {"name": "get_weather"}}
    for tool_choice, extra in (("required", {"temperature": 0.0}), ("required", {"temperature": 0.8, "seed": 1}),
                               (named, {"temperature": 0.0}), (named, {"temperature": 0.8, "seed": 2})):
        r = rclient.chat.completions.create(model=model, messages=WEATHER_Q, tools=TOOLS,  # type: ignore[arg-type]
                                            tool_choice=tool_choice, max_tokens=120, **extra)  # type: ignore[arg-type]
        choice = r.choices[0]
        assert choice.finish_reason == ("tool_calls" if tool_choice == "required" else "stop"), choice
        for name, args in _args(choice.message.tool_calls):
            _valid_call(name, args)
        with rclient.chat.completions.stream(model=model, messages=WEATHER_Q, tools=TOOLS,  # type: ignore[arg-type]
                                             tool_choice=tool_choice, max_tokens=120, **extra) as s:
            streamed = s.get_final_completion().choices[0]
        if extra["temperature"] == 0.0:  # greedy: the stream gives the same calls
            assert _args(streamed.message.tool_calls) == _args(choice.message.tool_calls)


@pytest.mark.slow
def test_real_model_json_schemas(rclient: openai.OpenAI) -> None:
    model = rclient.models.list().data[0].id
    for name in sorted(SCHEMAS):
        r = rclient.chat.completions.create(model=model, messages=ASK, response_format=_fmt(name),  # type: ignore[arg-type]
                                            max_tokens=200, temperature=0.0)
        assert r.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(r.choices[0].message.content or ""), SCHEMAS[name])
        text, reason = _streamed_text(rclient.chat.completions.create(
            model=model, messages=ASK, response_format=_fmt(name), max_tokens=200, temperature=0.0,  # type: ignore[arg-type]
            stream=True))
        assert (text, reason) == (r.choices[0].message.content, "stop")
