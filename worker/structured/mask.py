"""The token masks of structured outputs as data: the engine fills each constrained row's allowed tokens from its
matcher (`grammar_bitmasks`), the sampler gives every constrained row of a step's logits -inf outside them
(`apply_token_bitmasks`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hetero_infer.worker.structured.matcher import GrammarState


def grammar_bitmasks(states: Sequence[GrammarState], outputs: Sequence[Sequence[int]], vocab_size: int) -> torch.Tensor:
    """The engine's side: the tokens each of `states` allows after `outputs[j]` (its sequence's output tokens so
    far), as xgrammar's packed token bitmask (int32 [len(states), ceil(vocab_size / 32)], bit set: allowed; stop
    tokens only where the grammar is complete): plain data, one row a `SamplingRow.token_bitmask`."""
    import xgrammar as xgr

    bitmask = xgr.allocate_token_bitmask(len(states), vocab_size)
    for j, (state, output) in enumerate(zip(states, outputs, strict=True)):
        state.sync(output)
        state.fill_mask(bitmask, j)
    return bitmask


def apply_token_bitmasks(logits: torch.Tensor, rows: Sequence[int], masks: Sequence[torch.Tensor]) -> None:
    """In place: logits[rows[j]] keeps only the tokens `masks[j]` (a `grammar_bitmasks` row) allows. One bitmask
    for the batch, applied in one call where the logits are."""
    import xgrammar as xgr

    num_rows, vocab = logits.shape
    bitmask = xgr.allocate_token_bitmask(num_rows, vocab)
    bitmask[list(rows)] = torch.stack(list(masks))
    xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device, non_blocking=True), vocab_size=vocab,
                                    indices=list(rows))
