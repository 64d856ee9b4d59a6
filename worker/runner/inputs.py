"""A scheduled step's model inputs: the new tokens of every scheduled sequence, flattened, with their
positions and KV-cache slots, the rows whose logits are sampled, and those whose logits give prompt logprobs."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hetero_infer.contracts.step import PLACEHOLDER, StepPlan
from hetero_infer.worker.runner.attention import SeqSpan, StepBatch
from hetero_infer.worker.runner.prompt_logprobs import PromptRows


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


def step_inputs(plan: StepPlan, tables: dict[int, list[int]], block_size: int) -> StepInputs:
    """`tables`: the executor's block tables by seq_id, with the plan's updates applied
    (`apply_block_table_updates`). Plain Python lists, one numpy array each at the end: after a decode step's
    weights have streamed through the caches every distinct numpy or torch call runs cold (~10-100 us), and a
    decode step has one row a sequence."""
    bs = block_size
    tokens: list[int] = []
    pos: list[int] = []
    slots: list[int] = []
    spans: list[SeqSpan] = []
    logits_index: list[int] = []
    placeholders: list[tuple[int, int]] = []
    prompt_rows: list[PromptRows] = []
    owed = plan.prompt_logprobs
    row = 0
    for seq_id, ids, start, samples in zip(plan.seq_ids, plan.token_ids, plan.starts, plan.samples):
        n = len(ids)
        table = tables[seq_id]
        positions = range(start, start + n)
        tokens += ids
        pos.extend(positions)
        slots.extend([table[p // bs] * bs + p % bs for p in positions])
        spans.append(SeqSpan(table, start, n, n > 1 or not samples))  # is_prefill (StepPlan.is_prefill)
        if owed and (rows := owed.get(seq_id)) is not None:
            prompt_rows.append(PromptRows(rows.request_id, row + rows.position - start, rows.position, rows.targets,
                                          rows.k))
        row += n
        if ids[-1] == PLACEHOLDER:  # only ever a sequence's newest token
            placeholders.append((row - 1, seq_id))
        if samples:
            logits_index.append(row - 1)
    batch = StepBatch(spans, np.array(pos, dtype=np.int64), np.array(slots, dtype=np.int64), bs)
    return StepInputs(np.array(tokens, dtype=np.int64), batch, np.array(logits_index, dtype=np.int64), placeholders,
                      plan.block_copies, prompt_rows)


def placeholder_rows(step: StepInputs, prev_tokens, prev_rows: dict[int, int]) -> tuple[list[int], list[int]]:
    """(rows of the step whose input is a PLACEHOLDER, each one's row in the previous step's sampled tokens
    `prev_tokens`, from `prev_rows`: sequence id -> row)."""
    if prev_tokens is None:
        raise RuntimeError("a step reads tokens of a previous step that this executor did not run")
    return [r for r, _ in step.placeholders], [prev_rows[seq_id] for _, seq_id in step.placeholders]
