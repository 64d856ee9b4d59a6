"""/v1/completions and /v1/chat/completions: validate, tokenize, submit, then answer in one piece or as SSE.

Everything here runs on the event loop; the engine runs on its own thread (see `async_engine`). The
handler owns its engine requests: however it ends (finished, error, timeout, client gone, cancelled),
its `finally` aborts whatever is still running so the KV blocks are freed at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from jinja2 import TemplateError
from pydantic import BaseModel, ValidationError

from hetero_infer.worker.async_engine import (
    EngineDeadError,
    EngineRequest,
    OutputStream,
    RequestFailedError,
    RequestRejectedError,
    RequestState,
    SampleState,
)
from hetero_infer.worker.sampling_params import SamplingParams
from hetero_infer.worker.server.errors import APIError, bad_request
from hetero_infer.worker.server.ids import new_id
from hetero_infer.worker.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    describe_validation_error,
)
from hetero_infer.worker.server.state import ServerState, get_state

logger = logging.getLogger("hetero_infer.server")

DEFAULT_COMPLETION_MAX_TOKENS = 16
# Prompts longer than this (characters) are tokenized on a worker thread, not on the event loop.
TOKENIZE_INLINE_MAX_CHARS = 8192
_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
_DONE = b"data: [DONE]\n\n"
_str = json.encoder.encode_basestring  # a JSON string literal (C implementation)


def _reason(finish_reason: str | None) -> str:
    return "null" if finish_reason is None else _str(finish_reason)


async def parse_body(request: web.Request, model: type[BaseModel]) -> Any:
    body = await request.read()  # 413 from aiohttp beyond client_max_size
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        message, param = describe_validation_error(exc)
        raise bad_request(message, param) from None


@dataclass(slots=True)
class Prompt:
    text: str | None
    token_ids: list[int]


# ------------------------------------------------------------------------------------------- handlers


async def create_completion(request: web.Request) -> web.StreamResponse:
    arrival = time.monotonic()
    state = get_state(request)
    req: CompletionRequest = await parse_body(request, CompletionRequest)
    state.check_model(req.model)
    state.check_serving()
    prompts = await _completion_prompts(state, req)
    params = [request_sampling_params(state, req, p) for p in prompts]
    fmt = CompletionFormatter(state, req, prompts)
    return await _generate(request, state, req, prompts, params, fmt, arrival)


async def create_chat_completion(request: web.Request) -> web.StreamResponse:
    arrival = time.monotonic()
    state = get_state(request)
    req: ChatCompletionRequest = await parse_body(request, ChatCompletionRequest)
    state.check_model(req.model)
    state.check_serving()
    messages = [{"role": m.role, "content": m.text(), **({"name": m.name} if m.name else {})}
                for m in req.messages]
    chars = sum(len(m["content"]) for m in messages)
    try:
        ids = await _off_loop_if(chars > TOKENIZE_INLINE_MAX_CHARS, state.tokenizer.apply_chat_template,
                                 messages, add_generation_prompt=req.add_generation_prompt)
    except (ValueError, TypeError, TemplateError) as exc:  # the template rejects these messages (e.g. role order)
        raise bad_request(f"the messages could not be rendered with the chat template: {exc}", "messages") from None
    prompts = [Prompt(None, list(ids))]
    _check_prompt(state, prompts[0], "messages")
    params = [request_sampling_params(state, req, prompts[0])]
    fmt = ChatFormatter(state, req, prompts)
    return await _generate(request, state, req, prompts, params, fmt, arrival)


# ------------------------------------------------------------------------------------------- preparation


async def _off_loop_if(cond: bool, fn: Any, *args: Any, **kwargs: Any) -> Any:
    if not cond:
        return fn(*args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(None, lambda: fn(*args, **kwargs))


async def _completion_prompts(state: ServerState, req: CompletionRequest) -> list[Prompt]:
    raw = req.prompt
    if isinstance(raw, str):
        texts: list[str] = [raw]
    elif raw and isinstance(raw[0], str):
        texts = raw  # type: ignore[assignment]
    elif raw and isinstance(raw[0], int):
        prompts = [Prompt(None, list(raw))]  # type: ignore[arg-type]
        texts = []
    else:
        prompts = [Prompt(None, list(ids)) for ids in raw]  # type: ignore[arg-type, union-attr]
        texts = []
    if texts:
        chars = sum(len(t) for t in texts)
        encode = state.tokenizer.encode
        ids_list = await _off_loop_if(chars > TOKENIZE_INLINE_MAX_CHARS, lambda: [encode(t) for t in texts])
        prompts = [Prompt(t, list(ids)) for t, ids in zip(texts, ids_list, strict=True)]
    for i, p in enumerate(prompts):
        _check_prompt(state, p, "prompt" if len(prompts) == 1 else f"prompt.{i}")
    return prompts


def _check_prompt(state: ServerState, prompt: Prompt, param: str) -> None:
    n = len(prompt.token_ids)
    if n == 0:
        raise bad_request("the prompt is empty (0 tokens)", param)
    if n >= state.max_model_len:
        raise APIError(
            400,
            f"This model's maximum context length is {state.max_model_len} tokens. However, your prompt has "
            f"{n} tokens, which leaves no room for the completion. Please shorten the prompt.",
            param=param,
            code="context_length_exceeded",
        )


def request_sampling_params(state: ServerState, req: CompletionRequest | ChatCompletionRequest,
                            prompt: Prompt) -> SamplingParams:
    """The engine's sampling parameters for one prompt of a validated request (APIError for what the engine
    would refuse). Reads only the state's limits and its `validate_request`, so it can be tested on its own."""
    if isinstance(req, ChatCompletionRequest):
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        return _sampling_params(state, req, prompt, req.requested_max_tokens, None, logprobs)
    return _sampling_params(state, req, prompt, req.max_tokens, DEFAULT_COMPLETION_MAX_TOKENS, req.logprobs)


def _sampling_params(
    state: ServerState,
    req: CompletionRequest | ChatCompletionRequest,
    prompt: Prompt,
    requested_max_tokens: int | None,
    default_max_tokens: int | None,
    logprobs: int | None,
) -> SamplingParams:
    room = state.max_model_len - len(prompt.token_ids)
    if requested_max_tokens is None:
        max_tokens = room if default_max_tokens is None else min(default_max_tokens, room)
    elif requested_max_tokens > room:
        n = len(prompt.token_ids)
        raise APIError(
            400,
            f"This model's maximum context length is {state.max_model_len} tokens. However, you requested "
            f"{n + requested_max_tokens} tokens ({n} in the prompt, {requested_max_tokens} for the completion). "
            "Please reduce the prompt or the completion length.",
            param="max_completion_tokens" if isinstance(req, ChatCompletionRequest) and
            req.max_completion_tokens is not None else "max_tokens",
            code="context_length_exceeded",
        )
    else:
        max_tokens = requested_max_tokens
    if req.min_tokens > max_tokens:
        raise bad_request(f"min_tokens ({req.min_tokens}) is larger than max_tokens ({max_tokens})", "min_tokens")
    if req.n > state.max_num_seqs:
        raise bad_request(f"n ({req.n}) is larger than this server's max_num_seqs ({state.max_num_seqs})", "n")
    top_k = req.top_k if req.top_k is not None and req.top_k > 0 else -1
    if top_k >= state.vocab_size:
        top_k = -1
    try:
        params = SamplingParams(
            n=req.n,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            top_k=top_k,
            min_p=req.min_p or 0.0,
            max_tokens=max_tokens,
            min_tokens=req.min_tokens,
            stop=req.stop,
            stop_token_ids=req.stop_token_ids,
            ignore_eos=req.ignore_eos,
            seed=req.seed,
            logprobs=logprobs,
            presence_penalty=req.presence_penalty or 0.0,
            frequency_penalty=req.frequency_penalty or 0.0,
            repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
            skip_special_tokens=req.skip_special_tokens,
            include_stop_str_in_output=req.include_stop_str_in_output,
        )
        # The engine's own admission rules (token-id range, KV-pool size), checked here without touching it.
        state.validate_request(prompt.token_ids, params)
    except ValueError as exc:
        message = str(exc)
        code = "context_length_exceeded" if "context length" in message else "invalid_value"
        raise bad_request(message, code=code) from None
    return params


# ------------------------------------------------------------------------------------------- running


async def _generate(
    request: web.Request,
    state: ServerState,
    req: CompletionRequest | ChatCompletionRequest,
    prompts: list[Prompt],
    params: list[SamplingParams],
    fmt: Formatter,
    arrival: float,
) -> web.StreamResponse:
    num_seqs = sum(p.n for p in params)
    base = new_id()
    engine_requests = [
        EngineRequest(f"{base}-{i}", p.text, p.token_ids, sp) for i, (p, sp) in enumerate(zip(prompts, params, strict=True))
    ]
    fmt.bind([r.request_id for r in engine_requests])
    with state.admit(num_seqs):  # 429/503 beyond capacity; counts the request for the drain
        stream = state.engine.submit(engine_requests, arrival)
        loop = asyncio.get_running_loop()
        timeout_s = state.options.request_timeout
        timer = loop.call_at(loop.time() + timeout_s, _time_out, state, stream, timeout_s)
        try:
            if req.stream:
                return await _stream(request, stream, fmt, bool(req.stream_options and req.stream_options.include_usage))
            return await _collect(stream, fmt)
        finally:
            timer.cancel()
            # Client gone, cancelled, failed or timed out: free the KV blocks now (no-op once finished).
            state.engine.abort(stream)


def _time_out(state: ServerState, stream: OutputStream, timeout_s: float) -> None:
    state.metrics.rejected("timeout")
    stream._fail(APIError(504, f"the request did not finish within the server's timeout of {timeout_s:g} s",
                          code="request_timeout"))


def _as_api_error(exc: BaseException) -> APIError:
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, RequestRejectedError):
        return bad_request(str(exc))
    if isinstance(exc, RequestFailedError):
        return APIError(500, f"the engine failed while generating this request: {exc}", code="engine_error")
    if isinstance(exc, EngineDeadError):
        return APIError(500, f"the engine stopped: {exc}", code="engine_failed")
    raise exc


_STREAM_ERRORS = (APIError, RequestRejectedError, RequestFailedError, EngineDeadError)


async def _collect(stream: OutputStream, fmt: Formatter) -> web.Response:
    latest: dict[str, RequestState] = {}
    try:
        while True:
            outputs = await stream.next_states()
            if not outputs:
                break
            for out in outputs:
                latest[out.request_id] = out
    except _STREAM_ERRORS as exc:
        raise _as_api_error(exc) from None
    return web.Response(body=_dumps(fmt.response(latest)).encode(), content_type="application/json")


class EventStreamResponse(web.StreamResponse):
    """An SSE response whose status line and headers leave with its first events, in one write, or after
    `HEADERS_MAX_DELAY_S` if none has come by then (`_stream` sends them). aiohttp writes them at `prepare()`
    otherwise: a write, and a wake-up of the client, for nothing when the first tokens follow within
    milliseconds, as they do unless the request waits for the engine (aiohttp < 3.12 sends them at once)."""

    _send_headers_immediately = False


# How long the headers of a stream may wait for its first events: a client learns this soon that its request
# was accepted, however long the first token takes (queueing, a long prefill).
HEADERS_MAX_DELAY_S = 0.05


def _send_headers(writer: AbstractStreamWriter) -> None:
    try:
        writer.send_headers()
    except ConnectionError:  # the client is gone; the handler learns it at its next write
        pass


async def _stream(request: web.Request, stream: OutputStream, fmt: Formatter, include_usage: bool) -> web.StreamResponse:
    resp = EventStreamResponse(headers={
        "Content-Type": "text/event-stream",
        "Cache-Control": "no-cache",
        "X-Accel-Buffering": "no",
        "X-Request-Id": request.get("request_id", ""),
    })
    fmt.set_include_usage(include_usage)
    writer = await resp.prepare(request)
    assert writer is not None
    headers_timer = asyncio.get_running_loop().call_later(HEADERS_MAX_DELAY_S, _send_headers, writer)
    try:
        last = b""
        outputs = await stream.next_states()
        headers_timer.cancel()  # they go out with these events
        while outputs:
            chunks = fmt.chunks(outputs)
            data = "".join(f"data: {c}\n\n" for c in chunks).encode() if chunks else b""
            if stream.done:  # nothing more to wait for: these events go out with the end of the stream
                last = data
                break
            if data:
                await resp.write(data)
            outputs = await stream.next_states()
        if include_usage:
            last += b"data: " + _dumps(fmt.usage_chunk()).encode() + b"\n\n"
        await resp.write_eof(last + _DONE)  # the last events and the end of the body in one write
    except _STREAM_ERRORS as exc:
        err = _as_api_error(exc)
        await resp.write_eof(b"data: " + _dumps(err.body()).encode() + b"\n\n" + _DONE)
    except ConnectionError:  # client went away; the caller's `finally` aborts the requests
        logger.info("client disconnected mid-stream", extra={"request_id": request.get("request_id")})
    finally:
        headers_timer.cancel()
    return resp


# ------------------------------------------------------------------------------------------- formatting


def _finite(logprob: float | None) -> float:
    """Logprobs as JSON-safe numbers: a missing or -inf logprob becomes -9999.0, as OpenAI reports it."""
    if logprob is None or math.isnan(logprob) or logprob < -9999.0:
        return -9999.0
    return float(logprob)


class _Choice:
    __slots__ = ("chars", "tokens", "offset", "done", "started")

    def __init__(self) -> None:
        self.chars = 0  # characters of the cumulative text already sent
        self.tokens = 0  # tokens already sent
        self.offset = 0  # completions logprobs: text offset of the next token
        self.done = False
        self.started = False


class Formatter(ABC):
    """Turns the requests' accumulated outputs (`RequestState`, read at once on the loop) into OpenAI responses
    and stream chunks."""

    object_name = ""
    chunk_object = ""
    id_prefix = ""

    def __init__(self, state: ServerState, req: CompletionRequest | ChatCompletionRequest, prompts: list[Prompt]) -> None:
        self.state = state
        self.model = state.model_name
        self.n = req.n
        self.prompts = prompts
        self.id = f"{self.id_prefix}{new_id()}"
        self.created = int(time.time())
        self.set_include_usage(False)
        self.prompt_index: dict[str, int] = {}
        self.choices = [_Choice() for _ in range(len(prompts) * req.n)]
        self.completion_tokens = [0] * len(self.choices)

    def bind(self, request_ids: list[str]) -> None:
        self.prompt_index = {rid: i for i, rid in enumerate(request_ids)}

    def usage(self) -> dict[str, int]:
        prompt = sum(len(p.token_ids) for p in self.prompts)
        completion = sum(self.completion_tokens)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def set_include_usage(self, include_usage: bool) -> None:
        """Streaming: with usage, every chunk carries `"usage": null` and a last chunk the totals."""
        self.include_usage = include_usage
        if not hasattr(self, "_chunk_head"):  # the constant start of every chunk, encoded once
            self._chunk_head = (f'{{"id":{_str(self.id)},"object":{_str(self.chunk_object)},"created":{self.created},'
                                f'"model":{_str(self.model)},"choices":[')
        self._chunk_tail = '],"usage":null}' if include_usage else "]}"

    def usage_chunk(self) -> dict[str, Any]:
        return {"id": self.id, "object": self.chunk_object, "created": self.created, "model": self.model,
                "choices": [], "usage": self.usage()}

    def _outputs(self, outputs: list[RequestState]) -> list[tuple[int, SampleState]]:
        found = []
        for out in outputs:
            base = self.prompt_index[out.request_id] * self.n
            for c in out.outputs:
                found.append((base + c.index, c))
        return found

    def chunks(self, outputs: list[RequestState]) -> list[str]:
        """Stream chunks (JSON text) for everything new in `outputs` (one chunk per choice that changed)."""
        chunks = []
        for idx, c in self._outputs(outputs):
            ch = self.choices[idx]
            if ch.done:
                continue
            new_text = c.text[ch.chars:]
            new_tokens = len(c.token_ids) - ch.tokens
            if not new_text and new_tokens <= 0 and c.finish_reason is None and ch.started:
                continue
            chunk = self._chunk(idx, c, ch, new_text, new_tokens)
            ch.chars = max(ch.chars, len(c.text))
            ch.tokens = len(c.token_ids)
            ch.started = True
            self.completion_tokens[idx] = len(c.token_ids)
            if c.finish_reason is not None:
                ch.done = True
            chunks.append(chunk)
        return chunks

    def response(self, latest: dict[str, RequestState]) -> dict[str, Any]:
        choices = []
        for idx, c in sorted(self._outputs(list(latest.values())), key=lambda x: x[0]):
            self.completion_tokens[idx] = len(c.token_ids)
            choices.append(self._choice(idx, c))
        return {"id": self.id, "object": self.object_name, "created": self.created, "model": self.model,
                "choices": choices, "usage": self.usage()}

    def _base_chunk(self, choice: str) -> str:
        """A whole chunk around one choice's JSON (the constant parts are encoded once per request)."""
        return self._chunk_head + choice + self._chunk_tail

    def _token_logprobs(self, c: SampleState, start: int, end: int, top_n: int) -> list[tuple[str, float, list[tuple[str, float]]]]:
        """(token text, logprob, top-N (text, logprob)) for generated tokens [start, end)."""
        entries = c.logprobs or []
        text_of = self.state.token_text
        result = []
        for i in range(start, min(end, len(entries), len(c.token_ids))):
            d = entries[i]
            tid = c.token_ids[i]
            top = sorted(d.items(), key=lambda kv: kv[1], reverse=True)[:top_n] if top_n else []
            result.append((text_of(tid), _finite(d.get(tid)), [(text_of(t), _finite(lp)) for t, lp in top]))
        return result

    @abstractmethod
    def _chunk(self, idx: int, c: SampleState, ch: _Choice, new_text: str, new_tokens: int) -> dict[str, Any]:
        """The stream chunk for one choice that changed."""

    @abstractmethod
    def _choice(self, idx: int, c: SampleState) -> dict[str, Any]:
        """The final (non-streamed) choice."""


class CompletionFormatter(Formatter):
    object_name = "text_completion"
    chunk_object = "text_completion"
    id_prefix = "cmpl-"

    def __init__(self, state: ServerState, req: CompletionRequest, prompts: list[Prompt]) -> None:
        super().__init__(state, req, prompts)
        self.top_n = req.logprobs
        self.echo = req.echo
        self._echo_text: dict[int, str] = {}

    def _prompt_text(self, idx: int) -> str:
        p_idx = idx // self.n
        if p_idx not in self._echo_text:
            p = self.prompts[p_idx]
            self._echo_text[p_idx] = p.text if p.text is not None else self.state.tokenizer.decode(p.token_ids)
        return self._echo_text[p_idx]

    def _logprobs(self, c: SampleState, start: int, end: int, offset: int) -> tuple[dict[str, Any], int]:
        tokens, token_lps, tops, offsets = [], [], [], []
        for text, lp, top in self._token_logprobs(c, start, end, self.top_n or 0):
            tokens.append(text)
            token_lps.append(lp)
            tops.append(dict(top))
            offsets.append(offset)
            offset += len(text)
        return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}, offset

    def _chunk(self, idx: int, c: SampleState, ch: _Choice, new_text: str, new_tokens: int) -> dict[str, Any]:
        if self.echo and not ch.started:
            new_text = self._prompt_text(idx) + new_text
        logprobs = None
        if self.top_n is not None:
            if not ch.started and self.echo:
                ch.offset = len(self._prompt_text(idx))
            logprobs, ch.offset = self._logprobs(c, ch.tokens, len(c.token_ids), ch.offset)
        if logprobs is None:  # the common case, without a dict round trip
            return self._base_chunk(f'{{"index":{idx},"text":{_str(new_text)},"logprobs":null,'
                                    f'"finish_reason":{_reason(c.finish_reason)}}}')
        return self._base_chunk(_dumps({"index": idx, "text": new_text, "logprobs": logprobs,
                                        "finish_reason": c.finish_reason}))

    def _choice(self, idx: int, c: SampleState) -> dict[str, Any]:
        prefix = self._prompt_text(idx) if self.echo else ""
        logprobs = None
        if self.top_n is not None:
            logprobs, _ = self._logprobs(c, 0, len(c.token_ids), len(prefix))
        return {"index": idx, "text": prefix + c.text, "logprobs": logprobs, "finish_reason": c.finish_reason}


class ChatFormatter(Formatter):
    object_name = "chat.completion"
    chunk_object = "chat.completion.chunk"
    id_prefix = "chatcmpl-"

    def __init__(self, state: ServerState, req: ChatCompletionRequest, prompts: list[Prompt]) -> None:
        super().__init__(state, req, prompts)
        self.top_n = (req.top_logprobs or 0) if req.logprobs else None

    def _logprobs(self, c: SampleState, start: int, end: int) -> dict[str, Any]:
        content = []
        for text, lp, top in self._token_logprobs(c, start, end, self.top_n or 0):
            content.append({
                "token": text, "logprob": lp, "bytes": list(text.encode()),
                "top_logprobs": [{"token": t, "logprob": v, "bytes": list(t.encode())} for t, v in top],
            })
        return {"content": content}

    def _chunk(self, idx: int, c: SampleState, ch: _Choice, new_text: str, new_tokens: int) -> dict[str, Any]:
        role = "" if ch.started else '"role":"assistant",'
        if self.top_n is None:
            return self._base_chunk(f'{{"index":{idx},"delta":{{{role}"content":{_str(new_text)}}},"logprobs":null,'
                                    f'"finish_reason":{_reason(c.finish_reason)}}}')
        delta: dict[str, Any] = {"role": "assistant", "content": new_text} if not ch.started else {"content": new_text}
        logprobs = self._logprobs(c, ch.tokens, len(c.token_ids))
        return self._base_chunk(_dumps({"index": idx, "delta": delta, "logprobs": logprobs,
                                        "finish_reason": c.finish_reason}))

    def _choice(self, idx: int, c: SampleState) -> dict[str, Any]:
        logprobs = self._logprobs(c, 0, len(c.token_ids)) if self.top_n is not None else None
        return {"index": idx, "message": {"role": "assistant", "content": c.text}, "logprobs": logprobs,
                "finish_reason": c.finish_reason}
