"""What `execute_async` returns: a handle on a step the device may still be running. `result()` waits for it
(the one place the host synchronises with the device) and returns the sampled token ids, one per sequence that
samples in the step, with each one's `SampledToken` where any row has logprobs (or the host sampler ran).
`prompt_logprobs`: the prompt logprobs the step computed (runner/prompt_logprobs.py), else None; reading them waits
for their copy only (`result()` need not come first)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from hetero_infer.worker.runner.prompt_logprobs import PromptLogprobsCopy, StepPromptLogprobs
from hetero_infer.worker.runner.sampler import SampledToken, StepLogprobs, unpack_step

StepResult = tuple[list[int], "list[SampledToken] | None"]


class StepHandle(Protocol):
    @property
    def prompt_logprobs(self) -> StepPromptLogprobs | None: ...

    def result(self) -> StepResult: ...


class CarriesPromptLogprobs:
    """A step handle's `prompt_logprobs`, from its `prompt` copy (each handle is a slotted dataclass with that field)."""

    __slots__ = ()
    prompt: PromptLogprobsCopy | None

    @property
    def prompt_logprobs(self) -> StepPromptLogprobs | None:
        return None if self.prompt is None else self.prompt.entries()


@dataclass(slots=True)
class DoneStep(CarriesPromptLogprobs):
    """A step whose tokens the host has already (a synchronous executor, or the host sampler)."""

    token_ids: list[int]
    sampled: list[SampledToken] | None = None
    prompt: PromptLogprobsCopy | None = None

    def result(self) -> StepResult:
        return self.token_ids, self.sampled


@dataclass(slots=True)
class DeviceStep(CarriesPromptLogprobs):
    """A CUDA step: its tokens (and logprobs) are copied into a pinned host buffer behind the step's kernels, in
    one copy; `event` marks the copy's end on the stream."""

    event: Any  # torch.cuda.Event (None on the CPU, where the copy has happened)
    host: Any  # pinned torch.Tensor: the int64 tokens [rows], or with `logprobs` `StepSample.pack`'s float64 layout
    num_rows: int
    logprobs: StepLogprobs | None = None
    prompt: PromptLogprobsCopy | None = None

    def result(self) -> StepResult:
        if self.event is not None:
            self.event.synchronize()
        if self.logprobs is None:
            return self.host.tolist(), None
        return unpack_step(self.host.numpy(), self.num_rows, self.logprobs)
