"""The CPU backend: the project's C kernels (kernels/cpu/csrc/, built by `cpu_native`).

Rotary and the cache write are one pass (`cpu_ops.rope_and_cache`); then every row, prefill rows too,
attends over its causal prefix straight from the block pool (`cpu_paged_attention`): one call per layer,
no gather, cached prefixes included. Norms and the activation are the fused C ops of `cpu_ops`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from hetero_infer.kernels.cpu import ops as cpu_ops
from hetero_infer.kernels.cpu import paged_attention as cpu_paged_attention
from hetero_infer.worker.runner.attention import torch_backend
from hetero_infer.worker.runner.attention.base import KVCache, QKNorm, StepBatch, normed_qk, pad_tables
from hetero_infer.worker.runner.models.rotary import RotaryEmbedding


@dataclass(frozen=True)
class CpuAttentionMetadata:
    slot_mapping: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    block_tables: torch.Tensor  # [T, max_blocks] int32: each row's sequence's block table
    context_lens: torch.Tensor  # [T] int32: each row's causal context (its prefix and itself)


def available(dtype: torch.dtype) -> bool:
    """The C library built and `dtype` one the kernels take (float32, bfloat16; the KV cache has the model's)."""
    return cpu_ops.available(dtype) and cpu_paged_attention.available()


class CpuBackend:
    name = "cpu"

    def __init__(self, rope: RotaryEmbedding) -> None:
        self.rope = rope

    def prepare(self, batch: StepBatch) -> CpuAttentionMetadata:
        spans = batch.spans
        tables = pad_tables([s.block_table for s in spans])
        if len(spans) != len(batch.positions):  # prefill chunks: their sequence's table on each of their rows
            tables = np.repeat(tables, [s.num_tokens for s in spans], axis=0)
        return CpuAttentionMetadata(
            slot_mapping=torch.from_numpy(batch.slot_mapping),
            positions=torch.from_numpy(batch.positions),
            block_tables=torch.from_numpy(tables),
            context_lens=torch.from_numpy(np.add(batch.positions, 1, dtype=np.int32)),
        )

    def stage(self, batch: StepBatch, pack) -> CpuAttentionMetadata:
        return self.prepare(batch)  # host arrays, read in place by the C kernels: nothing to stage

    def metadata(self, staged: CpuAttentionMetadata) -> CpuAttentionMetadata:
        return staged

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: KVCache,
                  meta: CpuAttentionMetadata, scale: float, qk_norm: QKNorm | None = None) -> torch.Tensor:
        q, k = normed_qk(self, q, k, qk_norm)
        k_cache, v_cache = kv_cache
        cpu_ops.rope_and_cache(q, k, v, meta.positions, self.rope.cos, self.rope.sin, k_cache, v_cache,
                               meta.slot_mapping)  # q and k rotated in place
        return cpu_paged_attention.paged_decode(q, k_cache, v_cache, meta.block_tables, meta.context_lens, scale)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
        if x.dim() != 2 or not x.is_contiguous():  # the per-head q/k norms of Qwen3: [T, heads, D] views
            return torch_backend.rms_norm(x, weight, eps, residual)
        if residual is None:
            return cpu_ops.add_rms_norm(None, x, weight, eps)
        return cpu_ops.add_rms_norm(x, residual, weight, eps), residual  # residual updated in place

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return cpu_ops.silu_and_mul(gate_up)
