"""The `mock` executor: no model, deterministic tokens, configurable step latency.

KV accounting is the real scheduler and block manager, so queue depth, KV usage and
preemption behave like a real worker's; used by e2e, load and autoscaling tests.

By default it picks every token itself (`next_token`), ignoring sampling parameters. With
`mock_logits` it returns logits from `mock_logits` instead, so the engine's real sampler
applies every sampling parameter: what the server's request-mapping tests need.

LoRA adapters (`enable_lora`) are read and checked as the torch executor does (worker/runner/lora/adapter.py:
the same errors for the same bad folders) and held in as many device slots (`max_loras`); a sequence under an
adapter gets other tokens than under the base model (its token stream is salted by the adapter's name).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.contracts.lora import LoRAAdapterError, LoRARequest
from hetero_infer.contracts.step import PLACEHOLDER, SamplingRow, StepPlan
from hetero_infer.worker.runner.host_kv import host_tier_blocks
from hetero_infer.worker.runner.lora.adapter import ModelShapes, load_adapter
from hetero_infer.worker.runner.lora.slots import SlotTable
from hetero_infer.worker.runner.prompt_logprobs import PromptLogprobsCopy, PromptRows, step_entries
from hetero_infer.worker.runner.sampler import Sampler, SeededGenerators, pending_tokens, sample_logits
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


def adapter_salt(adapter: str | None) -> int:
    """What makes an adapter's tokens differ from the base model's: 0 for the base, a stable hash of its name."""
    if adapter is None:
        return 0
    return int.from_bytes(hashlib.blake2b(adapter.encode(), digest_size=4).digest(), "little") or 1


def mock_logits(prompt_token_ids: Sequence[int], token_ids: Sequence[int], vocab_size: int,
                adapter: str | None = None) -> torch.Tensor:
    """The next-token logits (float32, [vocab_size]) after `token_ids`, which start with `prompt_token_ids`
    (under LoRA adapter `adapter`: the base logits rotated by its salt)."""
    logits = _base_logits(vocab_size).clone()
    if adapter is not None:
        logits = logits.roll(adapter_salt(adapter) % vocab_size)
    if len(prompt_token_ids) > 1 and token_ids[-1] == prompt_token_ids[0]:
        logits[prompt_token_ids[1] % vocab_size] += COPY_BONUS
    return logits


class MockExecutor:
    """The device is modelled as asynchronous: `execute_async` returns at once and the step's modelled latency
    runs on the device's own timeline (one step after the other), so the host prepares the next step while it
    elapses; `result()` waits for the step's end. Like a GPU, it keeps the previous step's sampled tokens:
    a PLACEHOLDER input (a token the host does not have yet) is read from them."""

    overlaps = True

    def __init__(self, config: EngineConfig, vocab_size: int, shapes: ModelShapes | None = None) -> None:
        """shapes: the model's, which LoRA adapters are checked against (None: only their own consistency)."""
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
        self.generators = SeededGenerators(self.device)  # (used with mock_logits only: else it picks the tokens)
        self._device_free_at = 0.0  # when the device finishes the steps handed to it so far
        self._last_tokens: dict[int, int] = {}  # seq_id -> the token the previous step sampled for it
        self._prompts: dict[int, list[int]] = {}  # seq_id -> its prompt (`mock_logits`), from its first step
        self._sample_indexes: dict[int, int] = {}  # seq_id -> which sample of its request, where not the first
        self.max_lora_rank = config.max_lora_rank
        self._shapes = shapes or ModelShapes("the model", None, {})
        self.loras: dict[str, LoRARequest] = {}  # adapters read into host memory
        self.lora_slots = SlotTable(config.max_loras)
        self.lora_loads = 0  # adapters copied into a device slot (what a step's adapters cost)

    def add_lora(self, request: LoRARequest) -> None:
        """Read and check the adapter (LoRAAdapterError, nothing kept) into host memory."""
        load_adapter(request, self._shapes, self.max_lora_rank)
        self.loras[request.lora_name] = request

    def remove_lora(self, name: str) -> bool:
        self.lora_slots.drop(name)
        return self.loras.pop(name, None) is not None

    def _assign_slots(self, plan: StepPlan) -> None:
        if not plan.adapter_ids:
            return
        names = plan.adapter_ids.values()
        missing = [n for n in names if n not in self.loras]
        if missing:
            raise LoRAAdapterError(f"LoRA adapter {missing[0]!r} is not loaded")
        _, loads = self.lora_slots.assign(names)
        self.lora_loads += len(loads)

    def step_prompt_logprobs(self, plan: StepPlan) -> PromptLogprobsCopy | None:
        """The prompt logprobs a step owes, under `mock_logits` (position i's logits follow tokens 0..i: the
        prompt's first two tokens and token i, which the step computes)."""
        if not plan.prompt_logprobs:
            return None
        rows, by_request = [], {}
        for i, seq_id in enumerate(plan.seq_ids):
            owed = plan.prompt_logprobs.get(seq_id)
            if owed is not None:
                rows.append(PromptRows(owed.request_id, 0, owed.position, owed.targets, owed.k))
                by_request[owed.request_id] = i
        vocab = self.vocab_size

        def logits_of(r: PromptRows, i: int, end: int) -> torch.Tensor:
            k = by_request[r.request_id]
            prompt, start, ids = self._prompts[plan.seq_ids[k]], plan.starts[k], plan.token_ids[k]
            adapter = plan.adapter_ids.get(plan.seq_ids[k])
            return torch.stack([mock_logits(prompt, (ids[p - start],), vocab, adapter)
                                for p in range(r.position + i, r.position + end)])

        return step_entries(rows, logits_of)

    def next_token(self, token_ids: list[int], sample_index: int, adapter: str | None = None) -> int:
        return self._next_token(token_ids[-1], len(token_ids), sample_index, adapter_salt(adapter))

    def _next_token(self, last: int, length: int, sample_index: int, salt: int = 0) -> int:
        span = max(self.vocab_size - _FIRST_ORDINARY_TOKEN, 1)
        h = (last * 1103515245 + length * 12345 + sample_index * 2654435761 + salt * 40503) % span
        return _FIRST_ORDINARY_TOKEN + h

    def _last_tokens_of(self, plan: StepPlan) -> list[int]:
        """Each sampling sequence's newest token (one the previous step sampled, where it is a PLACEHOLDER)."""
        prev = self._last_tokens
        return [prev[seq_id] if ids[-1] == PLACEHOLDER else ids[-1]
                for seq_id, ids, samples in zip(plan.seq_ids, plan.token_ids, plan.samples) if samples]

    def step_seconds(self, plan: StepPlan) -> float:
        """The cost model: a fixed step time, plus time per token computed, per sequence run and per block moved
        to or from the host tier."""
        seconds = self.step_latency_s
        if self.token_latency_s:
            seconds += self.token_latency_s * plan.num_tokens
        if self.seq_latency_s:
            seconds += self.seq_latency_s * plan.num_seqs
        if plan.blocks_to_offload or plan.blocks_to_load:
            seconds += self.block_copy_s * (len(plan.blocks_to_offload) + len(plan.blocks_to_load))
        return seconds

    def execute(self, plan: StepPlan) -> torch.Tensor | None:
        """Stand in for the forward pass: with `mock_logits`, a logits row per sequence that samples in this
        step; otherwise nothing (`execute_async` then picks each sampled row's token with `next_token`)."""
        prompts, indexes = self._prompts, self._sample_indexes
        for seq_id in plan.finished_seq_ids:
            prompts.pop(seq_id, None)
            indexes.pop(seq_id, None)
        if plan.new_prompts:  # (most steps have none of these: the checks cost less than the calls)
            prompts.update(plan.new_prompts)
        if plan.sample_indexes:
            indexes.update(plan.sample_indexes)
        if plan.adapter_ids:
            self._assign_slots(plan)
        if self.samples_itself:
            return None
        adapters = plan.adapter_ids
        rows = [mock_logits(prompts[seq_id], (last,), self.vocab_size, adapters.get(seq_id))
                for seq_id, last in zip(plan.sampled_seq_ids, self._last_tokens_of(plan))]
        return torch.stack(rows) if rows else torch.empty(0, self.vocab_size)

    def execute_async(self, plan: StepPlan, sampling: list[SamplingRow] | None) -> _MockStep:
        """Launch a step on the modelled device: its tokens are decided now (the device's work), its latency
        starts when the device is free."""
        logits = self.execute(plan)
        sampled = None
        if logits is None:
            next_token, prev, tokens, new_last = self._next_token, self._last_tokens, [], {}
            adapters, indexes = plan.adapter_ids, self._sample_indexes
            for seq_id, ids, start, samples in zip(plan.seq_ids, plan.token_ids, plan.starts, plan.samples):
                if samples:
                    last = ids[-1]
                    salt = adapter_salt(adapters.get(seq_id)) if adapters else 0
                    token = new_last[seq_id] = next_token(prev[seq_id] if last == PLACEHOLDER else last,
                                                          start + len(ids),
                                                          indexes.get(seq_id, 0) if indexes else 0, salt)
                    tokens.append(token)
            self._last_tokens = new_last
        else:
            self.generators.attach(plan, sampling)
            seq_ids = plan.sampled_seq_ids
            pending = None
            if sampling is not None:  # tokens of the step in flight, which penalties count
                last = self._last_tokens
                pending = pending_tokens(sampling, seq_ids, torch.tensor(list(last.values()), dtype=torch.long),
                                         {seq_id: i for i, seq_id in enumerate(last)})
            tokens, sampled = sample_logits(self.sampler, logits, sampling, pending).on_host()
            self._last_tokens = dict(zip(seq_ids, tokens))
        seconds = self.step_seconds(plan)
        start = max(time.monotonic(), self._device_free_at) if seconds else 0.0
        self._device_free_at = start + seconds
        return _MockStep(self._device_free_at, tokens, sampled,
                         self.step_prompt_logprobs(plan) if plan.prompt_logprobs else None)


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
