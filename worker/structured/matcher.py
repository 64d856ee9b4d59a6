"""One sequence's position in its grammar: an xgrammar matcher over a shared compiled grammar, advanced with
each token the sequence accepts. Every sequence (each of a request's n samples) has its own."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    import xgrammar


class GrammarState:
    def __init__(self, compiled: xgrammar.CompiledGrammar) -> None:
        import xgrammar as xgr

        self._matcher = xgr.GrammarMatcher(compiled)
        self.num_accepted = 0  # output tokens fed to the matcher (accepted or not)
        self.rejected = False  # a token outside the grammar came (a logits processor overrode the mask)

    def accept(self, token_id: int) -> bool:
        """Advance past the sequence's next output token; False if the grammar does not allow it."""
        self.num_accepted += 1
        ok = not self.rejected and self._matcher.accept_token(token_id)
        self.rejected = not ok
        return ok

    def sync(self, output_token_ids: Sequence[int]) -> None:
        """Catch up with output tokens not fed yet (none in the engine's own flow: it feeds each one)."""
        for token_id in output_token_ids[self.num_accepted:]:
            self.accept(token_id)

    @property
    def is_terminated(self) -> bool:
        """The grammar is complete and a stop token was accepted: nothing may follow."""
        return self._matcher.is_terminated()

    def fill_mask(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the allowed next tokens into bitmask[row] (bit set: allowed; stop tokens only when complete)."""
        self._matcher.fill_next_token_bitmask(bitmask, row)
