"""Tools and the issue's API defects over HTTP with the official `openai` client, on the mock server: OpenAI's
documented function-calling example works unmodified (request, tool-call round trip, streaming helper), the
legacy `functions` get a clear 400, null fields are accepted (defect 2), unknown fields are served and logged
by name (defect 8, vLLM's behaviour). The mock's text is random, so what the model calls is checked with the
parsers' own tests and on the real model (test_tools_real_model.py)."""

from __future__ import annotations

import json

import openai
import pytest
from server_proc import ServerProcess, http

# OpenAI's function-calling guide, as published (https://platform.openai.com/docs/guides/function-calling)
TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get current temperature for a given location.",
        "parameters": {
            "type": "object",
            "properties": {"location": {"type": "string", "description": "City and country e.g. Bogotá, Colombia"}},
            "required": ["location"],
            "additionalProperties": False,
        },
        "strict": True,
    },
}]
MESSAGES = [{"role": "user", "content": "What is the weather like in Paris today?"}]


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=30)


def test_documented_example(client: openai.OpenAI, model_name: str) -> None:
    completion = client.chat.completions.create(model=model_name, messages=MESSAGES, tools=TOOLS, max_tokens=8)
    choice = completion.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length", "tool_calls")
    for call in choice.message.tool_calls or []:  # whatever the mock wrote, a call is well formed
        assert call.function.name == "get_weather" and isinstance(json.loads(call.function.arguments), dict)


def test_tool_result_round_trip(client: openai.OpenAI, model_name: str) -> None:
    """The guide's second step: the assistant's call and the tool's result go back in the messages."""
    messages = [*MESSAGES,
                {"role": "assistant", "content": None, "tool_calls": [{
                    "id": "call_12345xyz", "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"location":"Paris, France"}'}}]},
                {"role": "tool", "tool_call_id": "call_12345xyz", "content": "14"}]
    completion = client.chat.completions.create(model=model_name, messages=messages, tools=TOOLS, max_tokens=4)
    assert completion.choices[0].message.role == "assistant"
    # the assistant message object the client returned can be sent back as it is
    messages.append(completion.choices[0].message)  # type: ignore[arg-type]
    messages.append({"role": "user", "content": "And tomorrow?"})
    assert client.chat.completions.create(model=model_name, messages=messages, tools=TOOLS, max_tokens=2).choices


@pytest.mark.parametrize("tool_choice", ["none", "auto"])  # required and named: test_structured_api.py
def test_tool_choices_are_accepted_and_streamed(client: openai.OpenAI, model_name: str, tool_choice: object) -> None:
    with client.chat.completions.stream(model=model_name, messages=MESSAGES, tools=TOOLS,  # type: ignore[arg-type]
                                        tool_choice=tool_choice, max_tokens=6) as stream:
        try:
            for _ in stream:
                pass
        except openai.LengthFinishReasonError:  # the helper's verdict on an answer cut by max_tokens
            pass
        snapshot = stream.current_completion_snapshot
    assert snapshot.choices[0].message.role == "assistant"
    assert snapshot.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_legacy_functions_are_refused_clearly(client: openai.OpenAI, model_name: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=model_name, messages=MESSAGES, functions=[TOOLS[0]["function"]],
                                       max_tokens=2)
    assert "tools" in info.value.message and info.value.body["param"] == "functions"  # type: ignore[index]


def test_suffix_is_refused_clearly(client: openai.OpenAI, model_name: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=model_name, prompt="def f(", suffix="return x", max_tokens=2)
    assert "fill-in-the-middle" in info.value.message and info.value.body["param"] == "suffix"  # type: ignore[index]


def test_null_fields_are_accepted(server: ServerProcess) -> None:
    """Defect 2: what clients send for "unset" (many SDKs serialize every field)."""
    common = {"n": None, "stream": None, "min_tokens": None, "ignore_eos": None, "skip_special_tokens": None,
              "include_stop_str_in_output": None, "stop": None, "seed": None, "logit_bias": None, "user": None}
    r = http("POST", server.base_url + "/completions", {"prompt": "hi", "max_tokens": 2, "echo": None,
                                                        "best_of": None, "logprobs": None, **common})
    assert r.status == 200 and len(r.json()["choices"]) == 1, r.text
    r = http("POST", server.base_url + "/chat/completions", {
        "messages": MESSAGES, "max_tokens": 2, "logprobs": None, "top_logprobs": None, "tools": None,
        "tool_choice": None, "response_format": None, "stream_options": None, **common})
    assert r.status == 200 and r.json()["choices"][0]["logprobs"] is None, r.text


def test_unknown_fields_are_served_and_logged(server: ServerProcess, client: openai.OpenAI, model_name: str) -> None:
    """Defect 8, vLLM's behaviour: ignored, with a warning naming them."""
    r = client.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=2,
                                       extra_body={"not_a_field_xyz": 1, "guided_whatever": "x"})
    assert r.choices
    line = "The following fields were present in the request but ignored: ['guided_whatever', 'not_a_field_xyz']"
    assert any(line in entry for entry in list(server.lines))
