"""Paged attention (decode and prefill) and the KV-cache write, with validation and dispatch.

KV cache layout, per layer: ``k_cache`` and ``v_cache`` of shape
``[num_blocks, block_size, num_kv_heads, head_dim]``. Token ``j`` of a sequence is stored
in block ``block_tables[b, j // block_size]`` at offset ``j % block_size``; its *slot* is
``block * block_size + offset``. Tokens of a batch are flattened (variable length).
"""

from __future__ import annotations

import torch

from . import reference
from ._backend import (
    FLOAT_DTYPES,
    check_out,
    check_same_device,
    check_tensor,
    use_backend,
    use_triton,
)

__all__ = [
    "write_kv_cache", "rotary_and_write_kv", "paged_attention_decode", "decode_workspace", "paged_attention_prefill",
    "MAX_HEAD_DIM",
]

INDEX_DTYPES = (torch.int32, torch.int64)
#: Largest head dimension the Triton attention kernels take (the reference takes any).
MAX_HEAD_DIM = 256


def _check_caches(k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    check_tensor("k_cache", k_cache, ndim=4, dtypes=FLOAT_DTYPES, last_contiguous=True)
    check_tensor("v_cache", v_cache, ndim=4, dtypes=FLOAT_DTYPES, last_contiguous=True)
    if k_cache.shape != v_cache.shape or k_cache.dtype != v_cache.dtype:
        raise ValueError(
            f"k_cache and v_cache must match in shape and dtype; got {tuple(k_cache.shape)} {k_cache.dtype} "
            f"and {tuple(v_cache.shape)} {v_cache.dtype}"
        )


def _check_heads(q_heads: int, head_dim: int, k_cache: torch.Tensor, what: str = "q") -> None:
    kvh, d = k_cache.shape[2], k_cache.shape[3]
    if head_dim != d:
        raise ValueError(f"{what} head_dim {head_dim} != cache head_dim {d}")
    if kvh == 0 or q_heads % kvh:
        raise ValueError(f"number of query heads ({q_heads}) must be a multiple of the KV heads ({kvh})")


def _check_triton_head_dim(d: int) -> None:
    if d > MAX_HEAD_DIM:
        raise ValueError(f"head_dim {d} > {MAX_HEAD_DIM} is not supported by the Triton attention kernels")


def write_kv_cache(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write new keys/values into the paged cache (in place).

    Args:
        k, v: ``[T, num_kv_heads, head_dim]``, the cache's dtype (views with a contiguous
            last dimension are fine, e.g. slices of a fused QKV output).
        k_cache, v_cache: ``[num_blocks, block_size, num_kv_heads, head_dim]``.
        slot_mapping: int32/int64 ``[T]``; token ``t`` goes to slot
            ``block * block_size + offset``; a negative slot skips the token (padding).
    """
    check_tensor("k", k, ndim=3, dtypes=FLOAT_DTYPES, last_contiguous=True)
    check_tensor("v", v, ndim=3, dtypes=FLOAT_DTYPES, last_contiguous=True)
    _check_caches(k_cache, v_cache)
    check_tensor("slot_mapping", slot_mapping, ndim=1, dtypes=INDEX_DTYPES)
    check_same_device(k=k, v=v, k_cache=k_cache, v_cache=v_cache, slot_mapping=slot_mapping)
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape; got {tuple(k.shape)} and {tuple(v.shape)}")
    if k.dtype != k_cache.dtype or v.dtype != v_cache.dtype:
        raise TypeError(f"k/v dtype ({k.dtype}) must equal the cache dtype ({k_cache.dtype})")
    if tuple(k.shape[1:]) != tuple(k_cache.shape[2:]):
        raise ValueError(
            f"k is [T, {k.shape[1]}, {k.shape[2]}] but the cache holds [.., .., {k_cache.shape[2]}, {k_cache.shape[3]}]"
        )
    if slot_mapping.shape[0] != k.shape[0]:
        raise ValueError(f"slot_mapping has {slot_mapping.shape[0]} entries for {k.shape[0]} tokens")
    if use_triton(k, k_cache, slot_mapping):
        from . import _triton_attention

        _triton_attention.write_kv_cache(k, v, k_cache, v_cache, slot_mapping)
    else:
        reference.write_kv_cache(k, v, k_cache, v_cache, slot_mapping)


def paged_attention_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    *,
    sliding_window: int | None = None,
    max_context_len: int | None = None,
    workspace: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode attention: one query token per sequence over its paged KV.

    Args:
        q: ``[B, H, head_dim]`` (H a multiple of the cache's KV heads: MHA, GQA, MQA).
        k_cache, v_cache: ``[num_blocks, block_size, KVH, head_dim]``, q's dtype.
        block_tables: int32/int64 ``[B, max_blocks]``; entries past a sequence's last
            block are never read.
        context_lens: int32/int64 ``[B]``: cached tokens of each sequence, including the
            current one (already written). 0 marks a padding row; its output is zeros.
        scale: softmax scale, usually ``head_dim ** -0.5``.
        out: optional ``[B, H, head_dim]`` output (q's dtype).
        sliding_window: if set, a query at position p sees keys at positions
            ``> p - sliding_window`` only (Mistral-style).
        max_context_len: optional host-side bound on ``context_lens``; it only caps how
            many ways a context may be split (without it: ``max_blocks * block_size``).
            Any value is correct: each sequence partitions its own context on the device.
            Under CUDA graphs leave it out (or pass a fixed bound) so the captured launch
            fits every replay.
        workspace: optional float32 buffer for the split partials, from
            :func:`decode_workspace` (allocated once and reused, e.g. by an engine and its
            CUDA graphs); without it the Triton path allocates one per call when it splits.
            The reference path ignores it.

    Returns ``out``. The Triton kernel runs one program per (sequence, KV head, KV
    split) serving all query heads of the group. When batch x KV heads cannot fill the
    GPU, each sequence's context is cut into up to S partitions (flash-decoding; S from
    the batch, each sequence's partition from its own length, on the device), combined in
    a second small kernel.
    """
    check_tensor("q", q, ndim=3, dtypes=FLOAT_DTYPES, last_contiguous=True)
    _check_caches(k_cache, v_cache)
    check_tensor("block_tables", block_tables, ndim=2, dtypes=INDEX_DTYPES)
    check_tensor("context_lens", context_lens, ndim=1, dtypes=INDEX_DTYPES)
    device = check_same_device(
        q=q, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables, context_lens=context_lens
    )
    b_sz, h, d = q.shape
    if q.dtype != k_cache.dtype:
        raise TypeError(f"q dtype ({q.dtype}) must equal the KV cache dtype ({k_cache.dtype})")
    _check_heads(h, d, k_cache)
    if block_tables.shape[0] != b_sz or context_lens.shape[0] != b_sz:
        raise ValueError(
            f"block_tables ({tuple(block_tables.shape)}) and context_lens ({tuple(context_lens.shape)}) "
            f"must have one row per sequence (B={b_sz})"
        )
    if block_tables.shape[1] > 0 and block_tables.stride(1) != 1:
        raise ValueError("block_tables must be contiguous along its last dimension")
    check_out(out, q.shape, q.dtype, device)
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if workspace is not None:
        check_tensor("workspace", workspace, ndim=1, dtypes=(torch.float32,))
        check_same_device(q=q, workspace=workspace)
        if not workspace.is_contiguous():
            raise ValueError("workspace must be contiguous")
    if sliding_window is not None and sliding_window <= 0:
        sliding_window = None
    if use_triton(q, k_cache, block_tables, context_lens):
        _check_triton_head_dim(d)
        from . import _triton_attention

        return _triton_attention.paged_attention_decode(
            q, k_cache, v_cache, block_tables, context_lens, scale, out, sliding_window, max_context_len,
            workspace=workspace,
        )
    return reference.paged_attention_decode(
        q, k_cache, v_cache, block_tables, context_lens, scale, out, sliding_window=sliding_window
    )


def decode_workspace(
    num_heads: int, num_kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype, device: torch.device | str
) -> torch.Tensor:
    """A float32 workspace for :func:`paged_attention_decode`'s split partials at every batch size.

    Allocate it once (per attention shape) and pass it to every call: the decode then
    allocates nothing. Small: the decode splits only batches too small to fill the GPU
    (about 0.5 MiB for 16 query / 8 KV heads of 128 on an H100). Empty where the reference
    path runs (it needs none).
    """
    device = torch.device(device)
    probe = torch.empty(0, device=device)
    if num_heads <= 0 or num_kv_heads <= 0 or num_heads % num_kv_heads:
        raise ValueError(f"number of query heads ({num_heads}) must be a positive multiple of the KV heads "
                         f"({num_kv_heads})")
    if not use_triton(probe):
        return probe
    _check_triton_head_dim(head_dim)
    from . import _triton_attention

    numel = _triton_attention.decode_workspace_numel(num_heads, num_kv_heads, head_dim, block_size, dtype, device)
    return torch.empty(numel, dtype=torch.float32, device=device)


def paged_attention_prefill(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    *,
    sliding_window: int | None = None,
    max_seqlen_q: int | None = None,
) -> torch.Tensor:
    """Causal attention for a flattened variable-length batch of new tokens over paged KV.

    Covers plain prefill, chunked prefill and prefix-cache hits: sequence ``b`` owns query
    rows ``cu_seqlens_q[b]:cu_seqlens_q[b+1]`` (q_len_b of them); its KV length
    ``context_lens[b]`` includes those new tokens, already written to the cache. Query
    ``i`` of sequence ``b`` sits at position ``context_lens[b] - q_len_b + i`` and attends
    to every position ``<=`` its own (and, with ``sliding_window``, ``> pos - window``).
    Decode rows (q_len 1) may be mixed in.

    Args:
        q: ``[T, H, head_dim]``; k_cache/v_cache: ``[num_blocks, block_size, KVH, head_dim]``.
        block_tables: int ``[B, max_blocks]``; cu_seqlens_q: int ``[B+1]`` (starts at 0,
            non-decreasing, ends at T); context_lens: int ``[B]`` with
            ``context_lens[b] >= q_len_b``.
        out: optional ``[T, H, head_dim]`` output. ``max_seqlen_q`` is accepted for API
            compatibility and unused (the kernel's grid needs no host-side maximum).
    Returns ``out``.
    """
    check_tensor("q", q, ndim=3, dtypes=FLOAT_DTYPES, last_contiguous=True)
    _check_caches(k_cache, v_cache)
    check_tensor("block_tables", block_tables, ndim=2, dtypes=INDEX_DTYPES)
    check_tensor("cu_seqlens_q", cu_seqlens_q, ndim=1, dtypes=INDEX_DTYPES)
    check_tensor("context_lens", context_lens, ndim=1, dtypes=INDEX_DTYPES)
    device = check_same_device(
        q=q,
        k_cache=k_cache,
        v_cache=v_cache,
        block_tables=block_tables,
        cu_seqlens_q=cu_seqlens_q,
        context_lens=context_lens,
    )
    t, h, d = q.shape
    if q.dtype != k_cache.dtype:
        raise TypeError(f"q dtype ({q.dtype}) must equal the KV cache dtype ({k_cache.dtype})")
    _check_heads(h, d, k_cache)
    b_sz = context_lens.shape[0]
    if cu_seqlens_q.shape[0] != b_sz + 1:
        raise ValueError(f"cu_seqlens_q must have B+1={b_sz + 1} entries, got {cu_seqlens_q.shape[0]}")
    if block_tables.shape[0] != b_sz:
        raise ValueError(f"block_tables has {block_tables.shape[0]} rows for {b_sz} sequences")
    if block_tables.shape[1] > 0 and block_tables.stride(1) != 1:
        raise ValueError("block_tables must be contiguous along its last dimension")
    check_out(out, q.shape, q.dtype, device)
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if sliding_window is not None and sliding_window <= 0:
        sliding_window = None
    if use_triton(q, k_cache, block_tables, context_lens, cu_seqlens_q):
        _check_triton_head_dim(d)
        from . import _triton_attention

        return _triton_attention.paged_attention_prefill(
            q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale, out, sliding_window
        )
    return reference.paged_attention_prefill(
        q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale, out, sliding_window=sliding_window
    )


def rotary_and_write_kv(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    q_norm_weight: torch.Tensor | None = None,
    k_norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    q_out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One layer's new tokens made ready for attention, in one kernel: optionally RMS-normalise each q and k
    head (Qwen3's q_norm / k_norm: ``q_norm_weight`` and ``k_norm_weight`` ``[head_dim]``, together), rotate q
    and k (:func:`rotary_embedding`), and write the rotated k and v to their cache slots
    (:func:`write_kv_cache`). Returns the rotated q (``q_out`` if given, else a new ``[T, H, D]`` tensor).

    Equal to :func:`rms_norm` per head, then :func:`rotary_embedding`, then :func:`write_kv_cache`, with the
    same rounding points (the norm's sum of squares may be added in another order).
    """
    from .ops import rms_norm, rotary_embedding

    check_tensor("positions", positions, ndim=1, dtypes=INDEX_DTYPES)
    for name, x in (("q", q), ("k", k), ("v", v)):
        check_tensor(name, x, ndim=3, dtypes=FLOAT_DTYPES, last_contiguous=True)
    _check_caches(k_cache, v_cache)
    check_tensor("cos_sin_cache", cos_sin_cache, ndim=2, dtypes=FLOAT_DTYPES, last_contiguous=True)
    check_tensor("slot_mapping", slot_mapping, ndim=1, dtypes=INDEX_DTYPES)
    device = check_same_device(positions=positions, q=q, k=k, v=v, cos_sin_cache=cos_sin_cache, k_cache=k_cache,
                               v_cache=v_cache, slot_mapping=slot_mapping, q_norm_weight=q_norm_weight,
                               k_norm_weight=k_norm_weight)
    t, h, d = q.shape
    if k.shape != v.shape or k.shape[0] != t or k.shape[2] != d:
        raise ValueError(f"k and v must be [T, KVH, D] with q's T and D; got q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}")
    if k.dtype != q.dtype or v.dtype != q.dtype or k_cache.dtype != q.dtype:
        raise TypeError(f"q, k, v and the cache must share one dtype; got {q.dtype}, {k.dtype}, {v.dtype}, "
                        f"{k_cache.dtype}")
    _check_heads(h, d, k_cache)
    if k.shape[1] != k_cache.shape[2]:
        raise ValueError(f"k has {k.shape[1]} heads but the cache {k_cache.shape[2]}")
    if positions.shape[0] != t or slot_mapping.shape[0] != t:
        raise ValueError(f"positions ({positions.shape[0]}) and slot_mapping ({slot_mapping.shape[0]}) need one "
                         f"entry per token ({t})")
    rot = cos_sin_cache.shape[1]
    if rot % 2 or rot == 0 or rot > d:
        raise ValueError(f"cos_sin_cache width {rot} must be even and <= head_dim {d}")
    if (q_norm_weight is None) != (k_norm_weight is None):
        raise ValueError("q_norm_weight and k_norm_weight go together")
    for name, w in (("q_norm_weight", q_norm_weight), ("k_norm_weight", k_norm_weight)):
        if w is not None:
            check_tensor(name, w, ndim=1, dtypes=FLOAT_DTYPES)
            if w.shape[0] != d:
                raise ValueError(f"{name} has {w.shape[0]} elements for head_dim {d}")
    check_out(q_out, q.shape, q.dtype, device, name="q_out")
    if q_out is None:
        q_out = torch.empty(q.shape, dtype=q.dtype, device=device)
    if use_triton(q, k_cache, slot_mapping):
        _check_triton_head_dim(d)
        from . import _triton_fused

        _triton_fused.rotary_and_write_kv(positions, q, k, v, cos_sin_cache, k_cache, v_cache, slot_mapping, q_out,
                                          q_norm_weight, k_norm_weight, eps)
        return q_out
    with use_backend("reference"):  # the unfused references, whatever the backend in force
        if q_norm_weight is not None:
            q, k = rms_norm(q, q_norm_weight, eps), rms_norm(k, k_norm_weight, eps)
        q_rot, k_rot = rotary_embedding(positions, q, k, cos_sin_cache, q_out=q_out)
        write_kv_cache(k_rot, v, k_cache, v_cache, slot_mapping)
    return q_out
