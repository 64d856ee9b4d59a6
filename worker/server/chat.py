"""/v1/chat/completions: messages rendered with the model's chat template, assistant deltas and messages."""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web
from jinja2 import TemplateError

from hetero_infer.worker.core.outputs import CompletionOutput, SampleDelta
from hetero_infer.worker.server.errors import bad_request
from hetero_infer.worker.server.formatting import Choice, Formatter, dumps, json_reason, json_str
from hetero_infer.worker.server.generate import generate
from hetero_infer.worker.server.prompts import (
    TOKENIZE_INLINE_MAX_CHARS,
    Prompt,
    off_loop_if,
    parse_body,
    request_sampling_params,
)
from hetero_infer.worker.server.protocol import ChatCompletionRequest
from hetero_infer.worker.server.state import ServerState, get_state


async def create_chat_completion(request: web.Request) -> web.StreamResponse:
    arrival = time.monotonic()
    state = get_state(request)
    req: ChatCompletionRequest = await parse_body(request, ChatCompletionRequest)
    state.check_model(req.model)
    state.check_serving()
    prompt = await chat_prompt(state, req)
    params = [request_sampling_params(state, req, prompt)]
    fmt = ChatFormatter(state, req, [prompt])
    return await generate(request, state, [prompt], params, fmt, arrival, req.stream,
                          bool(req.stream_options and req.stream_options.include_usage))


async def chat_prompt(state: ServerState, req: ChatCompletionRequest) -> Prompt:
    messages = [{"role": m.role, "content": m.text(), **({"name": m.name} if m.name else {})}
                for m in req.messages]
    chars = sum(len(m["content"]) for m in messages)
    try:
        ids = await off_loop_if(chars > TOKENIZE_INLINE_MAX_CHARS, state.tokenizer.apply_chat_template,
                                messages, add_generation_prompt=req.add_generation_prompt)
    except (ValueError, TypeError, TemplateError) as exc:  # the template rejects these messages (e.g. role order)
        raise bad_request(f"the messages could not be rendered with the chat template: {exc}", "messages") from None
    return Prompt(None, list(ids))


class ChatFormatter(Formatter):
    object_name = "chat.completion"
    chunk_object = "chat.completion.chunk"
    id_prefix = "chatcmpl-"

    def __init__(self, state: Any, req: ChatCompletionRequest, prompts: list[Prompt]) -> None:
        super().__init__(state, req.n, prompts)
        self.top_n = (req.top_logprobs or 0) if req.logprobs else None

    def _logprobs(self, token_ids: list[int], entries: list[dict[int, float]] | None) -> dict[str, Any]:
        content = []
        for text, lp, top in self._token_logprobs(token_ids, entries, self.top_n or 0):
            content.append({
                "token": text, "logprob": lp, "bytes": list(text.encode()),
                "top_logprobs": [{"token": t, "logprob": v, "bytes": list(t.encode())} for t, v in top],
            })
        return {"content": content}

    def _chunk(self, idx: int, d: SampleDelta, ch: Choice) -> str:
        if self.top_n is None:
            role = "" if ch.started else '"role":"assistant",'
            return self._base_chunk(f'{{"index":{idx},"delta":{{{role}"content":{json_str(d.text)}}},'
                                    f'"logprobs":null,"finish_reason":{json_reason(d.finish_reason)}}}')
        delta: dict[str, Any] = {"role": "assistant", "content": d.text} if not ch.started else {"content": d.text}
        return self._base_chunk(dumps({"index": idx, "delta": delta, "logprobs": self._logprobs(d.token_ids, d.logprobs),
                                       "finish_reason": d.finish_reason}))

    def _choice(self, idx: int, c: CompletionOutput) -> dict[str, Any]:
        logprobs = self._logprobs(c.token_ids, c.logprobs) if self.top_n is not None else None
        return {"index": idx, "message": {"role": "assistant", "content": c.text}, "logprobs": logprobs,
                "finish_reason": c.finish_reason}
