"""vLLM's extra endpoints: `POST /tokenize`, `POST /detokenize`, `GET /health`, `GET /version`, in vLLM's shapes.

/tokenize takes either `{"prompt": str, "add_special_tokens": true}` or `{"messages": [...],
"add_generation_prompt": true}` (rendered with the chat template exactly as /v1/chat/completions renders it) and
answers `{"count", "max_model_len", "tokens"}` (+ `token_strs` when `return_token_strs`). /detokenize takes
`{"tokens": [int]}` and answers `{"prompt": str}` (special tokens kept, as vLLM does). /health is 200 with an
empty body while the engine is alive, 503 otherwise; /version is `{"version": ...}`.
"""

from __future__ import annotations

from typing import Annotated, Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, model_validator

from hetero_infer import __version__
from hetero_infer.contracts.protocol import INT64_MAX, ChatCompletionRequest, _invalid, _Strict
from hetero_infer.worker.server.chat import chat_prompt
from hetero_infer.worker.server.errors import bad_request
from hetero_infer.worker.server.prompts import TOKENIZE_INLINE_MAX_CHARS, off_loop_if, parse_body
from hetero_infer.worker.server.state import FAILED, LOADING, ServerState, get_state


class TokenizeCompletionRequest(_Strict):
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool | None = False


class TokenizeChatRequest(ChatCompletionRequest):
    """A chat request's prompt part (messages, tools, add_generation_prompt: rendered by the same code as
    /v1/chat/completions, so the count is the prompt_tokens that a completion would report); its sampling
    fields are accepted and unused."""

    continue_final_message: bool = False
    add_special_tokens: bool = False
    return_token_strs: bool | None = False

    @model_validator(mode="after")
    def _check_tokenize(self) -> TokenizeChatRequest:
        if self.continue_final_message:
            raise _invalid("continue_final_message", "continue_final_message is not supported")
        if self.add_special_tokens:
            raise _invalid("add_special_tokens", "add_special_tokens must be false with messages: the chat "
                           "template writes the special tokens itself")
        return self


class DetokenizeRequest(_Strict):
    model: str | None = None
    tokens: list[Annotated[int, Field(ge=0, le=INT64_MAX)]]


class TokenizeResponse(BaseModel):
    model_config = ConfigDict(extra="forbid")
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = Field(None, description="only with return_token_strs")


class DetokenizeResponse(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prompt: str


class VersionResponse(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: str


class _Probe(BaseModel):
    """Which of the two tokenize shapes a body is (vLLM tells them apart by `messages`)."""

    messages: Any = None


async def tokenize(request: web.Request) -> web.Response:
    state = get_state(request)
    body = await request.read()
    try:
        chat = isinstance(_Probe.model_validate_json(body).messages, list)
    except ValueError:
        chat = False  # not a JSON object: the completion shape's parser explains what is wrong
    req: TokenizeCompletionRequest | TokenizeChatRequest = await parse_body(
        request, TokenizeChatRequest if chat else TokenizeCompletionRequest)
    state.check_model(req.model)
    state.check_serving()
    if isinstance(req, TokenizeChatRequest):
        ids = (await chat_prompt(state, req)).token_ids
    else:
        encode = state.require_tokenizer("/tokenize", "prompt").encode
        ids = list(await off_loop_if(len(req.prompt) > TOKENIZE_INLINE_MAX_CHARS, encode, req.prompt,
                                     add_special_tokens=req.add_special_tokens))
    out: dict[str, Any] = {"count": len(ids), "max_model_len": state.max_model_len, "tokens": ids}
    if req.return_token_strs:
        out["token_strs"] = state.tokenizer.hf.convert_ids_to_tokens(ids)
    return web.json_response(out)


async def detokenize(request: web.Request) -> web.Response:
    state = get_state(request)
    req: DetokenizeRequest = await parse_body(request, DetokenizeRequest)
    state.check_model(req.model)
    state.check_serving()
    vocab = state.require_tokenizer("/detokenize", "tokens").vocab_size
    for i, token in enumerate(req.tokens):
        if token >= vocab:
            raise bad_request(f"token id {token} is out of range: the vocabulary has {vocab} tokens (0..{vocab - 1})",
                              f"tokens.{i}")
    text = await off_loop_if(len(req.tokens) > TOKENIZE_INLINE_MAX_CHARS // 4, state.tokenizer.decode, req.tokens,
                             skip_special_tokens=False)
    return web.json_response({"prompt": text})


def engine_alive(state: ServerState) -> bool:
    """vLLM's /health: loaded and the engine loop alive (draining still counts as alive)."""
    if state.phase in (LOADING, FAILED):
        return False
    return state.engine.healthy


async def health(request: web.Request) -> web.Response:
    return web.Response(status=200 if engine_alive(get_state(request)) else 503)


async def version(request: web.Request) -> web.Response:
    return web.json_response({"version": __version__})


def add_routes(app: web.Application) -> None:
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)
    app.router.add_get("/health", health)
    app.router.add_get("/version", version)
