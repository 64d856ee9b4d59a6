"""What the engine hands out: one `RequestDelta` per request per step (what is new), and the cumulative
`RequestOutput` / `CompletionOutput` of the Python API (shaped like vLLM's), built from the deltas in one
place (`OutputAccumulator`)."""

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
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache (vLLM's `num_cached_tokens`)
    # with `prompt_logprobs`: per prompt token, {its id: logprob} plus the top-N (None for the first), as vLLM's;
    # and each prompt token's rank there (vLLM's `Logprob.rank`: the tokens at least as likely, itself included)
    prompt_logprobs: list[dict[int, float] | None] | None = None
    prompt_logprob_ranks: list[int | None] | None = None


@dataclass(slots=True)
class SampleDelta:
    """What one sample (choice) of a request gained: new token ids, new text, new logprobs entries (None
    without logprobs); its cumulative logprob and finish/stop reasons are absolute."""

    token_ids: list[int]
    text: str
    logprobs: list[dict[int, float]] | None
    cumulative_logprob: float | None
    finish_reason: str | None
    stop_reason: int | str | None

    def __reduce__(self) -> tuple:  # pickled per request per message: a plain tuple, not the slots protocol
        return SampleDelta, (self.token_ids, self.text, self.logprobs, self.cumulative_logprob, self.finish_reason,
                             self.stop_reason)


@dataclass(slots=True)
class RequestDelta:
    """One request's news since its previous delta: every sample by index (sample i is `samples[i]`; a
    best_of > n request has none until it ends, then its n best), whether the request ended (`finished`; with `error` when its step failed), when
    it was first scheduled and got its first token, and the end of every step that gave it tokens
    (`time.monotonic()`: the frontend records the request's timing from them)."""

    request_id: str
    samples: list[SampleDelta]
    finished: bool
    error: str | None
    step_times: list[float]
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    num_cached_tokens: int = 0  # prompt tokens the prefix cache served when it was (last) admitted; merged: the first
    prompt_logprobs: list[dict[int, float] | None] | None = None  # in a request's first delta only
    prompt_logprob_ranks: list[int | None] | None = None  # with them

    @property
    def num_new_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.samples)

    def merge(self, later: RequestDelta) -> None:
        """Append a later delta of the same request to this one (deltas of several steps as one)."""
        samples = self.samples
        for i, new in enumerate(later.samples):
            if i == len(samples):
                samples.append(new)
                continue
            s = samples[i]
            if new.token_ids:
                s.token_ids += new.token_ids
            if new.text:
                s.text += new.text
            if new.logprobs is not None:
                if s.logprobs is None:
                    s.logprobs = new.logprobs
                else:
                    s.logprobs += new.logprobs
            s.cumulative_logprob = new.cumulative_logprob
            s.finish_reason = new.finish_reason
            s.stop_reason = new.stop_reason
        self.finished = later.finished
        self.error = later.error
        self.step_times += later.step_times
        if self.first_scheduled_time is None:  # the count of the first admission, as vLLM reports it
            self.first_scheduled_time = later.first_scheduled_time
            self.num_cached_tokens = later.num_cached_tokens
        if self.first_token_time is None:
            self.first_token_time = later.first_token_time
        if self.prompt_logprobs is None:
            self.prompt_logprobs, self.prompt_logprob_ranks = later.prompt_logprobs, later.prompt_logprob_ranks

    def __reduce__(self) -> tuple:
        return RequestDelta, (self.request_id, self.samples, self.finished, self.error, self.step_times,
                              self.first_scheduled_time, self.first_token_time, self.num_cached_tokens,
                              self.prompt_logprobs, self.prompt_logprob_ranks)


class OutputAccumulator:
    """One request's cumulative output, built from its deltas: the only place where deltas are added up."""

    __slots__ = ("_out", "_pieces")

    def __init__(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                 arrival_time: float | None = None) -> None:
        metrics = {} if arrival_time is None else {"arrival_time": arrival_time}
        self._out = RequestOutput(request_id, prompt, prompt_token_ids, [], False, metrics)
        self._pieces: list[list[str]] = []  # per sample, text not joined yet

    @property
    def finished(self) -> bool:
        return self._out.finished

    def add(self, delta: RequestDelta) -> None:
        out = self._out
        samples = out.outputs
        for i, d in enumerate(delta.samples):
            if i == len(samples):
                samples.append(CompletionOutput(i, "", []))
                self._pieces.append([])
            s = samples[i]
            s.token_ids += d.token_ids
            if d.text:
                self._pieces[i].append(d.text)
            if d.logprobs is not None:
                if s.logprobs is None:
                    s.logprobs = []
                s.logprobs += d.logprobs
            s.cumulative_logprob = d.cumulative_logprob
            s.finish_reason = d.finish_reason
            s.stop_reason = d.stop_reason
        out.finished = delta.finished
        out.error = delta.error
        if delta.first_scheduled_time is not None:
            if "first_scheduled_time" not in out.metrics:  # the count of the first admission, as vLLM reports it
                out.num_cached_tokens = delta.num_cached_tokens
            out.metrics.setdefault("first_scheduled_time", delta.first_scheduled_time)
        if delta.first_token_time is not None:
            out.metrics.setdefault("first_token_time", delta.first_token_time)
        if delta.prompt_logprobs is not None:
            out.prompt_logprobs, out.prompt_logprob_ranks = delta.prompt_logprobs, delta.prompt_logprob_ranks

    def output(self) -> RequestOutput:
        """The cumulative output so far (a copy: later deltas do not change it)."""
        out = self._out
        for s, pieces in zip(out.outputs, self._pieces):
            if pieces:
                s.text += "".join(pieces)
                pieces.clear()
        return RequestOutput(
            out.request_id, out.prompt, out.prompt_token_ids,
            [CompletionOutput(s.index, s.text, list(s.token_ids), s.cumulative_logprob,
                              None if s.logprobs is None else list(s.logprobs), s.finish_reason, s.stop_reason)
             for s in out.outputs],
            out.finished, dict(out.metrics), out.error, out.num_cached_tokens, out.prompt_logprobs,
            out.prompt_logprob_ranks)
