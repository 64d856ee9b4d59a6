"""Prompt logprobs (vLLM's `SamplingParams.prompt_logprobs`, OpenAI's `echo` with `logprobs`): for every prompt
token after the first, its logprob given the tokens before it and its rank there (vLLM's `Logprob.rank`: how many
tokens are at least as likely, itself included), with the `k` most likely tokens at that position.

What evaluation harnesses score with (lm-evaluation-harness's loglikelihood tasks send `echo=True, logprobs=1`).
They come from the request's own prefill steps, as vLLM computes them: a step that computes prompt positions
whose logprobs are still owed (the step contract's `PromptLogprobsRows`, which the engine core sets from
`Sequence.prompt_logprobs_top`: worker/core/step_plan.py) also takes the logits of those rows, `LOGITS_ROWS` at a
time so that [rows, vocabulary] logits do not grow with the step, and hands the entries back with its tokens.
Such a sequence computes its whole prompt (no prefix-cache hits: a cached block has no logits), once: a prefill
recomputed after a preemption skips the rows it has already handed back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from hetero_infer.worker.runner.staging import to_device

LOGITS_ROWS = 256  # rows of [rows, vocab] float32 logits at a time: 150 MiB at a 151,936-token vocabulary
# (request id, the entries a step computed for it, their prompt tokens' ranks)
StepPromptLogprobs = list[tuple[str, list[dict[int, float]], list[int]]]


@dataclass(slots=True)
class PromptRows:
    """Rows of a step whose logits give prompt logprobs: `len(targets)` rows from `row` (in the step's flattened
    tokens), at prompt positions from `position`; row i's logits give the logprob of `targets[i]`."""

    request_id: str
    row: int
    position: int
    targets: list[int]
    k: int


def packed_rows(logits: torch.Tensor, targets: Sequence[int], k: int) -> torch.Tensor:
    """Per row of `logits` [R, vocab] (any float dtype), where they are: [R, 2 + 2k] float64 of the target's logprob,
    its rank, then the `k` most likely tokens' logprobs and ids (most likely first). Nothing reaches the host here:
    on CUDA the targets go up through pinned memory, and no result is read (`PromptLogprobsCopy` brings them)."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    target = to_device(torch.tensor(list(targets), dtype=torch.long), logprobs.device)
    chosen = logprobs.gather(1, target[:, None])
    ranks = (logprobs >= chosen).sum(dim=-1, keepdim=True)
    parts = [chosen.double(), ranks.double()]
    if k > 0:
        top_values, top_ids = logprobs.topk(k, dim=-1)
        parts += [top_values.double(), top_ids.double()]  # token ids and ranks are exact in float64
    return torch.cat(parts, dim=1)


@dataclass(slots=True)
class PromptLogprobsCopy:
    """A step's prompt logprobs on their way to the host: every `PromptRows`' `packed_rows`, flattened into one
    vector and copied in one transfer behind the step's kernels (on CUDA into pinned memory, `event` marking the
    copy's end), so that a step computing them does not hold the host. `entries()` waits for the copy (the first
    time) and gives the `StepPromptLogprobs`."""

    values: torch.Tensor  # float64 [sum over groups of len(targets) * (2 + 2k)]
    groups: list[tuple[str, list[int], int]]  # (request id, targets, k), in the order of `values`
    event: Any = None
    _entries: StepPromptLogprobs | None = None

    @classmethod
    def launch(cls, parts: list[torch.Tensor], groups: list[tuple[str, list[int], int]]) -> PromptLogprobsCopy:
        values = torch.cat([p.flatten() for p in parts])
        if values.device.type != "cuda":
            return cls(values, groups)
        host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
        host.copy_(values, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        return cls(host, groups, event)

    def entries(self) -> StepPromptLogprobs:
        if self._entries is None:
            if self.event is not None:
                self.event.synchronize()
            self._entries = unpack(self.values.tolist(), self.groups)
        return self._entries


def unpack(flat: list[float], groups: list[tuple[str, list[int], int]]) -> StepPromptLogprobs:
    """`PromptLogprobsCopy.values` on the host, as entries: per row {its target: logprob} after the `k` most likely
    tokens' (most likely first), and the target's rank."""
    out: StepPromptLogprobs = []
    at = 0
    for request_id, targets, k in groups:
        width = 2 + 2 * k
        got: list[dict[int, float]] = []
        ranks: list[int] = []
        for t in targets:
            row = flat[at : at + width]
            at += width
            entry = dict(zip(map(int, row[2 + k :]), row[2 : 2 + k], strict=True))
            entry[t] = row[0]
            got.append(entry)
            ranks.append(int(row[1]))
        out.append((request_id, got, ranks))
    return out


def step_entries(rows: list[PromptRows], logits_of: Callable[[PromptRows, int, int], torch.Tensor]
                 ) -> PromptLogprobsCopy:
    """A step's prompt rows' entries, from `logits_of(rows, i, end)`: the logits of their rows i..end-1, asked for
    at most `LOGITS_ROWS` at a time, on their way to the host."""
    parts = [packed_rows(logits_of(r, i, min(i + LOGITS_ROWS, len(r.targets))), r.targets[i : i + LOGITS_ROWS], r.k)
             for r in rows for i in range(0, len(r.targets), LOGITS_ROWS)]
    return PromptLogprobsCopy.launch(parts, [(r.request_id, r.targets, r.k) for r in rows])
