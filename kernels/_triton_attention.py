"""Triton kernels: KV-cache write, paged decode attention (split-KV), paged prefill attention.

Imported lazily by :mod:`hetero_infer.kernels.attention` the first time a Triton path
runs, so that ``TRITON_INTERPRET`` (read by ``triton.jit`` at decoration time) can still
be set by the caller or the test-suite before that.

Cache layout: ``[num_blocks, block_size, num_kv_heads, head_dim]``; token ``j`` of a
sequence lives in block ``block_table[j // block_size]`` at offset ``j % block_size``.
All kernels take explicit strides (the last dimension must be contiguous), so q/k/v may
be views into a fused QKV projection and the caches views into a larger allocation.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from . import _backend as B
from . import tuned
from ._backend import next_pow2

LOG2E = 1.4426950408889634
#: Shortest KV partition (tokens) of the split-KV decode on a GPU.
MIN_PARTITION = 256
#: Most KV splits per sequence (the reduce holds splits x head_dim partials in registers).
MAX_SPLITS = 64


@triton.jit
def _mma(a, b, F32: tl.constexpr):
    # Interpreter (bf16 dot is wrong in Triton 3.9's interpreter) and float32 inputs:
    # full-precision float32 dot. Otherwise the tensor-core dot of the 16-bit inputs.
    if F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b)


# --------------------------------------------------------------------------- KV write


@triton.jit
def _write_kv_kernel(
    k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr,
    s_kt, s_kh, s_vt, s_vh,
    s_kcb, s_kcs, s_kch, s_vcb, s_vcs, s_vch,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, PAGE: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot >= 0:
        blk = slot // PAGE
        off = slot % PAGE
        offs_h = tl.arange(0, BLOCK_H)
        offs_d = tl.arange(0, BLOCK_D)
        mask = (offs_h[:, None] < NUM_KV_HEADS) & (offs_d[None, :] < HEAD_DIM)
        k = tl.load(k_ptr + t * s_kt + offs_h[:, None] * s_kh + offs_d[None, :], mask=mask)
        v = tl.load(v_ptr + t * s_vt + offs_h[:, None] * s_vh + offs_d[None, :], mask=mask)
        tl.store(
            kc_ptr + blk * s_kcb + off * s_kcs + offs_h[:, None] * s_kch + offs_d[None, :],
            k.to(kc_ptr.dtype.element_ty),
            mask=mask,
        )
        tl.store(
            vc_ptr + blk * s_vcb + off * s_vcs + offs_h[:, None] * s_vch + offs_d[None, :],
            v.to(vc_ptr.dtype.element_ty),
            mask=mask,
        )


def write_kv_cache(k, v, k_cache, v_cache, slot_mapping) -> None:
    t, kvh, d = k.shape
    if t == 0:
        return
    _write_kv_kernel[(t,)](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        NUM_KV_HEADS=kvh, HEAD_DIM=d,
        BLOCK_H=next_pow2(kvh), BLOCK_D=next_pow2(d), PAGE=k_cache.shape[1],
        num_warps=4 if kvh * d >= 1024 else 1,
    )


# --------------------------------------------------------------------------- decode


@triton.jit(do_not_specialize=["num_splits", "s_btb"])
def _decode_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr,
    out_ptr, po_ptr, pm_ptr, pl_ptr,
    scale_log2, fixed_partition, min_partition, window, num_splits,
    s_qb, s_qh, s_kb, s_ks, s_kh, s_vb, s_vs, s_vh, s_btb, s_ob, s_oh,
    GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr, USE_WINDOW: tl.constexpr, DOT_F32: tl.constexpr,
):
    """One program per (sequence, KV head, KV split); it serves all GROUP query heads
    of that KV head, so each K/V byte is read once per split.

    The grid has ``num_splits`` splits for every sequence; each sequence cuts its own KV
    span (its context, or its window) into ``min(num_splits, cdiv(span, min_partition))``
    partitions of whole BLOCK_N tiles, from its length on the device. Splits past the
    span's end store an empty partial (m = -inf, l = 0, acc = 0), which the reduce weighs
    as zero. ``fixed_partition`` > 0 replaces the per-sequence partition with one size for
    every sequence, the last split taking the rest (the plan before per-sequence
    partitions; the benchmark compares them)."""
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    sp = tl.program_id(2)
    num_heads = tl.num_programs(1) * GROUP

    ctx = tl.load(lens_ptr + b).to(tl.int32)  # int32 or int64 lengths: one type for the bounds below
    lo_seq = 0
    if USE_WINDOW:
        # query position ctx-1 sees kv positions > ctx-1-window
        lo_seq = tl.maximum(ctx - window, 0)
    if fixed_partition > 0:
        start = sp * fixed_partition
        end = tl.where(sp == num_splits - 1, ctx, tl.minimum(start + fixed_partition, ctx))
        lo = tl.maximum(start, lo_seq)
    else:
        span = ctx - lo_seq
        parts = tl.maximum(tl.minimum(num_splits, tl.cdiv(span, min_partition)), 1)
        partition = tl.cdiv(tl.cdiv(span, parts), BLOCK_N) * BLOCK_N
        lo = lo_seq + sp * partition
        end = tl.minimum(lo + partition, ctx)

    offs_g = tl.arange(0, BLOCK_G)
    offs_d = tl.arange(0, BLOCK_D)
    g_mask = offs_g < GROUP
    d_mask = offs_d < HEAD_DIM
    heads = kvh * GROUP + offs_g
    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    q = tl.load(
        q_ptr + b.to(tl.int64) * s_qb + heads[:, None] * s_qh + offs_d[None, :],
        mask=g_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    offs_n0 = tl.arange(0, BLOCK_N)
    bt_row = bt_ptr + b.to(tl.int64) * s_btb
    k_head = k_ptr + kvh.to(tl.int64) * s_kh
    v_head = v_ptr + kvh.to(tl.int64) * s_vh
    # the block-table entries of the next tile are loaded one iteration ahead (carried), so the K/V gathers do
    # not wait on a load of their own iteration and the pipeliner can keep several tiles in flight
    page = tl.load(bt_row + (lo + offs_n0) // PAGE, mask=(lo + offs_n0) < end, other=0).to(tl.int64)
    for n0 in range(lo, end, BLOCK_N):
        offs_n = n0 + offs_n0
        n_mask = offs_n < end
        nxt = offs_n + BLOCK_N
        page_next = tl.load(bt_row + nxt // PAGE, mask=nxt < end, other=0).to(tl.int64)
        slot = offs_n % PAGE
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(
            k_head + page[:, None] * s_kb + slot[:, None] * s_ks + offs_d[None, :], mask=kv_mask, other=0.0
        )
        s = _mma(q, tl.trans(k), DOT_F32) * scale_log2
        s = tl.where(n_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # finite: every tile has a valid token
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(
            v_head + page[:, None] * s_vb + slot[:, None] * s_vs + offs_d[None, :], mask=kv_mask, other=0.0
        )
        acc = acc * alpha[:, None] + _mma(p.to(v.dtype), v, DOT_F32)
        m_i = m_new
        page = page_next

    if SPLIT:
        idx = (b * num_heads + heads).to(tl.int64) * num_splits + sp
        tl.store(pm_ptr + idx, m_i, mask=g_mask)
        tl.store(pl_ptr + idx, l_i, mask=g_mask)
        tl.store(
            po_ptr + idx[:, None] * BLOCK_D + offs_d[None, :], acc, mask=g_mask[:, None] & d_mask[None, :]
        )
    else:
        l_safe = tl.where(l_i > 0, l_i, 1.0)
        o = acc / l_safe[:, None]
        tl.store(
            out_ptr + b.to(tl.int64) * s_ob + heads[:, None] * s_oh + offs_d[None, :],
            o.to(out_ptr.dtype.element_ty),
            mask=g_mask[:, None] & d_mask[None, :],
        )


@triton.jit(do_not_specialize=["num_splits"])
def _decode_reduce_kernel(
    po_ptr, pm_ptr, pl_ptr, out_ptr,
    num_splits, s_ob, s_oh,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    num_heads = tl.num_programs(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_mask = offs_s < num_splits
    d_mask = offs_d < HEAD_DIM
    base = (b * num_heads + h).to(tl.int64) * num_splits
    m = tl.load(pm_ptr + base + offs_s, mask=s_mask, other=float("-inf"))
    l_part = tl.load(pl_ptr + base + offs_s, mask=s_mask, other=0.0)
    m_max = tl.max(m, 0)
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)
    w = tl.exp2(m - m_max)
    denom = tl.sum(l_part * w, 0)
    acc = tl.load(
        po_ptr + (base + offs_s)[:, None] * BLOCK_D + offs_d[None, :],
        mask=s_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    o = tl.sum(acc * w[:, None], 0) / tl.where(denom > 0, denom, 1.0)
    tl.store(
        out_ptr + b.to(tl.int64) * s_ob + h * s_oh + offs_d, o.to(out_ptr.dtype.element_ty), mask=d_mask
    )


def plan_decode_splits(
    batch: int, num_kv_heads: int, device: torch.device, *, max_len: int | None = None, min_partition: int = 1,
    target_programs: int | None = None, max_splits: int = MAX_SPLITS,
) -> int:
    """Splits of the KV length in the decode's grid ``(batch, KV heads, splits)``.

    Planned from the batch, not from the contexts: when batch x KV heads programs cannot
    fill the GPU (``target_programs``, default two per SM) every sequence gets up to
    ``cdiv(target, programs)`` splits (at most ``max_splits``), each sequence cutting its
    own context into partitions on the device (:func:`_decode_kernel`). ``max_len``, a
    host-side bound on the contexts where one is known (a ``max_context_len`` hint, the
    block tables' width), caps the splits at ``cdiv(max_len, min_partition)``: a wide
    table (CUDA graphs: max_model_len) only makes the cap loose, never the partitions long.
    """
    programs = max(batch * num_kv_heads, 1)
    target = target_programs if target_programs is not None else 2 * B.num_sms(device)
    if programs >= target:
        return 1
    splits = min(triton.cdiv(target, programs), max(int(max_splits), 1))
    if max_len is not None:
        splits = min(splits, triton.cdiv(max(int(max_len), 1), max(int(min_partition), 1)))
    return max(splits, 1)


def _decode_config(head_dim: int, dtype: torch.dtype, device: torch.device, *, group: int, page: int,
                   batch: int) -> dict:
    """A fresh dict: BLOCK_N, num_warps, num_stages (and MIN_PARTITION or other keys where the device's tuned
    table, kernels/tuned.py, has an entry for this shape; the built-in values below fill the rest). The shape's
    group, page and batch are required: a default would look up another shape's entry without a word."""
    if not B.compiled(device):
        return {"BLOCK_N": 16, "num_warps": 4, "num_stages": 1}
    if dtype == torch.float32:  # FMA dot: small tiles or it spills
        cfg = {"BLOCK_N": 16, "num_warps": 8, "num_stages": 2}
    else:
        cfg = {"BLOCK_N": 64 if head_dim <= 128 else 32, "num_warps": 4, "num_stages": 3}
    return {**cfg, **(tuned.lookup("decode", tuned.shape_key(head_dim, group, dtype, page), batch, device) or {})}


def _decode_settings(head_dim: int, dtype: torch.dtype, device: torch.device, config: dict | None, *, group: int,
                     page: int, batch: int) -> dict:
    """The decode's configuration in force: the built-in (or tuned) config, then the caller's overrides."""
    cfg = _decode_config(head_dim, dtype, device, group=group, page=page, batch=batch)
    cfg.update(config or {})
    default_mp = MIN_PARTITION if B.compiled(device) else 4 * cfg["BLOCK_N"]
    cfg["MIN_PARTITION"] = max(int(cfg.get("MIN_PARTITION") or default_mp), cfg["BLOCK_N"])
    return cfg


def _plan(cfg: dict, batch: int, num_kv_heads: int, device: torch.device, max_len: int | None) -> int:
    target = cfg.get("TARGET_PROGRAMS")
    return plan_decode_splits(
        batch, num_kv_heads, device, max_len=max_len, min_partition=cfg["MIN_PARTITION"],
        target_programs=None if target is None else int(target), max_splits=int(cfg.get("MAX_SPLITS", MAX_SPLITS)),
    )


def _partials_numel(rows: int, block_d: int) -> int:
    """Float32 elements of the partials of ``rows`` (sequence, head, split) rows: acc [BLOCK_D], m, l."""
    return rows * (block_d + 2)


#: Largest batch :func:`decode_workspace_numel` plans for (a plan past it that would not fit is lowered).
WORKSPACE_MAX_BATCH = 1024


def decode_workspace_numel(
    num_heads: int, num_kv_heads: int, head_dim: int, page: int, dtype: torch.dtype, device: torch.device,
    config: dict | None = None,
) -> int:
    """Float32 elements of a workspace that holds the split partials of the decode at every batch size.

    Splits happen only while batch x KV heads is below the target number of programs, so
    the largest batch x splits is bounded (below 2 x target / KV heads with the built-in
    target) whatever the engine's max_num_seqs; batches are planned with their own (tuned)
    configs, up to WORKSPACE_MAX_BATCH."""
    block_d = next_pow2(head_dim)
    group = num_heads // num_kv_heads
    most = 0
    for batch in range(1, WORKSPACE_MAX_BATCH + 1):
        cfg = _decode_settings(head_dim, dtype, device, config, group=group, page=page, batch=batch)
        splits = _plan(cfg, batch, num_kv_heads, device, None)
        if splits > 1:
            most = max(most, _partials_numel(batch * num_heads * splits, block_d))
    return most


def paged_attention_decode(
    q, k_cache, v_cache, block_tables, context_lens, scale, out,
    sliding_window=None, max_context_len=None, *, num_splits=None, config=None, workspace=None,
):
    """``config`` (tuning/tests) overrides BLOCK_N, num_warps, num_stages, MIN_PARTITION, TARGET_PROGRAMS,
    MAX_SPLITS; PARTITION (benchmark only) sets one partition size for every sequence instead of each
    sequence's own, the plan before per-sequence partitions. ``workspace``: a float32 tensor for the split
    partials (:func:`decode_workspace_numel` elements hold every batch); without it they are allocated per
    call. A planned split count that does not fit a given workspace is lowered to what fits (any count is
    correct); an explicit ``num_splits`` that does not fit raises ValueError."""
    b_sz, h, d = q.shape
    kvh = k_cache.shape[2]
    page = k_cache.shape[1]
    group = h // kvh
    if b_sz == 0:
        return out
    cfg = _decode_settings(d, q.dtype, q.device, config, group=group, page=page, batch=b_sz)
    block_d = next_pow2(d)
    if num_splits is None:
        bound = max_context_len if max_context_len is not None else block_tables.shape[1] * page
        splits = _plan(cfg, b_sz, kvh, q.device, bound)
    else:
        splits = max(1, int(num_splits))
    fixed_partition = int(cfg.get("PARTITION", 0))
    if splits > 1 and workspace is not None:
        fits = workspace.numel() // _partials_numel(b_sz * h, block_d)
        if fits < splits and num_splits is not None:
            raise ValueError(f"the decode workspace holds {fits} splits of this batch, not the {splits} asked for")
        splits = min(splits, max(fits, 1))
    split = splits > 1
    if split:
        rows = b_sz * h * splits
        if workspace is None:
            workspace = torch.empty(_partials_numel(rows, block_d), dtype=torch.float32, device=q.device)
        po = workspace[: rows * block_d]
        pm = workspace[rows * block_d : rows * (block_d + 1)]
        pl = workspace[rows * (block_d + 1) : rows * (block_d + 2)]
    else:
        po = pm = pl = out  # unused
    dot_f32 = not B.compiled(q.device) or q.dtype == torch.float32
    window = int(sliding_window) if sliding_window else 0
    _decode_kernel[(b_sz, kvh, splits)](
        q, k_cache, v_cache, block_tables, context_lens,
        out, po, pm, pl,
        float(scale) * LOG2E, fixed_partition, cfg["MIN_PARTITION"], window, splits,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1),
        GROUP=group, BLOCK_G=max(16, next_pow2(group)),
        HEAD_DIM=d, BLOCK_D=block_d, PAGE=page, BLOCK_N=cfg["BLOCK_N"],
        SPLIT=split, USE_WINDOW=window > 0, DOT_F32=dot_f32,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    if split:
        _decode_reduce_kernel[(b_sz, h)](
            po, pm, pl, out, splits, out.stride(0), out.stride(1),
            HEAD_DIM=d, BLOCK_D=block_d, BLOCK_S=next_pow2(splits),
            num_warps=4 if block_d * next_pow2(splits) >= 4096 else 2,
        )
    return out


# --------------------------------------------------------------------------- prefill


@triton.jit(do_not_specialize=["num_seqs", "search_iters", "s_btb"])
def _prefill_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, cu_q_ptr, lens_ptr, cu_tiles_ptr, out_ptr,
    scale_log2, window, num_seqs, search_iters,
    s_qt, s_qh, s_kb, s_ks, s_kh, s_vb, s_vs, s_vh, s_btb, s_ot, s_oh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    PAGE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    USE_WINDOW: tl.constexpr, DOT_F32: tl.constexpr,
):
    """One program per (query tile of one sequence, query head).

    Tiles are numbered across the batch by ``cu_tiles`` (exclusive prefix sum of each
    sequence's tile count); a program finds its sequence by binary search, so the grid
    depends only on the number of tokens and sequences (no host synchronisation)."""
    pid = tl.program_id(0)
    h = tl.program_id(1)
    kvh = h // GROUP
    total_tiles = tl.load(cu_tiles_ptr + num_seqs)
    if pid < total_tiles:
        lo = 0
        hi = num_seqs - 1
        for _ in range(search_iters):
            mid = (lo + hi + 1) // 2
            ok = tl.load(cu_tiles_ptr + mid) <= pid
            lo = tl.where(ok, mid, lo)
            hi = tl.where(ok, hi, mid - 1)
        seq = lo
        tile = pid - tl.load(cu_tiles_ptr + seq)
        q_start = tl.load(cu_q_ptr + seq)
        q_len = tl.load(cu_q_ptr + seq + 1) - q_start
        ctx = tl.load(lens_ptr + seq)
        pos0 = ctx - q_len

        offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        m_mask = offs_m < q_len
        d_mask = offs_d < HEAD_DIM
        q_pos = pos0 + offs_m
        rows = (q_start + offs_m).to(tl.int64)
        q = tl.load(
            q_ptr + rows[:, None] * s_qt + h * s_qh + offs_d[None, :],
            mask=m_mask[:, None] & d_mask[None, :],
            other=0.0,
        )
        kv_hi = tl.minimum(ctx, pos0 + (tile + 1) * BLOCK_M)
        kv_lo = 0
        if USE_WINDOW:
            kv_lo = tl.maximum(0, pos0 + tile * BLOCK_M - window + 1)
            kv_lo = (kv_lo // BLOCK_N) * BLOCK_N

        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        offs_n0 = tl.arange(0, BLOCK_N)
        bt_row = bt_ptr + seq.to(tl.int64) * s_btb
        k_head = k_ptr + kvh.to(tl.int64) * s_kh
        v_head = v_ptr + kvh.to(tl.int64) * s_vh
        # as in the decode: the next tile's block-table entries are loaded one iteration ahead (carried), so the
        # K/V gathers do not wait on a load of their own iteration and the pipeliner multi-buffers them
        page = tl.load(bt_row + (kv_lo + offs_n0) // PAGE, mask=(kv_lo + offs_n0) < kv_hi, other=0).to(tl.int64)
        for n0 in range(kv_lo, kv_hi, BLOCK_N):
            offs_n = n0 + offs_n0
            n_mask = offs_n < kv_hi
            nxt = offs_n + BLOCK_N
            page_next = tl.load(bt_row + nxt // PAGE, mask=nxt < kv_hi, other=0).to(tl.int64)
            slot = offs_n % PAGE
            kv_mask = n_mask[:, None] & d_mask[None, :]
            k = tl.load(
                k_head + page[:, None] * s_kb + slot[:, None] * s_ks + offs_d[None, :], mask=kv_mask, other=0.0
            )
            s = _mma(q, tl.trans(k), DOT_F32) * scale_log2
            allowed = (offs_n[None, :] <= q_pos[:, None]) & n_mask[None, :]
            if USE_WINDOW:
                allowed = allowed & (offs_n[None, :] > q_pos[:, None] - window)
            s = tl.where(allowed, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_safe)
            p = tl.exp2(s - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(
                v_head + page[:, None] * s_vb + slot[:, None] * s_vs + offs_d[None, :], mask=kv_mask, other=0.0
            )
            acc = acc * alpha[:, None] + _mma(p.to(v.dtype), v, DOT_F32)
            m_i = m_new
            page = page_next

        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(
            out_ptr + rows[:, None] * s_ot + h * s_oh + offs_d[None, :],
            o.to(out_ptr.dtype.element_ty),
            mask=m_mask[:, None] & d_mask[None, :],
        )


def _prefill_config(head_dim: int, dtype: torch.dtype, device: torch.device, *, group: int, page: int,
                    tokens: int) -> dict:
    """A fresh dict: BLOCK_M, BLOCK_N, num_warps, num_stages, from the device's tuned table where it has an
    entry for this shape (kernels/tuned.py), else the built-in values below."""
    if not B.compiled(device):
        return {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1}
    if dtype == torch.float32:  # FMA dot: small tiles or it spills
        cfg = {"BLOCK_M": 16, "BLOCK_N": 16, "num_warps": 8, "num_stages": 2}
    elif head_dim <= 64:
        cfg = {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3}
    elif head_dim <= 128:
        cfg = {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3}
    else:
        cfg = {"BLOCK_M": 64, "BLOCK_N": 32, "num_warps": 8, "num_stages": 2}
    return {**cfg, **(tuned.lookup("prefill", tuned.shape_key(head_dim, group, dtype, page), tokens, device) or {})}


def paged_attention_prefill(
    q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale, out,
    sliding_window=None, max_seqlen_q=None, *, config=None,
):
    """``config`` (tuning/tests) overrides BLOCK_M, BLOCK_N, num_warps, num_stages."""
    del max_seqlen_q  # the grid is planned without it
    t, h, d = q.shape
    num_seqs = context_lens.shape[0]
    kvh = k_cache.shape[2]
    if t == 0 or num_seqs == 0:
        return out
    cfg = _prefill_config(d, q.dtype, q.device, group=h // kvh, page=k_cache.shape[1], tokens=t)
    cfg.update(config or {})
    bm = cfg["BLOCK_M"]
    cu = cu_seqlens_q.to(torch.int32)
    q_lens = cu[1:] - cu[:-1]
    cu_tiles = torch.zeros(num_seqs + 1, dtype=torch.int32, device=q.device)
    torch.cumsum((q_lens + (bm - 1)) // bm, dim=0, out=cu_tiles[1:])
    max_tiles = triton.cdiv(t, bm) + num_seqs
    window = int(sliding_window) if sliding_window else 0
    _prefill_kernel[(max_tiles, h)](
        q, k_cache, v_cache, block_tables, cu, context_lens, cu_tiles, out,
        float(scale) * LOG2E, window, num_seqs, max(1, math.ceil(math.log2(max(num_seqs, 1))) + 1),
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1),
        GROUP=h // kvh, HEAD_DIM=d, BLOCK_D=next_pow2(d), PAGE=k_cache.shape[1],
        BLOCK_M=bm, BLOCK_N=cfg["BLOCK_N"],
        USE_WINDOW=window > 0, DOT_F32=not B.compiled(q.device) or q.dtype == torch.float32,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    return out
