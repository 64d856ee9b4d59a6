"""A scheduled step launched: the step contract an executor gets (hetero_infer/contracts/step.py: plain data copied
from the core's `Sequence`s, so that no executor sees or keeps them), and the step's work counted as done on the
sequences (computed tokens; prompt logprobs no longer owed), so that the next step can be scheduled before this
one ends. One pass over the step's sequences does both: it is the engine's hot path (a decode step has one entry
per running sequence).

Also the core's side of prompt logprobs: which prompt positions a step still owes a sequence (`owed_prompt_rows`)
and, once the step is launched, that they are owed no more (`mark_launched`).
"""

from __future__ import annotations

from hetero_infer.contracts.step import STEP_CONTRACT_VERSION, PromptLogprobsRows, StepPlan
from hetero_infer.worker.core.scheduler import SchedulerOutput
from hetero_infer.worker.core.sequence import Sequence

# (plan, rows, first): the step's contract, the sequences that sample (in the order of the step's logits rows), and
# those in their first step since (re)admission. A tuple: built once a step on the hot path.
Launch = tuple[StepPlan, list[Sequence], list[Sequence]]


def launch_step(sched: SchedulerOutput, finished_seq_ids: list[int] | None = None) -> Launch:
    """The step's contract (`finished_seq_ids`: the sequences that ended since the previous step), then each
    sequence's `num_computed_tokens` moved past the step's tokens."""
    seq_ids: list[int] = []
    token_ids: list[list[int]] = []
    starts: list[int] = []
    new_prompts: dict[int, list[int]] = {}
    adapters: dict[int, str] = {}
    indexes: dict[int, int] = {}
    owed_rows: dict[int, PromptLogprobsRows] = {}
    partial: list[int] | None = None  # rows that do not sample (a prefill chunk short of its prompt's end): few
    rows: list[Sequence] = []
    first: list[Sequence] = []
    # (list.append called as a method, not bound once: Python 3.11 specialises the call, a bound one costs more)
    for item in sched.scheduled:
        seq = item.seq
        start = seq.num_computed_tokens
        end = seq.num_computed_tokens = start + item.num_new_tokens
        tokens = seq.token_ids
        seq_ids.append(seq.seq_id)
        token_ids.append(tokens[start:end])
        starts.append(start)
        if end == len(tokens):
            rows.append(seq)
        elif partial is None:
            partial = [len(starts) - 1]
        else:
            partial.append(len(starts) - 1)
        if start == seq.num_cached_tokens:
            first.append(seq)
            new_prompts[seq.seq_id] = tokens[: seq.num_prompt_tokens]
            if seq.sample_index:
                indexes[seq.seq_id] = seq.sample_index
        if seq.lora_name is not None:
            adapters[seq.seq_id] = seq.lora_name
        if seq.prompt_logprobs_top is not None:
            owed = owed_prompt_rows(seq, start, end - start)
            if owed is not None:
                owed_rows[seq.seq_id] = owed
            mark_launched(seq)
    samples = [True] * len(seq_ids)
    if partial is not None:
        for i in partial:
            samples[i] = False
    moves = sched.block_moves
    # (positional: the dataclass's keyword and default-factory handling costs as much as the rest of a
    # one-sequence step's plan)
    plan = StepPlan(seq_ids, token_ids, starts, samples, sched.block_table_updates, new_prompts, indexes, owed_rows,
                    adapters, sched.block_copies, moves.restores if moves else [], moves.saves if moves else [],
                    [] if finished_seq_ids is None else finished_seq_ids, STEP_CONTRACT_VERSION)
    return plan, rows, first


def owed_prompt_rows(seq: Sequence, start: int, num_new: int) -> PromptLogprobsRows | None:
    """The prompt logprobs a step owes `seq` when it computes positions start..start+num_new-1: those not handed
    back yet, up to the prompt's last but one (the last one's logits sample the first token)."""
    lo = max(start, seq.prompt_logprob_rows)
    hi = min(start + num_new, seq.num_prompt_tokens - 1)
    if hi <= lo:
        return None
    return PromptLogprobsRows(seq.request_id, lo, seq.token_ids[lo + 1 : hi + 1], seq.prompt_logprobs_top)


def mark_launched(seq: Sequence) -> None:
    """After a step computed `seq`'s tokens up to `num_computed_tokens`: the prompt rows it owes are launched up to
    there (`owed_prompt_rows` skips them from now on, preempted or not), and none are owed once the prompt's last
    but one is."""
    last = seq.num_prompt_tokens - 1
    done = min(seq.num_computed_tokens, last)
    if done > seq.prompt_logprob_rows:
        seq.prompt_logprob_rows = done
    if done == last:
        seq.prompt_logprobs_top = None
