"""The batched token mask: every constrained row of a step's logits gets -inf outside its grammar."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hetero_infer.worker.structured.matcher import GrammarState


def apply_grammar_masks(logits: torch.Tensor, rows: Sequence[int], states: Sequence[GrammarState],
                        outputs: Sequence[Sequence[int]]) -> None:
    """In place: logits[rows[j]] keeps only the tokens states[j] allows after outputs[j] (its sequence's
    output tokens so far). One bitmask for the batch, filled on the CPU, applied in one call."""
    import xgrammar as xgr

    num_rows, vocab = logits.shape
    bitmask = xgr.allocate_token_bitmask(num_rows, vocab)
    for row, state, output in zip(rows, states, outputs, strict=True):
        state.sync(output)
        state.fill_mask(bitmask, row)
    xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device, non_blocking=True), vocab_size=vocab,
                                    indices=list(rows))
