"""One generated sequence (a request with n > 1 holds n of them, scheduled independently) and its bookkeeping."""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field
from typing import Any

from hetero_infer.contracts.sampling_params import SamplingParams
from hetero_infer.contracts.step import PLACEHOLDER  # noqa: F401  (the engine writes the real token when it comes)

_seq_counter = itertools.count()


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    request_id: str
    token_ids: list[int]  # prompt followed by generated tokens
    num_prompt_tokens: int
    params: SamplingParams
    max_tokens: int  # params.max_tokens resolved against max_model_len
    sample_index: int = 0
    seq_id: int = field(default_factory=lambda: next(_seq_counter))
    status: SequenceStatus = SequenceStatus.WAITING
    block_table: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0  # tokens whose K/V are in the cache
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache at the last admission
    block_hashes: list[int] = field(default_factory=list)  # chain hashes of leading full blocks
    num_registered_blocks: int = 0  # leading full blocks already offered to the prefix cache
    num_preemptions: int = 0
    # n > 1: the request's first sample, whose computed prompt blocks this one takes from the prefix cache
    # (Scheduler._waits_for_prompt_leader); None for the first sample itself
    prompt_leader: Sequence | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    cumulative_logprob: float = 0.0
    logprobs: list[dict[int, float]] | None = None
    seed: int | None = None  # a seeded request's: this sample's (`sample_seed`), its generator the executor's
    sampler_params: Any = None  # what the sampler gets: `params`, or a copy that asks for logprobs (best_of)
    stop_checker: Any = None  # an IncrementalDetokenizer where the request has stop strings (else None)
    num_pending: int = 0  # PLACEHOLDER tokens at the end of token_ids (steps in flight that sample this sequence)
    grammar: Any = None  # structured outputs: the sequence's GrammarState (worker/structured)
    # prompt logprobs still owed (worker/runner/prompt_logprobs.py): their top-k while any are, else None; and how
    # many prompt rows' logprobs the steps launched so far compute (a recomputed prefill skips them)
    prompt_logprobs_top: int | None = None
    prompt_logprob_rows: int = 0
    lora_name: str | None = None  # the LoRA adapter it runs with (None: the base model)
    lora_id: int | None = None  # that adapter's lora_int_id (its blocks' KV events carry it, as vLLM's do)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_known_tokens(self) -> int:
        """Tokens whose ids the host has: `num_tokens` less the placeholders of steps in flight."""
        return len(self.token_ids) - self.num_pending

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def is_prefill(self) -> bool:
        """True while more than the newest token still lacks K/V (prompt or recompute after preemption)."""
        return self.num_tokens - self.num_computed_tokens > 1
