"""The step contract between the engine core and an executor (vLLM V1's `SchedulerOutput`, in plain data): what one
scheduled step computes, built by the engine from its scheduler's output (worker/core/step_plan.py) and handed to
`Executor.execute_async` (worker/runner/executors.py) with the sampling metadata of the rows that sample.

The runner imports nothing of the engine core but this module (tests/test_imports.py checks it): no `Sequence`,
no scheduler, no block manager. Everything here is a fresh value built for the step (lists copied, nothing the
core changes afterwards), so a step can cross a process boundary as it is (its `SamplingRow`s too). Dependency-free, like the other contracts.

What does not change from step to step is sent once (vLLM's `CachedRequestData` idea): a sequence's block table
only where it changed (`block_table_updates`, which the executor applies to the tables it keeps by `seq_id`:
`apply_block_table_updates`), its prompt and which sample of its request it is in its first step since admission.
A decode step of hundreds of sequences is built on the engine's hot path: per sequence it carries its id, its new
tokens, its start and whether it samples, nothing more.

`STEP_CONTRACT_VERSION` changes whenever a field changes meaning or is removed (adding a field with a default is
compatible): an executor in another process checks it against its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hetero_infer.contracts.sampling_params import SamplingParams

STEP_CONTRACT_VERSION = 3  # 2: block_table_updates (was block_tables), no request_ids/is_prefill columns;
# 3: SamplingRow is data (seed, token_bitmask; was a live generator and grammar matcher)

# A token sampled by a step still running on the device: the step that computes its K/V takes the real token from
# the device's output (the executor keeps the previous step's sampled tokens, by `seq_id`).
PLACEHOLDER = -1


@dataclass(slots=True)
class PromptLogprobsRows:
    """Prompt positions of a sequence (of request `request_id`) whose logits this step turns into prompt logprobs:
    from prompt position `position` (one of the step's positions), `len(targets)` of them; position p's logits give
    the logprob of `targets[p - position]` (the prompt's token p + 1), with the `k` most likely tokens."""

    request_id: str
    position: int
    targets: list[int]
    k: int


@dataclass(slots=True)
class StepPlan:
    """One step, one entry per sequence in each list (decodes first, then prefill chunks; the step's logits rows
    are those of its sequences that sample, in this order): sequence i computes K/V for `token_ids[i]` at
    positions `starts[i]`, `starts[i] + 1`, ... into the KV slots of its block table (block ids of the paged pool,
    in order: the executor's copy, brought up to date by `block_table_updates`), and samples a token after the last
    one where `samples[i]` (False only for a prefill chunk that ends before its prompt does). Columns rather than
    an object per sequence: a decode step has hundreds of sequences, and this is built on the engine's hot path.

    Sparse, by sequence id: the block tables that changed since the previous step (`block_table_updates`: seq_id
    -> (index, block ids): the table from `index` on is `block_ids`; index 0 for a sequence's first step after each
    admission), the whole prompt of a sequence in its first step after each admission (`new_prompts`: for an
    executor that keeps per-sequence state, such as the mock's scripted logits), which sample of its request a
    sequence is (`sample_indexes`, from its first step after each admission, only for later samples: absent is 0),
    the prompt logprobs a step owes, and the LoRA adapter a sequence runs with (absent: the base model); all that
    an executor keeps is dropped at `finished_seq_ids`. Then the copies to make before the step's forward: blocks
    written out to the host tier first (`blocks_to_offload`: (device block, host slot)), then blocks brought back
    from it (`blocks_to_load`: (host slot, device block)), then copy-on-write copies of shared blocks
    (`block_copies`: (source, destination)); and the sequences that ended since the previous step."""

    seq_ids: list[int] = field(default_factory=list)  # the executor's key for a sequence (n > 1: n sequences)
    token_ids: list[list[int]] = field(default_factory=list)  # the last may be PLACEHOLDER (a sequence's newest)
    starts: list[int] = field(default_factory=list)  # tokens of the sequence whose K/V are already in the cache
    samples: list[bool] = field(default_factory=list)
    block_table_updates: dict[int, tuple[int, list[int]]] = field(default_factory=dict)
    new_prompts: dict[int, list[int]] = field(default_factory=dict)
    sample_indexes: dict[int, int] = field(default_factory=dict)
    prompt_logprobs: dict[int, PromptLogprobsRows] = field(default_factory=dict)
    adapter_ids: dict[int, str] = field(default_factory=dict)
    block_copies: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_load: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_offload: list[tuple[int, int]] = field(default_factory=list)
    finished_seq_ids: list[int] = field(default_factory=list)
    version: int = STEP_CONTRACT_VERSION

    @property
    def num_seqs(self) -> int:
        return len(self.seq_ids)

    @property
    def num_tokens(self) -> int:
        return sum(map(len, self.token_ids))

    @property
    def is_prefill(self) -> list[bool]:
        """Whether more than its newest token lacked K/V before the step, per sequence: more than one new token,
        or a one-token chunk that does not reach the end of its prompt."""
        return [len(ids) > 1 or not samples for ids, samples in zip(self.token_ids, self.samples)]

    @property
    def sampled_seq_ids(self) -> list[int]:
        """The sequences that sample, in the order of the step's logits rows."""
        return [seq_id for seq_id, samples in zip(self.seq_ids, self.samples) if samples]


def apply_block_table_updates(tables: dict[int, list[int]], plan: StepPlan) -> None:
    """Bring an executor's block tables (seq_id -> block ids) up to date with a step: the finished sequences'
    dropped, then each update applied (the table cut at its index and extended with its block ids)."""
    for seq_id in plan.finished_seq_ids:
        tables.pop(seq_id, None)
    for seq_id, (index, block_ids) in plan.block_table_updates.items():
        table = tables.get(seq_id)
        if table is None or index == 0:
            tables[seq_id] = list(block_ids)
        else:
            del table[index:]
            table += block_ids


def sample_seed(seed: int, sample_index: int = 0) -> int:
    """The 64-bit seed of sample `sample_index` of a request seeded with `seed` (what `SamplingRow.seed` carries).

    Index 0 uses the seed as is; other indices get a splitmix64 mix of (seed, index) so samples of one request
    differ, stay reproducible and do not collide with seed + 1."""
    value = seed & _MASK64
    if sample_index:
        z = (value + 0x9E3779B97F4A7C15 * (sample_index + 1)) & _MASK64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        value = z ^ (z >> 31)
    return value


_MASK64 = (1 << 64) - 1


@dataclass
class SamplingRow:
    """The sampling metadata of one row that samples (one per sequence with `samples`, in the order of
    `StepPlan.sampled_seq_ids`; the engine passes None for a step whose every row takes its argmax).

    Plain data, so a row crosses a process boundary as it is. A seeded request's row carries its sample's `seed`
    (`sample_seed`; None: the global generator); the generator it draws from is the executor's own (`generator`,
    which the engine never sets): made from the seed at the sequence's first sampled step and kept by seq_id until
    the sequence finishes (`SeededGenerators`, in the runner), so that its draws continue from step to step
    wherever the executor runs. A structured-output row carries the tokens its grammar allows next
    (`token_bitmask`: xgrammar's packed layout, an int32 tensor of ceil(vocab / 32), bit set: allowed), filled by
    the engine from the matcher it advances (worker/structured/mask.py); None: unconstrained."""

    params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int]  # the newest may be PLACEHOLDER: penalties count it on the device
    generator: Any = None  # the executor's, from `seed` (a torch.Generator); None in the contract
    # masked while len(output_token_ids) < params.min_tokens (unless ignore_eos)
    eos_token_ids: list[int] = field(default_factory=list)
    token_bitmask: Any = None
    seed: int | None = None
