"""Request and response models of the OpenAI-compatible API (pydantic v2).

Requests are validated strictly (no string-to-number coercion, no NaN/Infinity). As in OpenAI's API, `null`
means "the default" for every field that has one. Unknown top-level fields are ignored with a warning that
names them (vLLM's behaviour: `ignored_fields`, logged by `prompts.parse_body`). The response models document `/openapi.json`; on the hot
path handlers build the same shapes directly as dicts or JSON text (tests/server/test_openapi.py checks
real responses against the published schemas).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

MAX_STOP_SEQUENCES = 16
MAX_N = 128
MAX_PROMPTS = 256
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)


def _invalid(param: str, message: str) -> PydanticCustomError:
    """A cross-field error that remembers which parameter it is about."""
    return PydanticCustomError("invalid_request", message, {"param": param})


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        """`"field": null` means the field's default (OpenAI and vLLM accept null for every optional field)."""
        if isinstance(data, dict) and None in data.values():
            fields = cls.model_fields
            return {k: v for k, v in data.items()
                    if not (v is None and k in fields and fields[k].default is not None)}
        return data


class _Request(_Strict):
    """A request body: unknown top-level fields are kept aside (`ignored_fields`) for a warning, as vLLM does."""

    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)

    @property
    def ignored_fields(self) -> list[str]:
        return sorted(self.model_extra or ())


class StructuredOutputs(_Strict):
    """vLLM's `structured_outputs` object: exactly one of its constraints."""

    json_: dict[str, Any] | bool | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: Annotated[list[str], Field(min_length=1)] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False

    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False, populate_by_name=True)


class StreamOptions(_Strict):
    include_usage: bool = False


class JsonSchemaFormat(_Strict):
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | bool | None = Field(None, alias="schema")
    strict: bool | None = None

    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False, populate_by_name=True)


class ResponseFormat(_Strict):
    """OpenAI's `response_format`: plain text, any JSON object, or JSON that follows `json_schema.schema`."""

    type: Literal["text", "json_object", "json_schema"] = "text"
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _check(self) -> ResponseFormat:
        if self.type == "json_schema" and (self.json_schema is None or self.json_schema.schema_ is None):
            raise _invalid("response_format.json_schema", "response_format of type json_schema needs "
                                                           "json_schema.schema (a JSON schema)")
        return self


class _Sampling(_Request):
    """Fields shared by /v1/completions and /v1/chat/completions (OpenAI names, then vLLM's extensions)."""

    model: str | None = Field(None, description="served model name; defaults to the one model this worker serves")
    n: int = Field(1, ge=1, le=MAX_N)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP_SEQUENCES)] | None = None
    seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    logit_bias: dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]] | None = Field(
        None, description="token id (a decimal string) -> bias in [-100, 100] added to its logit")
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
    priority: int = Field(0, ge=INT32_MIN, le=INT32_MAX, description=(
        "vLLM's: with --scheduling-policy priority, lower values run first (and preempt higher ones); ignored "
        "under fcfs"))
    prompt_logprobs: int | None = Field(None, ge=0, le=20, description=(
        "vLLM's: each prompt token's logprob and rank, with the top N at its position, in the response's "
        "`prompt_logprobs` (not with stream, where only 0 is accepted)"))
    # vLLM's structured outputs: the older guided_* fields and the current `structured_outputs` object
    guided_json: dict[str, Any] | bool | str | None = None
    guided_regex: str | None = None
    guided_choice: Annotated[list[str], Field(min_length=1)] | None = None
    guided_grammar: str | None = None
    guided_decoding_backend: str | None = Field(None, description="accepted and ignored (one engine)")
    guided_whitespace_pattern: str | None = Field(None, description="accepted and ignored")
    structured_outputs: StructuredOutputs | None = None

    @field_validator("logit_bias")
    @classmethod
    def _token_id_keys(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for key in v or ():
            if not (key.isascii() and key.isdigit()) or int(key) > INT32_MAX:
                raise _invalid("logit_bias", f"logit_bias keys must be token ids (decimal strings), got {key!r}")
        return v

    @model_validator(mode="after")
    def _check_common(self) -> _Sampling:
        if self.stream_options is not None and not self.stream:
            raise _invalid("stream_options", "stream_options is only allowed when stream is true")
        if self.stream and self.prompt_logprobs:  # a stream's chunks have no place for them (vLLM's rule)
            raise _invalid("prompt_logprobs", "prompt_logprobs are not available when stream is true")
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
    max_tokens: int | None = Field(None, ge=0, le=INT32_MAX,
                                   description="default 16; 0 with echo: the prompt alone (vLLM's echo without generation)")
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False
    best_of: int | None = Field(None, ge=1, le=MAX_N,
                                description="sample this many, return the n with the highest cumulative logprob")
    suffix: str | None = Field(None, description="not supported (no fill-in-the-middle): must be empty")
    response_format: ResponseFormat | None = None

    @property
    def echo_only(self) -> bool:
        """echo with max_tokens 0: the prompt comes back (with its logprobs), nothing generated (as vLLM and
        OpenAI's legacy completions score a prompt)."""
        return self.echo and self.max_tokens == 0

    @model_validator(mode="after")
    def _check(self) -> CompletionRequest:
        if self.max_tokens == 0 and not self.echo:
            raise _invalid("max_tokens", "max_tokens must be at least 1 (0 only with echo: the prompt alone)")
        if self.best_of is not None and self.best_of < self.n:
            raise _invalid("best_of", f"best_of ({self.best_of}) must be greater than or equal to n ({self.n})")
        if self.best_of is not None and self.best_of > 1 and self.stream:
            raise _invalid("best_of", "best_of is not supported with stream (the best choices are known at the end)")
        if self.suffix:
            raise _invalid("suffix", "suffix is not supported: this server does not do fill-in-the-middle "
                                     "completion; put all the text in `prompt`")
        return self


class TextContentPart(_Strict):
    type: Literal["text"]
    text: str


class FunctionCall(_Strict):
    name: str
    arguments: str = Field(description="the arguments as JSON text")


class ToolCall(_Strict):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool's answer: to which call

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class FunctionDefinition(_Strict):
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class ChatCompletionRequest(_Sampling):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: int | None = Field(None, ge=1, le=INT32_MAX, description="deprecated alias of max_completion_tokens")
    max_completion_tokens: int | None = Field(None, ge=1, le=INT32_MAX, description="default: the rest of the context")
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: ResponseFormat | None = None
    tools: Annotated[list[Tool], Field(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = Field(
        None, description="default: auto with tools, none without")
    parallel_tool_calls: bool = True
    functions: list[dict[str, Any]] | None = Field(None, description="deprecated (use tools): refused")
    function_call: str | dict[str, Any] | None = Field(None, description="deprecated (use tool_choice): refused")
    add_generation_prompt: bool = True

    @model_validator(mode="after")
    def _check(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise _invalid("top_logprobs", "top_logprobs requires logprobs to be true")
        for legacy, now in (("functions", "tools"), ("function_call", "tool_choice")):
            if getattr(self, legacy) is not None:
                raise _invalid(legacy, f"`{legacy}` is deprecated by OpenAI and not supported here: use `{now}`")
        names = [t.function.name for t in self.tools or ()]
        if len(set(names)) != len(names):
            raise _invalid("tools", "tool function names must be unique")
        choice = self.tool_choice
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names:
            raise _invalid("tool_choice", f"tool_choice names the function {choice.function.name!r}, which is "
                                          "not in `tools`")
        if choice == "required" and not names:
            raise _invalid("tool_choice", "tool_choice `required` needs `tools`")
        return self

    @property
    def tool_mode(self) -> str:
        """'none', 'auto', 'required' or 'named' (the default: auto with tools, none without)."""
        if not self.tools or self.tool_choice == "none":
            return "none"
        if isinstance(self.tool_choice, NamedToolChoice):
            return "named"
        return self.tool_choice or "auto"

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


# --------------------------------------------------------------------------------------------- responses


class LoadLoRAAdapterRequest(_Request):
    """vLLM's `POST /v1/load_lora_adapter` body (`--allow-runtime-lora-updating`)."""

    lora_name: str = Field(min_length=1)
    lora_path: str = Field(min_length=1)  # a PEFT folder, hf://ORG/NAME[@REVISION] or s3://BUCKET/PREFIX
    base_model_name: str | None = None


class UnloadLoRAAdapterRequest(_Request):
    """vLLM's `POST /v1/unload_lora_adapter` body."""

    lora_name: str = Field(min_length=1)
    lora_int_id: int | None = None  # vLLM's; the name decides


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
    root: str | None = None  # vLLM's: where the model or LoRA adapter came from
    parent: str | None = None  # vLLM's: a LoRA adapter's base model (None: a base model)


class ModelList(_Response):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class PromptTokensDetails(_Response):
    cached_tokens: int  # prompt tokens the prefix cache served (not computed again)


class Usage(_Response):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None  # --enable-prompt-tokens-details (default on)


class CompletionLogprobs(_Response):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class PromptLogprob(_Response):
    """vLLM's `Logprob`: one token's logprob at a prompt position, its rank there (1: the most likely) and text."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# vLLM's `prompt_logprobs`: per prompt token, null (the first) or {token id: PromptLogprob} of the top N and itself
PromptLogprobs = list[dict[str, PromptLogprob] | None]


class CompletionChoice(_Response):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    prompt_logprobs: PromptLogprobs | None = None  # with the request's prompt_logprobs (or echo with logprobs)


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


class ResponseFunctionCall(_Response):
    name: str
    arguments: str


class ResponseToolCall(_Response):
    id: str
    type: Literal["function"] = "function"
    function: ResponseFunctionCall


class AssistantMessage(_Response):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[ResponseToolCall] | None = None


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
    prompt_logprobs: PromptLogprobs | None = None  # with the request's prompt_logprobs


class DeltaFunctionCall(_Response):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(_Response):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall | None = None


class ChatDelta(_Response):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


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
