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

import torch

from hetero_infer.worker.config import EngineConfig
from hetero_infer.worker.core.scheduler import SchedulerOutput

MOCK_DEFAULT_NUM_BLOCKS = 4096
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
    def __init__(self, config: EngineConfig, vocab_size: int) -> None:
        self.step_latency_s = config.mock_step_latency_s
        self.token_latency_s = config.mock_token_latency_s
        self.seq_latency_s = config.mock_seq_latency_s
        self.vocab_size = config.mock_vocab_size or vocab_size
        self.num_blocks = config.max_num_blocks or MOCK_DEFAULT_NUM_BLOCKS
        self.device = "cpu"
        self.samples_itself = not config.mock_logits

    def next_token(self, token_ids: list[int], sample_index: int) -> int:
        span = max(self.vocab_size - _FIRST_ORDINARY_TOKEN, 1)
        h = (token_ids[-1] * 1103515245 + len(token_ids) * 12345 + sample_index * 2654435761) % span
        return _FIRST_ORDINARY_TOKEN + h

    def step_seconds(self, sched: SchedulerOutput) -> float:
        """The cost model: a fixed step time, plus time per token computed and per sequence run."""
        tokens = sum(s.num_new_tokens for s in sched.scheduled)
        return self.step_latency_s + self.token_latency_s * tokens + self.seq_latency_s * len(sched.scheduled)

    def execute(self, sched: SchedulerOutput) -> torch.Tensor | None:
        """Stand in for the forward pass: with `mock_logits`, a logits row per sequence that samples in this
        step; otherwise nothing (the engine then asks `next_token` for each sampled row)."""
        seconds = self.step_seconds(sched)
        if seconds:
            time.sleep(seconds)
        if self.samples_itself:
            return None
        rows = [mock_logits(s.seq.token_ids[: s.seq.num_prompt_tokens], s.seq.token_ids, self.vocab_size)
                for s in sched.scheduled if s.samples]
        return torch.stack(rows) if rows else torch.empty(0, self.vocab_size)
