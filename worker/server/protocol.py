"""Request and response models of the OpenAI-compatible API (pydantic v2).

Requests are validated strictly (no string-to-number coercion, no NaN/Infinity) and unknown fields are
ignored, as OpenAI-compatible servers usually do. The response models document `/openapi.json`; on the hot
path handlers build the same shapes directly as dicts or JSON text (tests/server/test_openapi.py checks
real responses against the published schemas).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import PydanticCustomError

MAX_STOP_SEQUENCES = 16
MAX_N = 128
MAX_PROMPTS = 256
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1


def _invalid(param: str, message: str) -> PydanticCustomError:
    """A cross-field error that remembers which parameter it is about."""
    return PydanticCustomError("invalid_request", message, {"param": param})


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)


class StreamOptions(_Strict):
    include_usage: bool = False


class _Sampling(_Strict):
    """Fields shared by /v1/completions and /v1/chat/completions (OpenAI names, then vLLM's extensions)."""

    model: str | None = Field(None, description="served model name; defaults to the one model this worker serves")
    n: int = Field(1, ge=1, le=MAX_N)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP_SEQUENCES)] | None = None
    seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = Field(None, description="not supported: must be empty")
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # vLLM-style extensions
    top_k: int | None = Field(None, ge=-1, le=INT32_MAX, description="-1 or 0 disables")
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=2.0)
    min_tokens: int = Field(0, ge=0, le=INT32_MAX)
    ignore_eos: bool = False
    stop_token_ids: Annotated[list[Annotated[int, Field(ge=0, le=INT32_MAX)]], Field(max_length=64)] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False

    @model_validator(mode="after")
    def _check_common(self) -> _Sampling:
        if self.stream_options is not None and not self.stream:
            raise _invalid("stream_options", "stream_options is only allowed when stream is true")
        if self.logit_bias:
            raise _invalid("logit_bias", "logit_bias is not supported")
        return self


class CompletionRequest(_Sampling):
    prompt: (
        str
        | Annotated[list[Annotated[int, Field(ge=0, le=INT32_MAX)]], Field(min_length=1)]
        | Annotated[list[str], Field(min_length=1, max_length=MAX_PROMPTS)]
        | Annotated[
            list[Annotated[list[Annotated[int, Field(ge=0, le=INT32_MAX)]], Field(min_length=1)]],
            Field(min_length=1, max_length=MAX_PROMPTS),
        ]
    ) = Field(description="text, a list of texts, token ids, or a list of token-id lists",
              # The members are disjoint (strict mode), so the first that fits is the only one; token ids (the
              # long lists) are tried right after text. Pydantic's default "smart" mode would validate them
              # against every list member, collecting an error per element (6x the time of the whole request).
              union_mode="left_to_right")
    max_tokens: int | None = Field(None, ge=1, le=INT32_MAX, description="default 16")
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False
    best_of: int | None = Field(None, ge=1, le=MAX_N, description="must equal n when given")
    suffix: str | None = Field(None, description="not supported: must be empty")

    @model_validator(mode="after")
    def _check(self) -> CompletionRequest:
        if self.best_of is not None and self.best_of != self.n:
            raise _invalid("best_of", "best_of other than n is not supported")
        if self.suffix:
            raise _invalid("suffix", "suffix is not supported")
        if self.echo and self.logprobs is not None:
            raise _invalid("echo", "echo together with logprobs (prompt logprobs) is not supported")
        return self


class TextContentPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextContentPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ResponseFormat(_Strict):
    type: Literal["text"] = "text"


class ChatCompletionRequest(_Sampling):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: int | None = Field(None, ge=1, le=INT32_MAX, description="deprecated alias of max_completion_tokens")
    max_completion_tokens: int | None = Field(None, ge=1, le=INT32_MAX, description="default: the rest of the context")
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: ResponseFormat | None = None
    tools: list[dict[str, Any]] | None = Field(None, description="not supported: must be empty")
    tool_choice: Literal["none", "auto"] | None = None
    add_generation_prompt: bool = True

    @model_validator(mode="after")
    def _check(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise _invalid("top_logprobs", "top_logprobs requires logprobs to be true")
        if self.tools:
            raise _invalid("tools", "tools are not supported")
        return self

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


# --------------------------------------------------------------------------------------------- responses


class _Response(BaseModel):
    """Documents a response shape exactly (no undeclared fields)."""

    model_config = ConfigDict(extra="forbid")


class ErrorBody(_Response):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(_Response):
    error: ErrorBody


class ModelCard(_Response):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    max_model_len: int


class ModelList(_Response):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Usage(_Response):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(_Response):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(_Response):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None


class CompletionResponse(_Response):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class TopLogprob(_Response):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(_Response):
    content: list[TokenLogprob] | None = None


class AssistantMessage(_Response):
    role: Literal["assistant"] = "assistant"
    content: str | None = None


class ChatChoice(_Response):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionResponse(_Response):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(_Response):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(_Response):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(_Response):
    """One `data:` event of a streamed chat completion (the stream ends with `data: [DONE]`)."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionChunk(_Response):
    """One `data:` event of a streamed completion (the stream ends with `data: [DONE]`)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class HealthStatus(_Response):
    status: str
    error: str | None = None


def describe_validation_error(exc: ValidationError) -> tuple[str, str | None]:
    """An OpenAI-style (message, param) pair for a pydantic error."""
    errors = exc.errors(include_url=False)
    if not errors:
        return "invalid request", None
    # For a union (e.g. `prompt`), the deepest error of the first field is the most telling one.
    field = errors[0]["loc"][:1]
    first = max((e for e in errors if e["loc"][:1] == field),
                key=lambda e: (len(e["loc"]), not e["type"].endswith("_type")))
    ctx = first.get("ctx") or {}
    if first["type"] == "json_invalid":
        return f"the request body is not valid JSON: {ctx.get('error', '')}".rstrip(": "), None
    # Union members show up in the location ("prompt", "str"): keep the field path only.
    path = [str(p) for p in first.get("loc", ()) if not (isinstance(p, str) and not p.isidentifier())]
    path = [p for p in path if p not in _TYPE_NAMES]
    if first["type"] == "model_type" and not path:
        return "the request body must be a JSON object", None
    param = ctx.get("param") or ".".join(path) or None
    more = f" (and {len(errors) - 1} more error(s))" if len(errors) > 1 else ""
    where = f"'{param}': " if param and first["type"] != "invalid_request" else ""
    return f"{where}{first['msg']}{more}", param


_TYPE_NAMES = {"str", "int", "float", "bool", "list", "dict", "none"}
