"""Results returned by the engine and by `LLM.generate`, shaped like vLLM's."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    # One dict per generated token: token id -> logprob (the sampled token plus the top-N).
    logprobs: list[dict[int, float]] | None = None
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    stop_reason: int | str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None  # set when the request failed inside the engine (finish_reason "error")


# Merged delta outputs: what the engine side of the server hands its event loop (and the engine process its
# parent), per request that progressed since the previous hand-over: the deltas of all steps in between,
# merged. An entry: (request id, finished, error, metrics, samples, step times); a sample: (token ids, text,
# logprobs entries or None, cumulative logprob, finish reason, stop reason); step times: the end of every step
# that gave the request tokens (`time.monotonic()`; the async layer records the per-request timing from them).
# `LLMEngine.step_merged` merges a step's deltas into this format without building output objects.


def take_entries(pending: dict[str, list]) -> list[tuple]:
    """The entries of what `LLMEngine.step_merged` gathered."""
    return [(rid, e[0], e[1], e[2], [(ids, "".join(pieces), lps, cum, fr, sr) for ids, pieces, lps, cum, fr, sr
                                     in e[3]], e[4])
            for rid, e in pending.items()]
