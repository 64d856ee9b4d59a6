"""Prompt logprobs (vLLM's `SamplingParams.prompt_logprobs`, OpenAI's `echo` with `logprobs`): for every prompt
token after the first, its logprob given the tokens before it and its rank there (vLLM's `Logprob.rank`: how many
tokens are at least as likely, itself included), with the `k` most likely tokens at that position.

What evaluation harnesses score with (lm-evaluation-harness's loglikelihood tasks send `echo=True, logprobs=1`).
They come from the request's own prefill steps, as vLLM computes them: a step that computes prompt positions
whose logprobs are still owed (`Sequence.prompt_logprobs_top`) also takes the logits of those rows, `LOGITS_ROWS`
at a time so that [rows, vocabulary] logits do not grow with the step, and hands the entries back with its tokens.
Such a sequence computes its whole prompt (no prefix-cache hits: a cached block has no logits), once: a prefill
recomputed after a preemption skips the rows it has already handed back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

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


def rows_of(seq, start: int, num_new: int, row: int) -> PromptRows | None:
    """The prompt rows a step owes `seq` when it computes positions start..start+num_new-1 from step row `row`:
    those not handed back yet, up to the prompt's last but one (the last one's logits sample the first token)."""
    lo = max(start, seq.prompt_logprob_rows)
    hi = min(start + num_new, seq.num_prompt_tokens - 1)
    if hi <= lo:
        return None
    return PromptRows(seq.request_id, row + lo - start, lo, seq.token_ids[lo + 1 : hi + 1], seq.prompt_logprobs_top)


def mark_launched(seq) -> None:
    """After a step computed `seq`'s tokens up to `num_computed_tokens`: the prompt rows it owes are launched up to
    there (`rows_of` skips them from now on, preempted or not), and none are owed once the prompt's last but one is."""
    last = seq.num_prompt_tokens - 1
    done = min(seq.num_computed_tokens, last)
    if done > seq.prompt_logprob_rows:
        seq.prompt_logprob_rows = done
    if done == last:
        seq.prompt_logprobs_top = None


def entries(logits: torch.Tensor, targets: Sequence[int], k: int) -> tuple[list[dict[int, float]], list[int]]:
    """Per row of `logits` [R, vocab] (float32 or wider): {its target: logprob} plus the `k` most likely tokens'
    (those first, most likely first), and the target's rank."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    target = torch.as_tensor(list(targets), dtype=torch.long, device=logprobs.device)
    chosen_t = logprobs.gather(1, target[:, None])
    ranks = (logprobs >= chosen_t).sum(dim=-1).tolist()
    chosen = chosen_t[:, 0].tolist()
    if k > 0:
        top_values, top_ids = logprobs.topk(k, dim=-1)
        top_values, top_ids = top_values.tolist(), top_ids.tolist()
    out = []
    for row, (t, lp) in enumerate(zip(targets, chosen, strict=True)):
        entry = dict(zip(top_ids[row], top_values[row], strict=True)) if k > 0 else {}
        entry[t] = lp
        out.append(entry)
    return out, ranks


def step_entries(rows: list[PromptRows], logits_of: Callable[[PromptRows, int, int], torch.Tensor]
                 ) -> StepPromptLogprobs:
    """The entries of a step's prompt rows, from `logits_of(rows, i, end)`: the logits of their rows i..end-1,
    asked for at most `LOGITS_ROWS` at a time."""
    out: StepPromptLogprobs = []
    for r in rows:
        got: list[dict[int, float]] = []
        ranks: list[int] = []
        n = len(r.targets)
        for i in range(0, n, LOGITS_ROWS):
            end = min(i + LOGITS_ROWS, n)
            e, rk = entries(logits_of(r, i, end), r.targets[i:end], r.k)
            got += e
            ranks += rk
        out.append((r.request_id, got, ranks))
    return out
