"""What both generation endpoints share before the engine: the body parsed (pydantic: its shape), prompts
tokenized (long ones off the event loop), and the request mapped to the engine's `SamplingParams` and checked,
once, with the engine's `check_request`."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ValidationError

from hetero_infer.contracts.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    describe_validation_error,
)
from hetero_infer.contracts.sampling_params import SamplingParams
from hetero_infer.worker.core.request_check import ParamNames, RequestError, check_request
from hetero_infer.worker.server.errors import bad_request, from_request_error
from hetero_infer.worker.server.structured import structured_outputs

logger = logging.getLogger("hetero_infer.server")

DEFAULT_COMPLETION_MAX_TOKENS = 16
# Prompts longer than this (characters) are tokenized on a worker thread, not on the event loop.
TOKENIZE_INLINE_MAX_CHARS = 8192


@dataclass(slots=True)
class Prompt:
    text: str | None
    token_ids: list[int]


async def parse_body(request: web.Request, model: type[BaseModel]) -> Any:
    body = await request.read()  # 413 from aiohttp beyond client_max_size
    return parse_request(body, model)


def parse_request(body: bytes | str, model: type[BaseModel]) -> Any:
    """The validated request (400 otherwise); unknown top-level fields are ignored with a warning naming them,
    as vLLM does."""
    try:
        req = model.model_validate_json(body)
    except ValidationError as exc:
        message, param = describe_validation_error(exc)
        raise bad_request(message, param) from None
    ignored = getattr(req, "ignored_fields", None)
    if ignored:
        logger.warning("The following fields were present in the request but ignored: %s", ignored)
    return req


async def off_loop_if(cond: bool, fn: Any, *args: Any, **kwargs: Any) -> Any:
    if not cond:
        return fn(*args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(None, lambda: fn(*args, **kwargs))


def prompt_logprobs_of(req: CompletionRequest | ChatCompletionRequest) -> int | None:
    """How many of the most likely tokens the request's prompt logprobs hold at each position (None: it has none):
    vLLM's `prompt_logprobs`, and echo with logprobs (OpenAI's legacy completions; how evaluation harnesses score
    a continuation), the larger of the two where both are given; a stream's `prompt_logprobs` (0: the only one
    it may have) is dropped, as vLLM drops it."""
    echoed = req.logprobs if isinstance(req, CompletionRequest) and req.echo else None
    asked = None if req.stream else req.prompt_logprobs
    if echoed is None or asked is None:
        return asked if echoed is None else echoed
    return max(echoed, asked)


def request_sampling_params(state: Any, req: CompletionRequest | ChatCompletionRequest, prompt: Prompt,
                            prompt_param: str | None = None) -> SamplingParams:
    """The engine's sampling parameters for one prompt of a parsed request (max_tokens resolved), checked
    against the engine's limits (`state.limits`, `state.max_num_seqs`; APIError for what the engine would
    refuse): the only check of the request's values."""
    if isinstance(req, ChatCompletionRequest):
        logprobs = (req.top_logprobs or 0) if req.logprobs else None
        requested, default = req.requested_max_tokens, None
        names = ParamNames(prompt_param or "messages", "max_completion_tokens"
                           if req.max_completion_tokens is not None else "max_tokens")
    else:
        logprobs = req.logprobs
        # echo alone: one token is generated (the step that computes the prompt samples one) and not returned
        requested, default = 1 if req.echo_only else req.max_tokens, DEFAULT_COMPLETION_MAX_TOKENS
        names = ParamNames(prompt_param or "prompt", "max_tokens")
    limits = state.limits
    if not limits.has_tokenizer:  # what the response would have to render as text
        if logprobs is not None:
            state.require_tokenizer("logprobs", "logprobs")
        if getattr(req, "echo", False):
            state.require_tokenizer("echo", "echo")
        if req.prompt_logprobs is not None:
            state.require_tokenizer("prompt_logprobs", "prompt_logprobs")
    if requested is None:  # the rest of the context (at least 1: a prompt that fills it fails the check)
        room = limits.max_model_len - len(prompt.token_ids)
        requested = max(1, room if default is None else min(default, room))
    constraint = structured_outputs(req)
    top_k = req.top_k if req.top_k is not None and req.top_k > 0 else -1
    if top_k >= limits.vocab_size:
        top_k = -1
    params = SamplingParams(
        n=req.n,
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=top_k,
        min_p=req.min_p or 0.0,
        max_tokens=requested,
        min_tokens=req.min_tokens,
        stop=req.stop,
        stop_token_ids=req.stop_token_ids,
        ignore_eos=req.ignore_eos,
        seed=req.seed,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs_of(req),
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
        skip_special_tokens=req.skip_special_tokens,
        include_stop_str_in_output=req.include_stop_str_in_output,
        logit_bias=_logit_bias(req.logit_bias, limits.vocab_size),
        best_of=getattr(req, "best_of", None),
        structured_outputs=constraint[1] if constraint else None,
        priority=req.priority,
    )
    if params.best_of is not None and params.best_of > state.max_num_seqs:
        raise bad_request(f"best_of ({params.best_of}) is larger than this server's max_num_seqs "
                          f"({state.max_num_seqs})", "best_of")
    try:
        # the grammar is parsed and compiled by the engine, off its loop and this one (`prepare_grammar`)
        check_request(prompt.token_ids, params, limits, names=names, max_n=state.max_num_seqs, parse_grammar=False)
    except RequestError as exc:
        if constraint is not None and exc.param == "structured_outputs":  # name the field the client sent
            exc.param = constraint[0]
        raise from_request_error(exc) from None
    return params


def _logit_bias(bias: dict[str, float] | None, vocab_size: int) -> dict[int, float] | None:
    """OpenAI's token-id strings as ids (their values are in [-100, 100] by the model); 400 for an id outside
    the vocabulary."""
    if not bias:
        return None
    ids = {int(k): v for k, v in bias.items()}
    bad = [k for k in ids if k >= vocab_size]
    if bad:
        raise bad_request(f"logit_bias token id {bad[0]} is outside the vocabulary [0, {vocab_size})", "logit_bias")
    return ids


async def completion_prompts(state: Any, req: CompletionRequest) -> list[Prompt]:
    raw = req.prompt
    if isinstance(raw, str):
        texts: list[str] = [raw]
    elif raw and isinstance(raw[0], str):
        texts = raw  # type: ignore[assignment]
    elif raw and isinstance(raw[0], int):
        return [Prompt(None, list(raw))]  # type: ignore[arg-type]
    else:
        return [Prompt(None, list(ids)) for ids in raw]  # type: ignore[arg-type, union-attr]
    chars = sum(len(t) for t in texts)
    encode = state.require_tokenizer("a text prompt", "prompt").encode
    ids_list = await off_loop_if(chars > TOKENIZE_INLINE_MAX_CHARS, lambda: [encode(t) for t in texts])
    return [Prompt(t, list(ids)) for t, ids in zip(texts, ids_list, strict=True)]
