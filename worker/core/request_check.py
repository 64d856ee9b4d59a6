"""The one semantic check of a request, against the engine's limits: run once, before a request is queued, by
whoever accepts it (the server's handlers on the event loop, `LLM.generate`, `LLMEngine.add_request` for
direct callers). Pydantic checks the shape of an HTTP body; everything that depends on the values and on the
engine's limits is here, and each failure is a `RequestError` that carries its OpenAI status, type, code and
parameter, so that nobody has to recognise an error by its message."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import repeat

from hetero_infer.contracts.sampling_params import SamplingParams
from hetero_infer.worker.structured.check import ConstraintError, check_constraints


@dataclass(frozen=True)
class EngineLimits:
    """What a frontend needs to know of the engine to check requests without it (the process client gets it
    from the engine process when the engine is ready)."""

    model_name: str
    max_model_len: int
    vocab_size: int
    num_blocks: int
    block_size: int
    eos_token_ids: tuple[int, ...]
    has_tokenizer: bool = True  # False with skip_tokenizer_init: token ids only, no text-based features
    kv_events: tuple[str, str] | None = None  # (endpoint bound, topic) of its KV events (--kv-events-config)


class RequestError(ValueError):
    """A request the engine cannot serve; `param` names the offending field (OpenAI's `error.param`)."""

    def __init__(self, message: str, *, param: str | None = None, code: str = "invalid_value",
                 status: int = 400, type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.status = status
        self.type = type

    def __reduce__(self) -> tuple:  # crosses the engine process's pipe with its fields
        return type(self), (self.message,), self.__dict__


@dataclass(frozen=True)
class ParamNames:
    """How the caller's API names the fields that a failure points at (chat's `max_completion_tokens`, a
    completions batch's `prompt.3`)."""

    prompt: str = "prompt"
    max_tokens: str = "max_tokens"


DEFAULT_NAMES = ParamNames()


def context_length_error(max_model_len: int, n_prompt: int, n_completion: int, param: str) -> RequestError:
    """The one context-length message (OpenAI's wording)."""
    return RequestError(
        f"This model's maximum context length is {max_model_len} tokens. However, you requested "
        f"{n_prompt + n_completion} tokens ({n_prompt} in the prompt, {n_completion} for the completion). "
        "Please reduce the length of the prompt or the completion.",
        param=param, code="context_length_exceeded")


def check_request(prompt_token_ids: list[int], params: SamplingParams, limits: EngineLimits, *,
                  names: ParamNames = DEFAULT_NAMES, max_n: int | None = None, parse_grammar: bool = True) -> int:
    """Raise `RequestError` for a request the engine cannot serve; return its resolved max_tokens (the rest of
    the context when `params.max_tokens` is None). `max_n`: a server's cap on `n` (its max_num_seqs).
    `parse_grammar=False`: a structured-output grammar is only checked for its shape here (the server has the
    engine parse and compile it off both loops, `EngineClient.prepare_grammar`)."""
    check_sampling_params(params)
    if not limits.has_tokenizer:
        check_needs_no_tokenizer(params)
    try:
        check_constraints(params, limits.vocab_size, parse_grammar)
    except ConstraintError as exc:
        raise RequestError(str(exc), param=exc.param) from None
    if max_n is not None and params.n > max_n:
        raise RequestError(f"n ({params.n}) is larger than this server's max_num_seqs ({max_n})", param="n")
    if max_n is not None and params.best_of is not None and params.best_of > max_n:
        raise RequestError(f"best_of ({params.best_of}) is larger than this server's max_num_seqs ({max_n})",
                           param="best_of")
    n_prompt = len(prompt_token_ids)
    if n_prompt == 0:
        raise RequestError("the prompt is empty: at least one token is needed", param=names.prompt)
    vocab_size = limits.vocab_size
    if (not all(map(isinstance, prompt_token_ids, repeat(int)))  # C loops: this runs once per request served
            or min(prompt_token_ids) < 0 or max(prompt_token_ids) >= vocab_size):
        raise RequestError(f"prompt token ids must be integers in [0, {vocab_size})", param=names.prompt)
    max_model_len = limits.max_model_len
    if n_prompt >= max_model_len:
        raise context_length_error(max_model_len, n_prompt, params.max_tokens or 1, names.prompt)
    max_tokens = params.max_tokens if params.max_tokens is not None else max_model_len - n_prompt
    if n_prompt + max_tokens > max_model_len:
        raise context_length_error(max_model_len, n_prompt, max_tokens, names.max_tokens)
    if params.min_tokens > max_tokens:
        raise RequestError(f"min_tokens ({params.min_tokens}) is larger than max_tokens ({max_tokens})",
                           param="min_tokens")
    needed = -(-(n_prompt + max_tokens) // limits.block_size)
    if needed > limits.num_blocks:
        raise RequestError(
            f"the request needs up to {needed} KV-cache blocks ({n_prompt + max_tokens} tokens) but the pool "
            f"holds {limits.num_blocks}; lower max_tokens or raise --max-num-blocks", param=names.max_tokens)
    return max_tokens


def check_needs_no_tokenizer(p: SamplingParams) -> None:
    """What an engine without a tokenizer (`skip_tokenizer_init`) cannot do: match text (stop strings) or
    compile a grammar over the vocabulary's strings (structured outputs)."""
    if p.stop_strings:
        raise RequestError("stop strings need a tokenizer, and this engine runs without one (skip_tokenizer_init): "
                           "use stop_token_ids", param="stop")
    if p.structured_outputs is not None:
        raise RequestError("structured outputs need a tokenizer, and this engine runs without one "
                           "(skip_tokenizer_init)", param="structured_outputs")


def check_sampling_params(p: SamplingParams) -> None:
    """The value ranges of the sampling parameters (`RequestError` naming the field)."""
    def bad(name: str, why: str) -> None:
        raise RequestError(f"{name} {why}, got {getattr(p, name)!r}", param=name)

    if not isinstance(p.n, int) or p.n < 1:
        bad("n", "must be an integer >= 1")
    if p.best_of is not None and (not isinstance(p.best_of, int) or p.best_of < p.n):
        bad("best_of", f"must be an integer >= n ({p.n}) or None")
    if p.temperature < 0.0:
        bad("temperature", "must be >= 0")
    if not 0.0 < p.top_p <= 1.0:
        bad("top_p", "must be in (0, 1]")
    if not isinstance(p.top_k, int) or p.top_k == 0 or p.top_k < -1:
        bad("top_k", "must be -1 (disabled) or an integer >= 1")
    if not 0.0 <= p.min_p <= 1.0:
        bad("min_p", "must be in [0, 1]")
    if p.max_tokens is not None and (not isinstance(p.max_tokens, int) or p.max_tokens < 1):
        bad("max_tokens", "must be an integer >= 1 or None")
    if p.min_tokens < 0:
        bad("min_tokens", "must be >= 0")
    if p.logprobs is not None and not 0 <= p.logprobs <= 20:
        bad("logprobs", "must be in [0, 20]")
    if p.prompt_logprobs is not None and (not isinstance(p.prompt_logprobs, int) or not 0 <= p.prompt_logprobs <= 20):
        bad("prompt_logprobs", "must be an integer in [0, 20]")
    if not -2.0 <= p.presence_penalty <= 2.0:
        bad("presence_penalty", "must be in [-2, 2]")
    if not -2.0 <= p.frequency_penalty <= 2.0:
        bad("frequency_penalty", "must be in [-2, 2]")
    if not 0.0 < p.repetition_penalty <= 2.0:
        bad("repetition_penalty", "must be in (0, 2]")
    if any(not isinstance(t, int) or t < 0 for t in p.stop_token_ids):
        bad("stop_token_ids", "must be non-negative integers")
