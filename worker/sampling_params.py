"""Per-request sampling options, shaped like vLLM's `SamplingParams`."""

from __future__ import annotations

from dataclasses import dataclass, field


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
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    stop_strings: list[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop_strings = [s for s in (self.stop or []) if s]
        self.stop_token_ids = list(self.stop_token_ids or [])
        self.validate()

    def validate(self) -> None:
        """Raise ValueError with a clear message for any out-of-range field."""
        def bad(name: str, why: str) -> None:
            raise ValueError(f"SamplingParams.{name} {why}, got {getattr(self, name)!r}")

        if not isinstance(self.n, int) or self.n < 1:
            bad("n", "must be an integer >= 1")
        if self.temperature < 0.0:
            bad("temperature", "must be >= 0")
        if not 0.0 < self.top_p <= 1.0:
            bad("top_p", "must be in (0, 1]")
        if not isinstance(self.top_k, int) or self.top_k == 0 or self.top_k < -1:
            bad("top_k", "must be -1 (disabled) or an integer >= 1")
        if not 0.0 <= self.min_p <= 1.0:
            bad("min_p", "must be in [0, 1]")
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens < 1):
            bad("max_tokens", "must be an integer >= 1 or None")
        if self.min_tokens < 0:
            bad("min_tokens", "must be >= 0")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            bad("logprobs", "must be in [0, 20]")
        if not -2.0 <= self.presence_penalty <= 2.0:
            bad("presence_penalty", "must be in [-2, 2]")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            bad("frequency_penalty", "must be in [-2, 2]")
        if not 0.0 < self.repetition_penalty <= 2.0:
            bad("repetition_penalty", "must be in (0, 2]")
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            bad("stop_token_ids", "must be non-negative integers")

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5
