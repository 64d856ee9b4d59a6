"""A scheduled step's model inputs: the new tokens of every scheduled sequence, flattened, with their
positions and KV-cache slots, the rows whose logits are sampled, and those whose logits give prompt logprobs."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hetero_infer.worker.core.scheduler import SchedulerOutput
from hetero_infer.worker.core.sequence import PLACEHOLDER
from hetero_infer.worker.runner.attention import SeqSpan, StepBatch
from hetero_infer.worker.runner.prompt_logprobs import PromptRows, rows_of


@dataclass
class StepInputs:
    token_ids: np.ndarray  # [T] int64
    batch: StepBatch  # positions, slots and per-sequence spans, for the attention backend's metadata
    logits_index: np.ndarray  # [S] int64: rows of the flattened step whose logits are sampled (each sequence's last)
    # (row, seq_id) of every PLACEHOLDER in token_ids: a token the previous step sampled, still on the device
    placeholders: list[tuple[int, int]]
    # (source, destination) KV blocks copied before the step runs (copy-on-write of a shared last block)
    block_copies: list[tuple[int, int]] = field(default_factory=list)
    prompt_rows: list[PromptRows] = field(default_factory=list)  # rows whose logits give prompt logprobs


def step_inputs(sched: SchedulerOutput, block_size: int) -> StepInputs:
    """Plain Python lists, one numpy array each at the end: after a decode step's weights have streamed through
    the caches every distinct numpy or torch call runs cold (~10-100 us), and a decode step has one row a
    sequence."""
    bs = block_size
    tokens: list[int] = []
    pos: list[int] = []
    slots: list[int] = []
    spans: list[SeqSpan] = []
    logits_index: list[int] = []
    placeholders: list[tuple[int, int]] = []
    prompt_rows: list[PromptRows] = []
    row = 0
    for item in sched.scheduled:
        seq = item.seq
        start, n = seq.num_computed_tokens, item.num_new_tokens
        table = seq.block_table
        positions = range(start, start + n)
        tokens.extend(seq.token_ids[start : start + n])
        pos.extend(positions)
        slots.extend([table[p // bs] * bs + p % bs for p in positions])
        spans.append(SeqSpan(table, start, n, seq.is_prefill))
        if seq.prompt_logprobs_top is not None and (rows := rows_of(seq, start, n, row)) is not None:
            prompt_rows.append(rows)
        row += n
        if tokens[-1] == PLACEHOLDER:  # only ever a sequence's newest token
            placeholders.append((row - 1, seq.seq_id))
        if item.samples:
            logits_index.append(row - 1)
    batch = StepBatch(spans, np.array(pos, dtype=np.int64), np.array(slots, dtype=np.int64), bs)
    return StepInputs(np.array(tokens, dtype=np.int64), batch, np.array(logits_index, dtype=np.int64), placeholders,
                      sched.block_copies, prompt_rows)


def placeholder_rows(step: StepInputs, prev_tokens, prev_rows: dict[int, int]) -> tuple[list[int], list[int]]:
    """(rows of the step whose input is a PLACEHOLDER, each one's row in the previous step's sampled tokens
    `prev_tokens`, from `prev_rows`: sequence id -> row)."""
    if prev_tokens is None:
        raise RuntimeError("a step reads tokens of a previous step that this executor did not run")
    return [r for r, _ in step.placeholders], [prev_rows[seq_id] for _, seq_id in step.placeholders]
