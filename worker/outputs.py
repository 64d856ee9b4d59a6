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
# that gave the request tokens (`time.monotonic()`) when the caller of `merge_deltas` passed them (the async
# layer records the per-request timing from them), else None. `LLMEngine.step_merged` merges into the same
# format without building output objects.


def merge_deltas(pending: dict[str, list], outputs: list[RequestOutput], step_end: float | None = None) -> None:
    """Merge one step's delta outputs (`add_request(..., delta=True)`) into `pending`: request id -> [finished,
    error, metrics, samples, step times], a sample [token ids, text pieces, logprobs, cumulative logprob,
    finish reason, stop reason]. The lists of the outputs are taken over (the engine makes new ones for every
    output). With `step_end`, it is appended to the step times of every request in `outputs`."""
    for out in outputs:
        e = pending.get(out.request_id)
        if e is None:
            pending[out.request_id] = [out.finished, out.error, out.metrics, [
                [c.token_ids, [c.text], c.logprobs, c.cumulative_logprob, c.finish_reason, c.stop_reason]
                for c in out.outputs], None if step_end is None else [step_end]]
            continue
        e[0] = out.finished
        e[1] = out.error
        e[2] = out.metrics
        samples = e[3]
        for c in out.outputs:
            if c.index >= len(samples):
                samples.append([c.token_ids, [c.text], c.logprobs, c.cumulative_logprob, c.finish_reason,
                                c.stop_reason])
                continue
            smp = samples[c.index]
            smp[0] += c.token_ids
            smp[1].append(c.text)
            if c.logprobs is not None:
                if smp[2] is None:
                    smp[2] = c.logprobs
                else:
                    smp[2] += c.logprobs
            smp[3] = c.cumulative_logprob
            smp[4] = c.finish_reason
            smp[5] = c.stop_reason
        if step_end is not None:
            e[4].append(step_end)


def take_entries(pending: dict[str, list]) -> list[tuple]:
    """The entries of what `merge_deltas` gathered."""
    return [(rid, e[0], e[1], e[2], [(ids, "".join(pieces), lps, cum, fr, sr) for ids, pieces, lps, cum, fr, sr
                                     in e[3]], e[4])
            for rid, e in pending.items()]
