"""The `mock` executor: no model, deterministic tokens, configurable step latency.

KV accounting is the real scheduler and block manager, so queue depth, KV usage and
preemption behave like a real worker's; used by e2e, load and autoscaling tests.
"""

from __future__ import annotations

import time

from hetero_infer.worker.config import EngineConfig
from hetero_infer.worker.scheduler import SchedulerOutput

MOCK_DEFAULT_NUM_BLOCKS = 4096
_FIRST_ORDINARY_TOKEN = 100  # keep clear of special tokens at the start of the vocabulary


class MockExecutor:
    samples_itself = True

    def __init__(self, config: EngineConfig, vocab_size: int) -> None:
        self.step_latency_s = config.mock_step_latency_s
        self.vocab_size = config.mock_vocab_size or vocab_size
        self.num_blocks = config.max_num_blocks or MOCK_DEFAULT_NUM_BLOCKS
        self.device = "cpu"

    def next_token(self, token_ids: list[int], sample_index: int) -> int:
        span = max(self.vocab_size - _FIRST_ORDINARY_TOKEN, 1)
        h = (token_ids[-1] * 1103515245 + len(token_ids) * 12345 + sample_index * 2654435761) % span
        return _FIRST_ORDINARY_TOKEN + h

    def execute(self, sched: SchedulerOutput) -> None:
        """Stand in for the forward pass; the engine then asks `next_token` for each sampled row."""
        if self.step_latency_s:
            time.sleep(self.step_latency_s)
