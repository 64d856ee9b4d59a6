"""The PyTorch reference backend: runs on any device, the oracle the other backends are held to.

Decode rows gather their sequence's cached K/V into a padded batch and run one masked SDPA; each prefill
chunk runs its own causal SDPA, over its fresh K/V when nothing is cached before it, else over K/V gathered
from the cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from hetero_infer.worker.runner.attention.base import KVCache, QKNorm, StepBatch, normed_qk
from hetero_infer.worker.runner.models.rotary import RotaryEmbedding
from hetero_infer.worker.runner.staging import DirectPack


@dataclass(frozen=True)
class PrefillChunk:
    q_start: int  # row of the chunk's first query in the flattened batch
    q_len: int
    context_len: int  # tokens in the cache after this step (cached prefix + chunk)
    gather_index: torch.Tensor | None  # [context_len] cache slots; None when the chunk is the whole context


@dataclass(frozen=True)
class TorchAttentionMetadata:
    slot_mapping: torch.Tensor  # [T] int64
    cos: torch.Tensor  # [T, 1, D]: rotary rows at each row's position
    sin: torch.Tensor
    num_decode_tokens: int
    decode_gather_index: torch.Tensor | None  # [Bd, Lmax] int64 cache slots of each decode's context
    decode_mask: torch.Tensor | None  # [Bd, 1, 1, Lmax] bool: slot within the context
    prefill_chunks: tuple[PrefillChunk, ...]


@dataclass(frozen=True)
class _Staged:
    """A step's staged inputs (`stage`); `metadata` derives the gather indices, mask and rotary rows from them."""

    slot_mapping: torch.Tensor
    positions: torch.Tensor
    block_size: int
    decode_tables: torch.Tensor | None  # [Bd, max_blocks] int32
    decode_lens: torch.Tensor | None  # [Bd] int32
    decode_max_len: int
    prefill_chunks: tuple[PrefillChunk, ...]


class TorchBackend:
    name = "torch"

    def __init__(self, rope: RotaryEmbedding, device: torch.device) -> None:
        self.rope, self.device = rope, torch.device(device)

    def stage(self, batch: StepBatch, pack) -> _Staged:
        bs = batch.block_size
        decodes = [s for s in batch.spans if not s.is_prefill]
        table = lens = None
        if decodes:
            table = pack.table([s.block_table for s in decodes])
            lens = pack.put([s.end for s in decodes], np.int32)
        chunks, row = [], len(decodes)
        for s in batch.spans[len(decodes):]:
            gather = None
            if s.start > 0:  # a cached prefix: attend over the whole context in the cache
                table_p = np.asarray(s.block_table, dtype=np.int64)
                allp = np.arange(s.end, dtype=np.int64)
                gather = pack.put(table_p[allp // bs] * bs + allp % bs)
            chunks.append(PrefillChunk(row, s.num_tokens, s.end, gather))
            row += s.num_tokens
        lmax = max((s.end for s in decodes), default=0)
        return _Staged(pack.put(batch.slot_mapping), pack.put(batch.positions), bs, table, lens, lmax, tuple(chunks))

    def metadata(self, staged: _Staged) -> TorchAttentionMetadata:
        dev, bs, lmax = self.device, staged.block_size, staged.decode_max_len
        gather_index = mask = None
        if staged.decode_tables is not None:
            gather_index = (staged.decode_tables.long()[:, :, None] * bs
                            + torch.arange(bs, device=dev)).flatten(1)[:, :lmax]
            mask = (torch.arange(lmax, device=dev)[None, :] < staged.decode_lens[:, None])[:, None, None, :]
        cos, sin = self.rope.at(staged.positions)
        num_decodes = 0 if staged.decode_tables is None else staged.decode_tables.shape[0]
        return TorchAttentionMetadata(staged.slot_mapping, cos, sin, num_decodes, gather_index, mask,
                                      staged.prefill_chunks)

    def prepare(self, batch: StepBatch) -> TorchAttentionMetadata:
        return self.metadata(self.stage(batch, DirectPack(self.device)))

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: KVCache,
                  meta: TorchAttentionMetadata, scale: float, qk_norm: QKNorm | None = None) -> torch.Tensor:
        q, k = normed_qk(self, q, k, qk_norm)
        q = self.rope.apply(q, meta.cos, meta.sin)
        k = self.rope.apply(k, meta.cos, meta.sin)
        v = v.contiguous()
        write_kv(k, v, *kv_cache, meta.slot_mapping)
        return paged_attention(q, k, v, *kv_cache, meta, scale)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
        return rms_norm(x, weight, eps, residual)

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return silu_and_mul(gate_up)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """RMSNorm as transformers computes it (normalized in float32, rounded, then scaled); with `residual`,
    (RMSNorm(residual + x), residual + x), the sum in x's dtype."""
    if residual is not None:
        residual = residual + x
        return rms_norm(residual, weight, eps), residual
    dtype = x.dtype
    x = x.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    n = gate_up.shape[-1] // 2
    return F.silu(gate_up[..., :n]) * gate_up[..., n:]


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slots: torch.Tensor) -> None:
    kvh, d = k.shape[-2:]
    k_cache.view(-1, kvh, d).index_copy_(0, slots, k)
    v_cache.view(-1, kvh, d).index_copy_(0, slots, v)


def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, meta: TorchAttentionMetadata, scale: float) -> torch.Tensor:
    """Attention of q [T, H, D] over the cache (this step's k, v [T, KVH, D] already written to it)."""
    kvh, d = k_cache.shape[-2:]
    flat_k = k_cache.view(-1, kvh, d)
    flat_v = v_cache.view(-1, kvh, d)
    nd = meta.num_decode_tokens
    out = torch.empty_like(q)
    if nd:
        idx = meta.decode_gather_index  # [Bd, L]
        keys = flat_k[idx].transpose(1, 2)  # [Bd, KVH, L, D]
        values = flat_v[idx].transpose(1, 2)
        out[:nd] = F.scaled_dot_product_attention(
            q[:nd].unsqueeze(2), keys, values, attn_mask=meta.decode_mask, scale=scale, enable_gqa=True
        ).squeeze(2)
    for chunk in meta.prefill_chunks:
        rows = slice(chunk.q_start, chunk.q_start + chunk.q_len)
        qc = q[rows].transpose(0, 1).unsqueeze(0)  # [1, H, q_len, D]
        if chunk.gather_index is None:
            kc, vc = k[rows], v[rows]
            mask, causal = None, True
        else:
            kc, vc = flat_k[chunk.gather_index], flat_v[chunk.gather_index]
            offset = chunk.context_len - chunk.q_len
            qpos = torch.arange(chunk.q_len, device=q.device).unsqueeze(1) + offset
            mask = torch.arange(chunk.context_len, device=q.device).unsqueeze(0) <= qpos
            causal = False
        out[rows] = F.scaled_dot_product_attention(
            qc, kc.transpose(0, 1).unsqueeze(0), vc.transpose(0, 1).unsqueeze(0),
            attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=True,
        ).squeeze(0).transpose(0, 1)
    return out
