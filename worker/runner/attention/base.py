"""The interface every attention backend implements, and the step description they prepare from.

A backend runs everything of a decoder layer that has more than one implementation: rotary embedding,
the KV-cache write and paged attention (`attention`), and the elementwise ops around them (`rms_norm`,
`silu_and_mul`). The executor picks one backend when it builds the model and asks it, once per step, for
the metadata of that step (`stage`, then `metadata` once the step's inputs are on their way to the device: see
staging.py); the model hands backend and metadata to its layers, which never ask which backend runs.

Batch layout: decode rows first (one per sequence), then prefill chunks, as the scheduler orders them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np
import torch

from hetero_infer.worker.runner.staging import pad_tables, to_device  # noqa: F401  (re-exported)

M = TypeVar("M")
KVCache = tuple[torch.Tensor, torch.Tensor]  # one layer's (k_cache, v_cache), each [num_blocks, block_size, KVH, D]
QKNorm = tuple[torch.Tensor, torch.Tensor, float]  # per-head RMSNorm of q and k before rotary (Qwen3): weights, eps


@dataclass(frozen=True)
class SeqSpan:
    """One sequence's rows in a step: tokens `start .. start + num_tokens - 1` of the sequence."""

    block_table: list[int]
    start: int  # tokens of the sequence already in the cache
    num_tokens: int
    is_prefill: bool  # False: a decode (one new token of a sequence past its prompt)

    @property
    def end(self) -> int:
        return self.start + self.num_tokens


@dataclass(frozen=True)
class StepBatch:
    """A step's rows, host side: what `AttentionBackend.prepare` turns into device metadata."""

    spans: list[SeqSpan]  # decodes first, then prefills
    positions: np.ndarray  # [T] int64: each row's position in its sequence
    slot_mapping: np.ndarray  # [T] int64: each row's KV-cache slot (block * block_size + offset)
    block_size: int

    @classmethod
    def fresh_prompts(cls, lens: list[int], block_size: int) -> StepBatch:
        """Whole prompts of `lens` tokens with nothing cached, each in its own consecutive blocks from block 0."""
        spans, positions, slots, block = [], [], [], 0
        for n in lens:
            nblocks = -(-n // block_size)
            spans.append(SeqSpan(list(range(block, block + nblocks)), 0, n, True))
            positions.append(np.arange(n, dtype=np.int64))
            slots.append(block * block_size + np.arange(n, dtype=np.int64))
            block += nblocks
        return cls(spans, np.concatenate(positions), np.concatenate(slots), block_size)

    @property
    def num_blocks(self) -> int:
        """Blocks a cache needs to hold this batch (one past the highest block any table names)."""
        return max((max(s.block_table, default=-1) for s in self.spans), default=-1) + 1


class AttentionBackend(Protocol[M]):
    """Rotary, KV-cache write and attention (and the layer ops that differ by backend) on one device."""

    name: str

    def stage(self, batch: StepBatch, pack) -> object:
        """The step's integer inputs put into `pack` (a `staging.Pack` or `DirectPack`: host writes only, no
        device work, since the pack's one copy has not been queued yet); what `metadata` takes."""
        ...

    def metadata(self, staged) -> M:
        """The step's metadata from `stage`'s result, once the pack's copy is queued (device work on its views
        is allowed here); every layer of the step reads it."""
        ...

    def prepare(self, batch: StepBatch) -> M:
        """`metadata(stage(batch, ...))` with each array copied on its own: for batches outside the engine's
        steps (calibration, tests)."""
        ...

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: KVCache, meta: M,
                  scale: float, qk_norm: QKNorm | None = None) -> torch.Tensor:
        """q [T, H, D], k/v [T, KVH, D] (unrotated, may be views into the fused qkv output): with `qk_norm`,
        RMS-normalise each q and k head first; rotate q and k by their rows' positions, write k and v to their
        cache slots, return attention output [T, H, D]."""
        ...

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float,
                 residual: torch.Tensor | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """RMSNorm(x); with `residual`, (RMSNorm(residual + x), residual + x), the sum in x's dtype."""
        ...

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up for gate_up = [gate | up] of shape [T, 2N]."""
        ...


def normed_qk(backend: AttentionBackend, q: torch.Tensor, k: torch.Tensor,
              qk_norm: QKNorm | None) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k after `qk_norm`'s per-head RMSNorms (as they are without one): for backends that do not fuse
    the norms into their rotary."""
    if qk_norm is None:
        return q, k
    q_weight, k_weight, eps = qk_norm
    return backend.rms_norm(q, q_weight, eps), backend.rms_norm(k, k_weight, eps)
