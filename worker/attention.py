"""Paged attention over a flattened batch: per-step metadata and the PyTorch reference path.

Batch layout: decode tokens first (one per sequence), then prefill chunks. The K/V of every
token in the step are written into the paged cache through `slot_mapping` before attention,
so attention always reads K/V from the cache (except a prefill with no cached prefix, which
reads its own fresh K/V directly).
On CUDA the Triton kernels of `hetero_infer.kernels` run instead of the reference code.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class PrefillChunk:
    q_start: int  # row of the chunk's first query in the flattened batch
    q_len: int
    context_len: int  # tokens in the cache after this step (cached prefix + chunk)
    gather_index: torch.Tensor | None  # [context_len] cache slots; None when the chunk is the whole context


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] int64
    num_decode_tokens: int
    decode_block_tables: torch.Tensor | None = None  # [Bd, max_blocks] int32
    decode_context_lens: torch.Tensor | None = None  # [Bd] int32
    decode_gather_index: torch.Tensor | None = None  # [Bd, Lmax] int64 (reference path)
    decode_mask: torch.Tensor | None = None  # [Bd, 1, 1, Lmax] bool (reference path)
    row_block_tables: torch.Tensor | None = None  # [T, max_blocks] int32: every row through the C kernel (CPU)
    row_context_lens: torch.Tensor | None = None  # [T] int32: each row's causal context length
    prefill_chunks: tuple[PrefillChunk, ...] = ()
    prefill_block_tables: torch.Tensor | None = None  # [Bp, max_blocks] int32 (kernel path)
    prefill_cu_seqlens_q: torch.Tensor | None = None  # [Bp + 1] int32 (kernel path)
    prefill_context_lens: torch.Tensor | None = None  # [Bp] int32 (kernel path)
    use_kernels: bool = False


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor) -> None:
    kvh, d = k.shape[-2:]
    k_cache.view(-1, kvh, d).index_copy_(0, slots, k)
    v_cache.view(-1, kvh, d).index_copy_(0, slots, v)


def paged_attention(
    q: torch.Tensor,  # [T, H, D]
    k: torch.Tensor,  # [T, KVH, D] (this step's keys, already rotated)
    v: torch.Tensor,
    k_cache: torch.Tensor,  # [num_blocks, block_size, KVH, D]
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    if meta.use_kernels:
        from hetero_infer import kernels

        kernels.write_kv_cache(k, v, k_cache, v_cache, meta.slot_mapping)
        out = torch.empty_like(q)
        nd = meta.num_decode_tokens
        if nd:
            kernels.paged_attention_decode(
                q[:nd], k_cache, v_cache, meta.decode_block_tables, meta.decode_context_lens, scale, out=out[:nd]
            )
        if nd < q.shape[0]:
            kernels.paged_attention_prefill(
                q[nd:], k_cache, v_cache, meta.prefill_block_tables, meta.prefill_cu_seqlens_q,
                meta.prefill_context_lens, scale, out=out[nd:],
            )
        return out
    write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
    return reference_paged_attention(q, k, v, k_cache, v_cache, meta, scale)


def reference_paged_attention(q, k, v, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    kvh, d = k_cache.shape[-2:]
    flat_k = k_cache.view(-1, kvh, d)
    flat_v = v_cache.view(-1, kvh, d)
    nd = meta.num_decode_tokens
    if meta.row_block_tables is not None:
        from hetero_infer.worker import cpu_paged_attention

        return cpu_paged_attention.paged_decode(q, k_cache, v_cache, meta.row_block_tables, meta.row_context_lens,
                                                scale)
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
