"""/v1/chat/completions: messages (and tools) rendered with the model's chat template, assistant deltas and
messages; tool calls read from the output (`tools/`): parsed for `tool_choice: auto`, read back from the
constrained JSON for `required` and a named function."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from jinja2 import TemplateError

from hetero_infer.contracts.chat_prompt import chat_template_inputs
from hetero_infer.contracts.protocol import ChatCompletionRequest, NamedToolChoice
from hetero_infer.worker.core.outputs import CompletionOutput, RequestOutput, SampleDelta
from hetero_infer.worker.server.errors import bad_request
from hetero_infer.worker.server.formatting import Choice, Formatter, dumps, json_reason, json_str
from hetero_infer.worker.server.generate import generate
from hetero_infer.worker.server.ids import new_id
from hetero_infer.worker.server.prompts import (
    TOKENIZE_INLINE_MAX_CHARS,
    Prompt,
    off_loop_if,
    parse_body,
    prompt_logprobs_of,
    request_sampling_params,
)
from hetero_infer.worker.server.state import ServerState, get_state
from hetero_infer.worker.server.structured import prepare_grammar
from hetero_infer.worker.server.tools.constraint import constrained_calls
from hetero_infer.worker.server.tools.parsers import (
    ParsedCall,
    ToolParser,
    parser_for_template,
)


async def create_chat_completion(request: web.Request) -> web.StreamResponse:
    arrival = time.monotonic()
    state = get_state(request)
    req: ChatCompletionRequest = await parse_body(request, ChatCompletionRequest)
    lora_request = state.check_model(req.model)
    state.check_serving()
    prompt = await chat_prompt(state, req)
    params = [request_sampling_params(state, req, prompt)]
    fmt = ChatFormatter(state, req, [prompt])
    return await generate(request, state, [prompt], params, fmt, arrival, req.stream,
                          bool(req.stream_options and req.stream_options.include_usage),
                          lambda: prepare_grammar(state, req, params[0]), lora_request)


def chat_template(state: ServerState) -> str | None:
    return getattr(getattr(state.tokenizer, "hf", None), "chat_template", None)


async def chat_prompt(state: ServerState, req: ChatCompletionRequest) -> Prompt:
    """The prompt: the messages (and tools) rendered with the chat template (`chat_template_inputs`)."""
    state.require_tokenizer("a chat request", "messages")
    messages, kwargs = chat_template_inputs(req, chat_template(state))
    chars = sum(len(m["content"]) for m in messages) + (len(json.dumps(kwargs["tools"])) if "tools" in kwargs else 0)
    try:
        ids = await off_loop_if(chars > TOKENIZE_INLINE_MAX_CHARS, state.tokenizer.apply_chat_template,
                                messages, **kwargs)
    except (ValueError, TypeError, TemplateError) as exc:  # the template rejects these messages (e.g. role order)
        raise bad_request(f"the messages could not be rendered with the chat template: {exc}", "messages") from None
    return Prompt(None, list(ids))


def _tool_call(call: ParsedCall) -> dict[str, Any]:
    return {"id": f"call_{new_id()[8:]}", "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


def _finish(reason: str | None, called: bool, tool_mode: str) -> str | None:
    """OpenAI's finish_reason: "tool_calls" when calls were made, except for a named tool choice, where OpenAI
    answers "stop" (measured against its API in vLLM PR 25054; vLLM matches it)."""
    return "tool_calls" if called and reason == "stop" and tool_mode != "named" else reason


@dataclass
class _ToolStream:
    """What a streamed choice has seen and sent, in a tool mode."""

    text: str = ""
    content_sent: int = 0
    calls_sent: int = 0


class ChatFormatter(Formatter):
    object_name = "chat.completion"
    chunk_object = "chat.completion.chunk"
    id_prefix = "chatcmpl-"

    def __init__(self, state: Any, req: ChatCompletionRequest, prompts: list[Prompt]) -> None:
        super().__init__(state, req.n, prompts, req.model)
        self.req = req
        self.top_n = (req.top_logprobs or 0) if req.logprobs else None
        self.tool_mode = req.tool_mode
        self.parser: ToolParser | None = parser_for_template(chat_template(state)) if self.tool_mode == "auto" else None
        self.max_calls = None if req.parallel_tool_calls else 1  # auto; `required` has it in its schema
        self.prompt_top = prompt_logprobs_of(req)

    def response(self, outputs: list[RequestOutput]) -> dict[str, Any]:
        out = super().response(outputs)
        if self.prompt_top is not None:  # vLLM's: the one prompt's, beside the choices
            out["prompt_logprobs"] = self.vllm_prompt_logprobs(0)
        return out

    def _logprobs(self, token_ids: list[int], entries: list[dict[int, float]] | None) -> dict[str, Any]:
        content = []
        for text, raw, lp, top in self._token_logprobs(token_ids, entries, self.top_n or 0):
            content.append({
                "token": text, "logprob": lp, "bytes": list(raw),
                "top_logprobs": [{"token": t, "logprob": v, "bytes": list(b)} for t, b, v in top],
            })
        return {"content": content}

    # ------------------------------------------------------------------------------------------ streamed
    def _chunk(self, idx: int, d: SampleDelta, ch: Choice) -> str:
        if self.tool_mode != "none":
            return self._tool_chunk(idx, d, ch)
        if self.top_n is None:
            role = "" if ch.started else '"role":"assistant",'
            return self._base_chunk(f'{{"index":{idx},"delta":{{{role}"content":{json_str(d.text)}}},'
                                    f'"logprobs":null,"finish_reason":{json_reason(d.finish_reason)}}}')
        delta: dict[str, Any] = {"role": "assistant", "content": d.text} if not ch.started else {"content": d.text}
        return self._base_chunk(dumps({"index": idx, "delta": delta, "logprobs": self._logprobs(d.token_ids, d.logprobs),
                                       "finish_reason": d.finish_reason}))

    def _tool_chunk(self, idx: int, d: SampleDelta, ch: Choice) -> str:
        s: _ToolStream = ch.extra if ch.extra is not None else _ToolStream()
        ch.extra = s
        s.text += d.text
        final = d.finish_reason is not None
        content, calls = self._stream_step(s, d.text, final)
        delta: dict[str, Any] = {} if ch.started else {"role": "assistant", "content": ""}
        if content:
            delta["content"] = content
        if calls:
            delta["tool_calls"] = calls
        logprobs = self._logprobs(d.token_ids, d.logprobs) if self.top_n is not None else None
        return self._base_chunk(dumps({"index": idx, "delta": delta, "logprobs": logprobs,
                                       "finish_reason": _finish(d.finish_reason, s.calls_sent > 0, self.tool_mode)}))

    def _stream_step(self, s: _ToolStream, new_text: str, final: bool) -> tuple[str, list[dict[str, Any]]]:
        """(content to send, tool-call deltas to send) for what a choice gained."""
        if self.tool_mode == "named":  # the arguments are the output itself: stream them as they come
            assert isinstance(self.req.tool_choice, NamedToolChoice)
            if s.calls_sent == 0:
                s.calls_sent = 1
                call = _tool_call(ParsedCall(self.req.tool_choice.function.name, new_text))
                return "", [{"index": 0, **call}]
            return "", [{"index": 0, "function": {"arguments": new_text}}] if new_text else []
        if self.tool_mode == "required":  # one JSON array: known whole at the end
            if not final:
                return "", []
            found = constrained_calls(self.req, s.text)
            if found is None:
                return s.text, []
            s.calls_sent = len(found)
            return "", [{"index": i, **_tool_call(c)} for i, c in enumerate(found)]
        assert self.parser is not None
        ext = self.parser.extract(s.text, final)
        content = s.text[s.content_sent:ext.content_end] if ext.content_end > s.content_sent else ""
        s.content_sent = max(s.content_sent, ext.content_end)
        calls = ext.calls[:self.max_calls]
        new_calls = [{"index": i, **_tool_call(c)} for i, c in enumerate(calls) if i >= s.calls_sent]
        s.calls_sent = max(s.calls_sent, len(calls))
        return content, new_calls

    # -------------------------------------------------------------------------------------- whole response
    def _choice(self, idx: int, c: CompletionOutput) -> dict[str, Any]:
        logprobs = self._logprobs(c.token_ids, c.logprobs) if self.top_n is not None else None
        message: dict[str, Any] = {"role": "assistant", "content": c.text}
        calls: list[ParsedCall] | None = None
        if self.tool_mode == "auto":
            assert self.parser is not None
            ext = self.parser.extract(c.text, final=True)
            calls = ext.calls[:self.max_calls]
            if calls:
                message["content"] = c.text[:ext.content_end].strip() or None
        elif self.tool_mode in ("named", "required"):
            calls = constrained_calls(self.req, c.text)
            if calls:
                message["content"] = None
        if calls:
            message["tool_calls"] = [_tool_call(call) for call in calls]
        return {"index": idx, "message": message, "logprobs": logprobs,
                "finish_reason": _finish(c.finish_reason, bool(calls), self.tool_mode)}
