"""Tool calling without a server: the parsers on recorded model-style outputs (Qwen/Hermes, the default model
SmolLM2's list form, Llama 3 JSON), the parser chosen for a chat template, and the chat formatter's answers,
whole and streamed (a stream is read back with the official `openai` client's own chunk accumulator, which
must give the same message as the whole response)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

from hetero_infer.contracts.protocol import ChatCompletionRequest
from hetero_infer.worker.core.outputs import CompletionOutput, RequestDelta, RequestOutput, SampleDelta
from hetero_infer.worker.server.chat import ChatFormatter
from hetero_infer.worker.server.prompts import Prompt
from hetero_infer.worker.server.tools.parsers import (
    Extraction,
    HermesParser,
    Llama3JsonParser,
    ParsedCall,
    parser_for_template,
)

WEATHER = ParsedCall("get_weather", '{"city": "Paris", "unit": "celsius"}')
TIME = ParsedCall("get_time", "{}")

# (parser, model-style output, expected content, expected calls)
HERMES_CASES = [
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>',
     "", [WEATHER]),  # Qwen 2.5
    ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
     '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>', "Let me check.\n",
     [WEATHER, TIME]),  # Qwen, two calls after some text
    ('<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}, '
     '{"name": "get_time", "arguments": {}}]</tool_call>', "", [WEATHER, TIME]),  # SmolLM2's list form
    ('<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\", \\"unit\\": \\"celsius\\"}"}'
     '</tool_call>', "", [WEATHER]),  # arguments as JSON text
    ('<tool_call>\n{"name": "get_time", "arguments": {}}', "", [TIME]),  # stopped before the closing tag
    ("The weather in Paris is sunny.", "The weather in Paris is sunny.", []),
    ("Use <tool_call> tags like <tool_call>not json</tool_call>.",
     "Use <tool_call> tags like <tool_call>not json</tool_call>.", []),  # malformed: all content
    ('<tool_call>{"arguments": {}}</tool_call>', '<tool_call>{"arguments": {}}</tool_call>', []),  # no name
    ("x < y and <tool", "x < y and <tool", []),  # a tag's start, never finished
]
LLAMA_CASES = [
    ('{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}', "", [WEATHER]),
    ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}', "", [WEATHER]),
    ('{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}; {"name": "get_time", '
     '"parameters": {}}', "", [WEATHER, TIME]),
    (' \n{"name": "get_time", "arguments": {}}', "", [TIME]),
    ("Paris is sunny today.", "Paris is sunny today.", []),
    ('{"city": "Paris"}', '{"city": "Paris"}', []),  # JSON, but not a call
    ('{"name": "get_time", "parameters": {}', '{"name": "get_time", "parameters": {}', []),  # cut short
]
CASES = [(HermesParser(), *c) for c in HERMES_CASES] + [(Llama3JsonParser(), *c) for c in LLAMA_CASES]


@pytest.mark.parametrize(("parser", "text", "content", "calls"), CASES, ids=[f"{p.name}-{i}" for i, (p, *_) in
                                                                              enumerate(CASES)])
def test_parse_whole_output(parser: Any, text: str, content: str, calls: list[ParsedCall]) -> None:
    ext = parser.extract(text, final=True)
    assert (text[:ext.content_end], ext.calls) == (content, calls)
    assert [json.loads(c.arguments) for c in ext.calls] == [json.loads(c.arguments) for c in calls]


@pytest.mark.parametrize(("parser", "text", "content", "calls"), CASES, ids=[f"{p.name}-{i}" for i, (p, *_) in
                                                                              enumerate(CASES)])
def test_partial_outputs_never_take_back(parser: Any, text: str, content: str, calls: list[ParsedCall]) -> None:
    """At every prefix, the content so far and the calls so far are prefixes of the final ones: what a stream
    sends is never taken back."""
    for cut in range(len(text) + 1):
        ext: Extraction = parser.extract(text[:cut], final=False)
        assert content.startswith(text[:ext.content_end]), cut
        assert ext.calls == calls[:len(ext.calls)], cut


TEMPLATES = {
    # excerpts of the real templates, enough to tell the families apart
    "qwen2.5": '{%- for tool in tools %}{{- "\\n" }}{{- tool | tojson }}{%- endfor %}{{- "\\n</tools>\\n\\nFor each '
               'function call, return a json object with function name and arguments within <tool_call></tool_call>'
               ' XML tags' + '" }}',
    "llama3.1": '{%- if builtin_tools is defined or tools is not none %}{{- "Environment: ipython\\n" }}{%- endif %}'
                '{{- "<|python_tag|>" + tool_call.name }}',
    "llama3.2": '{{- \'Respond in the format {"name": function name, "parameters": dictionary of argument name and '
                'its value}.\' }}',
    "smollm2": "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
               "'<|im_end|>' + '\\n'}}{% endfor %}",
}


@pytest.mark.parametrize(("template", "parser"), [("qwen2.5", "hermes"), ("llama3.1", "llama3_json"),
                                                  ("llama3.2", "llama3_json"), ("smollm2", "hermes")])
def test_parser_for_template(template: str, parser: str) -> None:
    assert parser_for_template(TEMPLATES[template]).name == parser


# ------------------------------------------------------------------------------------ the chat formatter

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city"]}}},
         {"type": "function", "function": {"name": "get_time"}}]


def _formatter(template: str, stream: bool, **fields: Any) -> ChatFormatter:
    tok = SimpleNamespace(hf=SimpleNamespace(chat_template=TEMPLATES[template]))
    state = SimpleNamespace(model_name="m", tokenizer=tok, token_text=str)
    req = ChatCompletionRequest.model_validate_json(json.dumps(
        {"messages": [{"role": "user", "content": "weather?"}], "tools": TOOLS, "stream": stream, **fields}))
    fmt = ChatFormatter(state, req, [Prompt(None, [1])])
    fmt.bind(["r"])
    return fmt


def _whole(fmt: ChatFormatter, text: str, reason: str = "stop") -> dict[str, Any]:
    out = CompletionOutput(0, text, [1] * len(text), finish_reason=reason)
    return fmt.response([RequestOutput("r", None, [1], [out], finished=True)])["choices"][0]


def _streamed(fmt: ChatFormatter, pieces: list[str], reason: str = "stop") -> Any:
    """The stream's chunks accumulated by the openai client's own stream state."""
    state = ChatCompletionStreamState(input_tools=TOOLS)  # type: ignore[arg-type]
    for i, piece in enumerate(pieces):
        last = i == len(pieces) - 1
        delta = RequestDelta("r", [SampleDelta([1], piece, None, None, reason if last else None, None)], last, None,
                             [])
        for chunk in fmt.chunks([delta]):
            state.handle_chunk(ChatCompletionChunk.model_validate_json(chunk))
    if reason == "length":  # the client's final completion refuses a cut answer; its snapshot holds it
        return state.current_completion_snapshot.choices[0]
    return state.get_final_completion().choices[0]


def _splits(text: str) -> st.SearchStrategy[list[str]]:
    return st.sets(st.integers(1, max(1, len(text) - 1)), max_size=12).map(
        lambda cuts: [text[a:b] for a, b in zip([0, *sorted(cuts)], [*sorted(cuts), len(text)], strict=True)])


def _calls(message: Any) -> list[tuple[str, Any]]:
    calls = message.get("tool_calls") if isinstance(message, dict) else message.tool_calls
    if not calls:
        return []
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) if isinstance(c, dict)
            else (c.function.name, json.loads(c.function.arguments)) for c in calls]


AUTO_CASES = [("qwen2.5", t, c, k) for t, c, k in HERMES_CASES] + [("llama3.1", t, c, k) for t, c, k in LLAMA_CASES]


@pytest.mark.parametrize(("template", "text", "content", "calls"), AUTO_CASES,
                         ids=[f"{t}-{i}" for i, (t, *_) in enumerate(AUTO_CASES)])
@settings(max_examples=15, deadline=None, database=None)
@given(data=st.data())
def test_auto_whole_and_streamed(template: str, text: str, content: str, calls: list[ParsedCall],
                                 data: st.DataObject) -> None:
    whole = _whole(_formatter(template, False), text)
    expected_calls = [(c.name, json.loads(c.arguments)) for c in calls]
    assert _calls(whole["message"]) == expected_calls
    assert whole["finish_reason"] == ("tool_calls" if calls else "stop")
    assert whole["message"]["content"] == ((content.strip() or None) if calls else text)
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in whole["message"].get("tool_calls", []))
    streamed = _streamed(_formatter(template, True), data.draw(_splits(text), label="pieces"))
    assert _calls(streamed.message) == expected_calls
    assert streamed.finish_reason == whole["finish_reason"]
    assert (streamed.message.content or "").strip() == (content if calls else text).strip()


def test_a_call_cut_by_max_tokens_is_content() -> None:
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"ci'
    whole = _whole(_formatter("qwen2.5", False), text, "length")
    assert (whole["message"]["content"], whole["finish_reason"], _calls(whole["message"])) == (text, "length", [])
    streamed = _streamed(_formatter("qwen2.5", True), [text[:15], text[15:]], "length")
    assert (streamed.message.content, streamed.finish_reason) == (text, "length")


@pytest.mark.parametrize("stream", [False, True])
def test_named_choice_reads_the_output_as_arguments(stream: bool) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    text = '{"city": "Paris", "unit": "celsius"}'
    fmt = _formatter("smollm2", stream, tool_choice=named)
    if stream:
        choice = _streamed(fmt, [text[:5], text[5:20], text[20:]])
        assert _calls(choice.message) == [("get_weather", json.loads(text))] and choice.finish_reason == "stop"
    else:
        choice = _whole(fmt, text)
        assert _calls(choice["message"]) == [("get_weather", json.loads(text))]
        assert (choice["message"]["content"], choice["finish_reason"]) == (None, "stop")


@pytest.mark.parametrize("stream", [False, True])
def test_required_choice_reads_the_list_of_calls(stream: bool) -> None:
    text = '[{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "get_time", "parameters": {}}]'
    fmt = _formatter("smollm2", stream, tool_choice="required")
    expected = [("get_weather", {"city": "Paris"}), ("get_time", {})]
    if stream:
        choice = _streamed(fmt, [text[:7], text[7:]])
        assert _calls(choice.message) == expected and choice.finish_reason == "tool_calls"
    else:
        choice = _whole(fmt, text)
        assert _calls(choice["message"]) == expected and choice["finish_reason"] == "tool_calls"


def test_tool_choice_none_leaves_the_text_alone() -> None:
    text = '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    whole = _whole(_formatter("qwen2.5", False, tool_choice="none"), text)
    assert whole["message"] == {"role": "assistant", "content": text} and whole["finish_reason"] == "stop"


@pytest.mark.parametrize("stream", [False, True])
def test_parallel_tool_calls_false_keeps_the_first_call(stream: bool) -> None:
    text = HERMES_CASES[1][0]  # two calls
    fmt = _formatter("qwen2.5", stream, parallel_tool_calls=False)
    message = _streamed(fmt, [text[:40], text[40:]]).message if stream else _whole(fmt, text)["message"]
    assert _calls(message) == [("get_weather", {"city": "Paris", "unit": "celsius"})]
