"""The Triton backend: every op through `hetero_infer.kernels` (CUDA; anywhere in Triton's interpreter)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from hetero_infer import kernels
from hetero_infer.worker.runner.attention.base import KVCache, QKNorm, StepBatch
from hetero_infer.worker.runner.models.rotary import RotaryEmbedding
from hetero_infer.worker.runner.staging import DirectPack


@dataclass(frozen=True)
class TritonAttentionMetadata:
    slot_mapping: torch.Tensor  # [T] int64; -1: padding row, not written
    positions: torch.Tensor  # [T] int64
    num_decode_tokens: int
    decode_block_tables: torch.Tensor | None = None  # [Bd, max_blocks] int32
    decode_context_lens: torch.Tensor | None = None  # [Bd] int32; 0: padding row
    prefill_block_tables: torch.Tensor | None = None  # [Bp, max_blocks] int32
    prefill_cu_seqlens_q: torch.Tensor | None = None  # [Bp + 1] int32
    prefill_context_lens: torch.Tensor | None = None  # [Bp] int32


class TritonBackend:
    name = "triton"

    def __init__(self, rope: RotaryEmbedding, device: torch.device) -> None:
        self.rope, self.device = rope, torch.device(device)
        # The decode's split partials, one buffer per attention shape for every step and layer (and the CUDA graphs,
        # which capture it: it is made by the first decode, the profiling step or a bucket's warm-up before its
        # capture, and never replaced). Sized for every batch: only batches too small to fill the GPU split.
        self._decode_workspaces: dict[tuple, torch.Tensor] = {}

    def stage(self, batch: StepBatch, pack) -> TritonAttentionMetadata:
        decodes = [s for s in batch.spans if not s.is_prefill]
        prefills = batch.spans[len(decodes):]
        tensors = {}
        if decodes:
            tensors["decode_block_tables"] = pack.table([s.block_table for s in decodes])
            tensors["decode_context_lens"] = pack.put([s.end for s in decodes], np.int32)
        if prefills:
            tensors["prefill_block_tables"] = pack.table([s.block_table for s in prefills])
            tensors["prefill_cu_seqlens_q"] = pack.put(np.cumsum([0] + [s.num_tokens for s in prefills]), np.int32)
            tensors["prefill_context_lens"] = pack.put([s.end for s in prefills], np.int32)
        return TritonAttentionMetadata(pack.put(batch.slot_mapping), pack.put(batch.positions), len(decodes),
                                       **tensors)

    def metadata(self, staged: TritonAttentionMetadata) -> TritonAttentionMetadata:
        return staged  # the kernels read the staged views as they are

    def prepare(self, batch: StepBatch) -> TritonAttentionMetadata:
        return self.stage(batch, DirectPack(self.device))

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: KVCache,
                  meta: TritonAttentionMetadata, scale: float, qk_norm: QKNorm | None = None) -> torch.Tensor:
        k_cache, v_cache = kv_cache
        q_weight, k_weight, eps = qk_norm or (None, None, 0.0)
        # the q/k norms, rotary and the KV write in one kernel (four unfused)
        q = kernels.rotary_and_write_kv(meta.positions, q, k, v, self.rope.cos_sin_cache, k_cache, v_cache,
                                        meta.slot_mapping, q_norm_weight=q_weight, k_norm_weight=k_weight, eps=eps)
        out = torch.empty_like(q)
        nd = meta.num_decode_tokens
        if nd:
            kernels.paged_attention_decode(q[:nd], k_cache, v_cache, meta.decode_block_tables,
                                           meta.decode_context_lens, scale, out=out[:nd],
                                           workspace=self.decode_workspace(q, k_cache))
        if nd < q.shape[0]:
            kernels.paged_attention_prefill(q[nd:], k_cache, v_cache, meta.prefill_block_tables,
                                            meta.prefill_cu_seqlens_q, meta.prefill_context_lens, scale,
                                            out=out[nd:])
        return out

    def decode_workspace(self, q: torch.Tensor, k_cache: torch.Tensor) -> torch.Tensor:
        """The decode workspace of this attention shape (q [B, H, D], the cache's block size and KV heads)."""
        key = (q.shape[1], k_cache.shape[2], q.shape[2], k_cache.shape[1], q.dtype, q.device)
        ws = self._decode_workspaces.get(key)
        if ws is None:
            ws = self._decode_workspaces[key] = kernels.decode_workspace(*key)
        return ws

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
        return kernels.rms_norm(x, weight, eps, residual)

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return kernels.silu_and_mul(gate_up)
