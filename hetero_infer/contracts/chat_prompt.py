"""Messages for the chat template when a request has tools: assistant tool calls and their arguments as the
templates expect them (`tool_calls[].function.arguments` an object), and, for a template that does not render
tools itself (the default model's), the tools described in a system message in the hermes format, the format
SmolLM2 was tuned on (`<tools>` in the system prompt, `<tool_call>[...]</tool_call>` in the answer)."""

from __future__ import annotations

import json
from typing import Any

from hetero_infer.contracts.protocol import ChatCompletionRequest, ChatMessage, Tool

TOOLS_PROMPT = (
    "You are an expert in composing functions. You are given a question and a set of possible functions. "
    "Based on the question, you will need to make one or more function/tool calls to achieve the purpose. "
    "If none of the functions can be used, answer the question directly without a tool call.\n\n"
    "You have access to the following tools:\n<tools>{tools}</tools>\n\n"
    "To call tools, answer with only this, where the arguments follow each function's parameters schema:\n"
    '<tool_call>[{{"name": "func_name1", "arguments": {{"argument1": "value1"}}}}]</tool_call>'
)


def template_renders_tools(template: str | None) -> bool:
    """Whether a chat template renders the `tools` it is given itself (else they go in a system message)."""
    return bool(template) and "tools" in template  # type: ignore[operator]


def tool_dicts(tools: list[Tool]) -> list[dict[str, Any]]:
    """Tools as the chat templates read them (OpenAI's shape, unset fields left out)."""
    return [t.model_dump(exclude_none=True) for t in tools]


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def template_messages(messages: list[ChatMessage], tools: list[Tool] | None,
                      template_renders_tools: bool) -> list[dict[str, Any]]:
    """The messages for `apply_chat_template`; without template support for tools, the tools go in a system
    message and earlier calls in the assistant's text, in the hermes format."""
    out: list[dict[str, Any]] = []
    for m in messages:
        msg: dict[str, Any] = {"role": m.role, "content": m.text()}
        if m.name:
            msg["name"] = m.name
        if m.tool_call_id:
            msg["tool_call_id"] = m.tool_call_id
        if m.tool_calls:
            calls = [{"name": c.function.name, "arguments": _arguments(c.function.arguments)} for c in m.tool_calls]
            if template_renders_tools:
                msg["tool_calls"] = [{"id": c.id, "type": "function", "function": call}
                                     for c, call in zip(m.tool_calls, calls, strict=True)]
            else:
                msg["content"] += f"<tool_call>{json.dumps(calls, ensure_ascii=False)}</tool_call>"
        out.append(msg)
    if tools and not template_renders_tools:
        prompt = TOOLS_PROMPT.format(tools=json.dumps(tool_dicts(tools), ensure_ascii=False))
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{prompt}" if out[0]["content"] else prompt}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out


def chat_template_inputs(req: ChatCompletionRequest, template: str | None) -> tuple[list[dict[str, Any]],
                                                                                  dict[str, Any]]:
    """The messages and keyword arguments a chat request is rendered with (`Tokenizer.apply_chat_template`): tools
    go to the template when the request may call them (tool_choice other than none). The worker's chat prompt and
    the router's prefix hashes (router/prompt.py) both come from here, so they are the same tokens."""
    tools = req.tools if req.tool_mode != "none" else None
    renders = template_renders_tools(template)
    kwargs: dict[str, Any] = {"add_generation_prompt": req.add_generation_prompt}
    if tools and renders:
        kwargs["tools"] = tool_dicts(tools)
    return template_messages(req.messages, tools, renders), kwargs
