"""Tool calls in a model's free output (`tool_choice: auto`), one parser per chat-template family:

- `hermes`: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, once per call (Qwen 2/2.5/3, Hermes,
  and the default model SmolLM2, whose `<tool_call>` holds a JSON list of calls);
- `llama3_json`: the whole answer is `{"name": ..., "parameters": {...}}`, optionally after `<|python_tag|>`,
  several separated by `;` (Llama 3.1/3.2/3.3's JSON tool calling).

A parser reads the text generated so far (`extract`): where the content ends (the text before the first call,
and before anything that may still become one) and the calls complete by then. `final` says the text is whole:
a tool region that then does not parse is content after all (as vLLM does)."""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text


@dataclass(frozen=True)
class Extraction:
    content_end: int  # text[:content_end] is content
    calls: list[ParsedCall]


class ToolParser(ABC):
    """One model family's tool-call format: splits generated text into content and the calls it holds."""

    name = ""

    @abstractmethod
    def extract(self, text: str, final: bool) -> Extraction:
        """The content end and the complete calls in `text`; `final`: no more text will come."""


def _call(obj: Any) -> ParsedCall | None:
    """One call object: {"name": str, "arguments" or "parameters": object or JSON text}."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return ParsedCall(obj["name"], json.dumps(args, ensure_ascii=False))


def _calls(body: str) -> list[ParsedCall] | None:
    """The calls in one JSON body (an object, or a list of objects); None if it is not that."""
    try:
        value = json.loads(body)
    except ValueError:
        return None
    items = value if isinstance(value, list) else [value]
    calls = [_call(v) for v in items]
    return None if any(c is None for c in calls) else calls  # type: ignore[return-value]


def _held_back(text: str, marker: str) -> int:
    """Where `text` ends once a tail that could be the start of `marker` is held back."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return len(text) - k
    return len(text)


class HermesParser(ToolParser):
    name = "hermes"
    START, END = "<tool_call>", "</tool_call>"
    _BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)

    def extract(self, text: str, final: bool) -> Extraction:
        start = text.find(self.START)
        if start < 0:
            return Extraction(len(text) if final else _held_back(text, self.START), [])
        region = text[start:]
        bodies = self._BLOCK.findall(region)
        tail = region[region.rfind(self.END) + len(self.END):] if bodies else region
        if final and self.START in tail:  # an unclosed last call (stopped at EOS or a stop string)
            bodies.append(tail[tail.find(self.START) + len(self.START):])
        calls: list[ParsedCall] = []
        for body in bodies:
            found = _calls(body.strip())
            if found is None:
                if final:
                    return Extraction(len(text), [])
                break
            calls.extend(found)
        if final and not calls:
            return Extraction(len(text), [])
        return Extraction(start, calls)


class Llama3JsonParser(ToolParser):
    name = "llama3_json"
    PYTHON_TAG = "<|python_tag|>"

    def extract(self, text: str, final: bool) -> Extraction:
        body = text.lstrip()
        if body.startswith(self.PYTHON_TAG):
            body = body[len(self.PYTHON_TAG):].lstrip()
        elif not body.startswith("{"):
            maybe_tag = bool(body) and self.PYTHON_TAG.startswith(body)
            if final or (body and not maybe_tag):
                return Extraction(len(text), [])
            return Extraction(0, [])  # nothing but whitespace or part of the tag yet
        if not final:
            return Extraction(0, [])  # a call is being written: it is known whole at the end
        calls = self._parse(body)
        return Extraction(0, calls) if calls else Extraction(len(text), [])

    @staticmethod
    def _parse(body: str) -> list[ParsedCall] | None:
        decoder = json.JSONDecoder()
        calls, pos = [], 0
        while pos < len(body):
            try:
                obj, pos = decoder.raw_decode(body, pos)
            except ValueError:
                return None
            call = _call(obj)
            if call is None:
                return None
            calls.append(call)
            while pos < len(body) and body[pos] in " \t\r\n;":
                pos += 1
        return calls


PARSERS: dict[str, ToolParser] = {p.name: p for p in (HermesParser(), Llama3JsonParser())}


def parser_for_template(template: str | None) -> ToolParser:
    """The parser for the format a chat template asks tool calls in (hermes when it names none: the format the
    server's own tools prompt asks for, `prompt.tools_system_prompt`)."""
    template = template or ""
    if "<|python_tag|>" in template or '"parameters": dictionary of argument name' in template:
        return PARSERS["llama3_json"]
    return PARSERS["hermes"]

