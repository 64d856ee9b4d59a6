"""The `mock` executor: no model, deterministic tokens, configurable step latency.

KV accounting is the real scheduler and block manager, so queue depth, KV usage and
preemption behave like a real worker's; used by e2e, load and autoscaling tests.

By default it picks every token itself (`next_token`), ignoring sampling parameters. With
`mock_logits` it returns logits from `mock_logits` instead, so the engine's real sampler
applies every sampling parameter: what the server's request-mapping tests need.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.worker.core.scheduler import SchedulerOutput
from hetero_infer.worker.core.sequence import PLACEHOLDER
from hetero_infer.worker.runner.host_kv import host_tier_blocks
from hetero_infer.worker.runner.prompt_logprobs import PromptLogprobsCopy, PromptRows, rows_of, step_entries
from hetero_infer.worker.runner.sampler import Sampler, SamplingRow, pending_tokens, sample_logits
from hetero_infer.worker.runner.step_handle import CarriesPromptLogprobs

MOCK_DEFAULT_NUM_BLOCKS = 4096
# KV bytes per token of the model the mock stands in for (the default model in bfloat16: 30 layers x K and V x 3
# KV heads x 64): what sizes its host tier
MOCK_KV_BYTES_PER_TOKEN = 30 * 2 * 3 * 64 * 2
_FIRST_ORDINARY_TOKEN = 100  # keep clear of special tokens at the start of the vocabulary

# The logits model (`mock_logits`): every token gets a fixed pseudo-random logit in [0, BASE_SPAN); the
# FAVOURITES get FAVOURITE_TOP, FAVOURITE_TOP - FAVOURITE_STEP, ... (so greedy decoding repeats FAVOURITES[0]
# and penalties walk down the list); and whenever the last token is the prompt's first token, the prompt's second
# token gets COPY_BONUS on top (so a prompt such as [x, EOS, x] can script the output, EOS included).
BASE_SPAN = 4.0
FAVOURITES = tuple(2000 + 50 * i for i in range(8))  # whole word pieces in the default tokenizer
FAVOURITE_TOP = 8.0
FAVOURITE_STEP = 0.3
COPY_BONUS = 10.0
_base_cache: dict[int, torch.Tensor] = {}


def _base_logits(vocab_size: int) -> torch.Tensor:
    base = _base_cache.get(vocab_size)
    if base is None:
        base = torch.rand(vocab_size, generator=torch.Generator().manual_seed(0)) * BASE_SPAN
        for i, t in enumerate(FAVOURITES):
            base[t % vocab_size] = FAVOURITE_TOP - FAVOURITE_STEP * i
        base = _base_cache[vocab_size] = base
    return base


def mock_logits(prompt_token_ids: Sequence[int], token_ids: Sequence[int], vocab_size: int) -> torch.Tensor:
    """The next-token logits (float32, [vocab_size]) after `token_ids`, which start with `prompt_token_ids`."""
    logits = _base_logits(vocab_size).clone()
    if len(prompt_token_ids) > 1 and token_ids[-1] == prompt_token_ids[0]:
        logits[prompt_token_ids[1] % vocab_size] += COPY_BONUS
    return logits


class MockExecutor:
    """The device is modelled as asynchronous: `execute_async` returns at once and the step's modelled latency
    runs on the device's own timeline (one step after the other), so the host prepares the next step while it
    elapses; `result()` waits for the step's end. Like a GPU, it keeps the previous step's sampled tokens:
    a PLACEHOLDER input (a token the host does not have yet) is read from them."""

    overlaps = True

    def __init__(self, config: EngineConfig, vocab_size: int) -> None:
        self.step_latency_s = config.mock_step_latency_s
        self.token_latency_s = config.mock_token_latency_s
        self.seq_latency_s = config.mock_seq_latency_s
        self.vocab_size = config.mock_vocab_size or vocab_size
        self.num_blocks = config.max_num_blocks or MOCK_DEFAULT_NUM_BLOCKS
        # the host tier is bookkeeping here (no KV is held): sized as a small model's blocks would be, each move
        # costing mock_block_copy_s of device time
        self.block_bytes = MOCK_KV_BYTES_PER_TOKEN * config.block_size
        self.num_host_blocks = host_tier_blocks(config.kv_offloading_size, self.block_bytes)
        self.block_copy_s = config.mock_block_copy_s
        self.device = "cpu"
        self.samples_itself = not config.mock_logits
        self.sampler = Sampler(all_logprobs=False)
        self._device_free_at = 0.0  # when the device finishes the steps handed to it so far
        self._last_tokens: dict[int, int] = {}  # seq_id -> the token the previous step sampled for it

    def step_prompt_logprobs(self, sched: SchedulerOutput) -> PromptLogprobsCopy | None:
        """The prompt logprobs a step owes, under `mock_logits` (position i's logits follow tokens 0..i)."""
        rows, prompts = [], {}
        for item in sched.scheduled:
            seq = item.seq
            if seq.prompt_logprobs_top is not None:
                r = rows_of(seq, seq.num_computed_tokens, item.num_new_tokens, 0)
                if r is not None:
                    rows.append(r)
                    prompts[r.request_id] = seq.token_ids[: seq.num_prompt_tokens]
        if not rows:
            return None
        vocab = self.vocab_size

        def logits_of(r: PromptRows, i: int, end: int) -> torch.Tensor:
            prompt = prompts[r.request_id]
            return torch.stack([mock_logits(prompt, prompt[: p + 1], vocab)
                                for p in range(r.position + i, r.position + end)])

        return step_entries(rows, logits_of)

    def next_token(self, token_ids: list[int], sample_index: int) -> int:
        return self._next_token(token_ids[-1], len(token_ids), sample_index)

    def _next_token(self, last: int, length: int, sample_index: int) -> int:
        span = max(self.vocab_size - _FIRST_ORDINARY_TOKEN, 1)
        h = (last * 1103515245 + length * 12345 + sample_index * 2654435761) % span
        return _FIRST_ORDINARY_TOKEN + h

    def _last_token(self, seq) -> int:
        token = seq.token_ids[-1]
        return self._last_tokens[seq.seq_id] if token == PLACEHOLDER else token

    def step_seconds(self, sched: SchedulerOutput) -> float:
        """The cost model: a fixed step time, plus time per token computed, per sequence run and per block moved
        to or from the host tier."""
        tokens = sum(s.num_new_tokens for s in sched.scheduled)
        moves = sched.block_moves
        moved = len(moves.saves) + len(moves.restores) if moves else 0
        return (self.step_latency_s + self.token_latency_s * tokens + self.seq_latency_s * len(sched.scheduled)
                + self.block_copy_s * moved)

    def execute(self, sched: SchedulerOutput) -> torch.Tensor | None:
        """Stand in for the forward pass: with `mock_logits`, a logits row per sequence that samples in this
        step; otherwise nothing (`execute_async` then picks each sampled row's token with `next_token`)."""
        if self.samples_itself:
            return None
        rows = [mock_logits(s.seq.token_ids[: s.seq.num_prompt_tokens], (self._last_token(s.seq),),
                            self.vocab_size) for s in sched.scheduled if s.samples]
        return torch.stack(rows) if rows else torch.empty(0, self.vocab_size)

    def execute_async(self, sched: SchedulerOutput, sampling: list[SamplingRow] | None) -> _MockStep:
        """Launch a step on the modelled device: its tokens are decided now (the device's work), its latency
        starts when the device is free."""
        logits = self.execute(sched)
        seqs = [s.seq for s in sched.scheduled if s.samples]
        sampled = None
        if logits is None:
            next_token, last_token = self._next_token, self._last_token
            tokens = [next_token(last_token(seq), len(seq.token_ids), seq.sample_index) for seq in seqs]
        else:
            pending = None
            if sampling is not None:  # tokens of the step in flight, which penalties count
                last = self._last_tokens
                pending = pending_tokens(sampling, [seq.seq_id for seq in seqs],
                                         torch.tensor(list(last.values()), dtype=torch.long),
                                         {seq_id: i for i, seq_id in enumerate(last)})
            tokens, sampled = sample_logits(self.sampler, logits, sampling, pending).on_host()
        self._last_tokens = {seq.seq_id: t for seq, t in zip(seqs, tokens)}
        seconds = self.step_seconds(sched)
        start = max(time.monotonic(), self._device_free_at) if seconds else 0.0
        self._device_free_at = start + seconds
        return _MockStep(self._device_free_at, tokens, sampled, self.step_prompt_logprobs(sched))


@dataclass(slots=True)
class _MockStep(CarriesPromptLogprobs):
    done_at: float  # time.monotonic() at which the modelled device finishes the step
    token_ids: list[int]
    sampled: list | None
    prompt: PromptLogprobsCopy | None = None

    def result(self) -> tuple[list[int], list | None]:
        wait = self.done_at - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        return self.token_ids, self.sampled
