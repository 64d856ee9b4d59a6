"""A scheduled step's model inputs: the new tokens of every scheduled sequence, flattened, with their
positions and KV-cache slots, and the rows whose logits are sampled."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hetero_infer.worker.core.scheduler import SchedulerOutput
from hetero_infer.worker.runner.attention import SeqSpan, StepBatch


@dataclass
class StepInputs:
    token_ids: list[int]
    batch: StepBatch  # positions, slots and per-sequence spans, for the attention backend's metadata
    logits_index: list[int]  # rows of the flattened step whose logits are sampled (each sequence's last token)


def step_inputs(sched: SchedulerOutput, block_size: int) -> StepInputs:
    bs = block_size
    tokens: list[int] = []
    pos: list[np.ndarray] = []
    slots: list[np.ndarray] = []
    spans: list[SeqSpan] = []
    logits_index: list[int] = []
    row = 0
    for item in sched.scheduled:
        seq = item.seq
        start, n = seq.num_computed_tokens, item.num_new_tokens
        table = np.asarray(seq.block_table, dtype=np.int64)
        p = np.arange(start, start + n, dtype=np.int64)
        tokens.extend(seq.token_ids[start : start + n])
        pos.append(p)
        slots.append(table[p // bs] * bs + p % bs)
        spans.append(SeqSpan(seq.block_table, start, n, seq.is_prefill))
        row += n
        if item.samples:
            logits_index.append(row - 1)
    return StepInputs(tokens, StepBatch(spans, np.concatenate(pos), np.concatenate(slots), bs), logits_index)
