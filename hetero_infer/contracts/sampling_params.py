"""Per-request sampling options, shaped like vLLM's `SamplingParams`. Plain data: their ranges are checked
with the rest of the request, once, by `hetero_infer.worker.core.request_check.check_request`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# A per-request logits processor: (the request's generated token ids so far, its logits row) -> the row to
# sample from. The hook for constrained decoding (grammars, tool calls); see LLMEngine._process_logits.
LogitsProcessor = Callable[[list[int], Any], Any]


@dataclass
class StructuredOutputsParams:
    """A constraint on what a request may generate, shaped like vLLM's `StructuredOutputsParams`: exactly one
    of `json` (a JSON schema, as a dict or its text), `regex`, `choice`, `grammar` (EBNF) or `json_object`
    (any JSON object) is set. Compiled and applied as a token mask by the sampler (owner: STRUCT)."""

    json: dict | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    disable_any_whitespace: bool = False


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    seed: int | None = None
    logprobs: int | None = None
    # the logprob of every prompt token after the first, with the top-N at each position (vLLM's prompt_logprobs)
    prompt_logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    logits_processors: list[LogitsProcessor] | None = None
    # token id -> value added to its logit before sampling (OpenAI's `logit_bias`, clamped to [-100, 100])
    logit_bias: dict[int, float] | None = None
    # sample this many and return the `n` with the highest cumulative logprob (vLLM's `best_of`); None: n
    best_of: int | None = None
    structured_outputs: StructuredOutputsParams | None = None
    # the request's priority under `scheduling_policy="priority"` (lower runs first, as vLLM's); ignored under fcfs
    priority: int = 0
    stop_strings: list[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop_strings = [s for s in (self.stop or []) if s]
        self.stop_token_ids = list(self.stop_token_ids or [])

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5
