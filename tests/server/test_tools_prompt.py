"""Tools in the prompt: rendered by the chat template itself when it knows tools (`tools=` to
`apply_chat_template`, earlier calls as `tool_calls` with their arguments as objects), or, for a template that
ignores them (the default model SmolLM2's), described in the system message in the hermes format the parser
reads back. Rendered with the default model's real tokenizer."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from hetero_infer.contracts.protocol import ChatCompletionRequest
from hetero_infer.contracts.tokenizer import Tokenizer
from hetero_infer.worker.runner.loader import resolve_model
from hetero_infer.worker.server.chat import chat_prompt

TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
                                         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
        "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "14 degrees"},
]
# A template in the style of Qwen 2.5's: tools listed in the system turn, calls in <tool_call> tags.
TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n<tools>{% for tool in tools %}{{ tool | tojson }}{% endfor %}</tools>"
    "<|im_end|>\n{%- endif %}"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{%- for c in m.tool_calls or [] %}<tool_call>{\"name\": \"{{ c.function.name }}\", \"arguments\": "
    "{{ c.function.arguments | tojson }}}</tool_call>{%- endfor %}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")


@pytest.fixture(scope="module")
def default_tok() -> Tokenizer:
    return Tokenizer.from_pretrained(resolve_model(None)[0])


@pytest.fixture(scope="module")
def tools_tok() -> Tokenizer:
    tok = Tokenizer.from_pretrained(resolve_model(None)[0])
    tok.hf.chat_template = TOOLS_TEMPLATE
    return tok


async def _render(tok: Tokenizer, **fields: Any) -> str:
    req = ChatCompletionRequest.model_validate_json(json.dumps({"messages": HISTORY, "tools": [TOOL], **fields}))
    state = SimpleNamespace(tokenizer=tok, require_tokenizer=lambda what, param=None: tok)
    prompt = await chat_prompt(state, req)  # type: ignore[arg-type]
    return tok.decode(prompt.token_ids, skip_special_tokens=False)


async def test_template_without_tools_gets_them_in_the_system_message(default_tok: Tokenizer) -> None:
    text = await _render(default_tok)
    system = text.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\n") and "<tool_call>" in system
    tools = json.loads(system[system.index("<tools>") + len("<tools>"):system.index("</tools>")])
    assert tools == [TOOL]
    assert '<|im_start|>assistant\n<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</tool_call>' \
        in text
    assert "<|im_start|>tool\n14 degrees<|im_end|>" in text and text.endswith("<|im_start|>assistant\n")


async def test_a_system_message_keeps_its_text_first(default_tok: Tokenizer) -> None:
    req_messages = [{"role": "system", "content": "Be terse."}, *HISTORY]
    text = await _render(default_tok, messages=req_messages)
    assert text.startswith("<|im_start|>system\nBe terse.\n\n") and "<tools>" in text.split("<|im_end|>")[0]
    assert text.count("<|im_start|>system") == 1


async def test_template_with_tools_renders_them(tools_tok: Tokenizer) -> None:
    text = await _render(tools_tok)
    assert text.startswith("<|im_start|>system\n<tools>" + json.dumps(TOOL))  # the template's own rendering
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>' in text  # an object
    assert "expert in composing functions" not in text  # not our fallback prompt


@pytest.mark.parametrize("which", ["default", "tools"])
async def test_tool_choice_none_leaves_the_tools_out(which: str, default_tok: Tokenizer, tools_tok: Tokenizer) -> None:
    tok = default_tok if which == "default" else tools_tok
    assert "<tools>" in await _render(tok)
    assert "<tools>" not in await _render(tok, tool_choice="none")
