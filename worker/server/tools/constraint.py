"""`tool_choice` required and named as a JSON schema for the structured-output engine (as vLLM builds them),
and the constrained output read back as tool calls."""

from __future__ import annotations

import json
from typing import Any

from hetero_infer.contracts.protocol import ChatCompletionRequest, NamedToolChoice, Tool
from hetero_infer.worker.server.tools.parsers import ParsedCall

EMPTY_OBJECT: dict[str, Any] = {"type": "object", "properties": {}}


def parameters_schema(tool: Tool) -> dict[str, Any]:
    return tool.function.parameters or EMPTY_OBJECT


def tool_constraint(req: ChatCompletionRequest) -> dict[str, Any] | None:
    """The schema the output must follow: a named choice generates that function's arguments object; `required`
    an array of at least one {"name", "parameters"} object, one alternative per tool. None otherwise."""
    mode = req.tool_mode
    tools = req.tools or []
    if mode == "named":
        assert isinstance(req.tool_choice, NamedToolChoice)
        return parameters_schema(_tool(tools, req.tool_choice.function.name))
    if mode != "required":
        return None
    items = {"type": "object", "anyOf": [
        {"properties": {"name": {"type": "string", "enum": [t.function.name]}, "parameters": parameters_schema(t)},
         "required": ["name", "parameters"]}
        for t in tools]}
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": items}
    if not req.parallel_tool_calls:
        schema["maxItems"] = 1
    return schema


def constrained_calls(req: ChatCompletionRequest, text: str) -> list[ParsedCall] | None:
    """The tool calls in an output generated under `tool_constraint` (None if it is not such JSON, e.g. cut by
    max_tokens)."""
    if req.tool_mode == "named":
        assert isinstance(req.tool_choice, NamedToolChoice)
        try:
            json.loads(text)
        except ValueError:
            return None
        return [ParsedCall(req.tool_choice.function.name, text.strip())]
    try:
        calls = json.loads(text)
    except ValueError:
        return None
    if not isinstance(calls, list):
        return None
    out = []
    for call in calls:
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return None
        out.append(ParsedCall(call["name"], json.dumps(call.get("parameters", {}), ensure_ascii=False)))
    return out


def _tool(tools: list[Tool], name: str) -> Tool:
    return next(t for t in tools if t.function.name == name)
