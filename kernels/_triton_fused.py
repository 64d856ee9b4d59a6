"""Triton kernel: the per-head q/k RMSNorm (Qwen3), neox rotary embedding and the KV-cache write of one
layer's new tokens, fused into one launch (four kernels unfused: q norm, k norm, rotary, KV write).

Imported lazily (see ``_triton_attention``). Rounding points are the unfused kernels': the norm in float32,
rounded to the activation dtype, scaled by the weight in float32 and rounded again (what the q/k norm
writes); the rotation in float32 from those values, rounded once; k and v converted to the cache's dtype.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._backend import next_pow2
from ._triton_ops import cos_sin_at


@triton.jit
def _norm_rope_heads(
    src, t, s_t, s_h, n_heads, w_ptr, cos, sin, rstd_eps,
    HEAD_DIM: tl.constexpr, HALF: tl.constexpr, ROT: tl.constexpr, NORM: tl.constexpr, HAS_PASS: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_P: tl.constexpr, OUT_DTYPE: tl.constexpr,
):
    """Rows of `n_heads` heads of token t: (rotated first half, rotated second half, pass-through dims) in
    float32, each already rounded to OUT_DTYPE (the values the unfused kernels would have stored)."""
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_HALF)
    offs_p = tl.arange(0, BLOCK_P)
    h_mask = offs_h < n_heads
    mask = h_mask[:, None] & (offs_d[None, :] < HALF)
    p_mask = h_mask[:, None] & (offs_p[None, :] < HEAD_DIM - ROT)
    row = src + t * s_t + offs_h[:, None] * s_h
    x1 = tl.load(row + offs_d[None, :], mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(row + HALF + offs_d[None, :], mask=mask, other=0.0).to(tl.float32)
    x3 = tl.zeros([BLOCK_H, BLOCK_P], tl.float32)
    if HAS_PASS:
        x3 = tl.load(row + ROT + offs_p[None, :], mask=p_mask, other=0.0).to(tl.float32)
    if NORM:
        var = (tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1) + tl.sum(x3 * x3, 1)) / HEAD_DIM
        rstd = 1.0 / tl.sqrt(var + rstd_eps)
        d_mask = offs_d < HALF
        w1 = tl.load(w_ptr + offs_d, mask=d_mask, other=0.0).to(tl.float32)
        w2 = tl.load(w_ptr + HALF + offs_d, mask=d_mask, other=0.0).to(tl.float32)
        x1 = ((x1 * rstd[:, None]).to(OUT_DTYPE).to(tl.float32) * w1[None, :]).to(OUT_DTYPE).to(tl.float32)
        x2 = ((x2 * rstd[:, None]).to(OUT_DTYPE).to(tl.float32) * w2[None, :]).to(OUT_DTYPE).to(tl.float32)
        if HAS_PASS:
            w3 = tl.load(w_ptr + ROT + offs_p, mask=offs_p < HEAD_DIM - ROT, other=0.0).to(tl.float32)
            x3 = ((x3 * rstd[:, None]).to(OUT_DTYPE).to(tl.float32) * w3[None, :]).to(OUT_DTYPE).to(tl.float32)
    o1 = (x1 * cos[None, :] - x2 * sin[None, :]).to(OUT_DTYPE).to(tl.float32)
    o2 = (x2 * cos[None, :] + x1 * sin[None, :]).to(OUT_DTYPE).to(tl.float32)
    return o1, o2, x3


@triton.jit
def _rope_kv_kernel(
    pos_ptr, cs_ptr, q_ptr, k_ptr, v_ptr, qw_ptr, kw_ptr, qo_ptr, kc_ptr, vc_ptr, slot_ptr,
    n_q_heads, n_kv_heads, eps,
    s_c, s_qt, s_qh, s_kt, s_kh, s_vt, s_vh, s_qot, s_qoh,
    s_kcb, s_kcs, s_kch, s_vcb, s_vcs, s_vch,
    HEAD_DIM: tl.constexpr, HALF: tl.constexpr, ROT: tl.constexpr, NORM: tl.constexpr, HAS_PASS: tl.constexpr,
    BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_P: tl.constexpr,
    BLOCK_D: tl.constexpr, PAGE: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    cos, sin = cos_sin_at(cs_ptr, pos_ptr, t, s_c, HALF, BLOCK_HALF)
    offs_d = tl.arange(0, BLOCK_HALF)
    d_mask = offs_d < HALF
    dt = qo_ptr.dtype.element_ty

    q1, q2, q3 = _norm_rope_heads(q_ptr, t, s_qt, s_qh, n_q_heads, qw_ptr, cos, sin, eps, HEAD_DIM, HALF, ROT,
                                  NORM, HAS_PASS, BLOCK_HQ, BLOCK_HALF, BLOCK_P, dt)
    offs_hq = tl.arange(0, BLOCK_HQ)
    offs_p = tl.arange(0, BLOCK_P)
    mq = (offs_hq[:, None] < n_q_heads) & d_mask[None, :]
    qo = qo_ptr + t * s_qot + offs_hq[:, None] * s_qoh
    tl.store(qo + offs_d[None, :], q1.to(dt), mask=mq)
    tl.store(qo + HALF + offs_d[None, :], q2.to(dt), mask=mq)
    if HAS_PASS:
        tl.store(qo + ROT + offs_p[None, :], q3.to(dt),
                 mask=(offs_hq[:, None] < n_q_heads) & (offs_p[None, :] < HEAD_DIM - ROT))

    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot >= 0:
        blk = slot // PAGE
        off = slot % PAGE
        k1, k2, k3 = _norm_rope_heads(k_ptr, t, s_kt, s_kh, n_kv_heads, kw_ptr, cos, sin, eps, HEAD_DIM, HALF,
                                      ROT, NORM, HAS_PASS, BLOCK_HK, BLOCK_HALF, BLOCK_P, dt)
        cdt = kc_ptr.dtype.element_ty
        offs_hk = tl.arange(0, BLOCK_HK)
        hk_mask = offs_hk < n_kv_heads
        mk = hk_mask[:, None] & d_mask[None, :]
        kc = kc_ptr + blk * s_kcb + off * s_kcs + offs_hk[:, None] * s_kch
        tl.store(kc + offs_d[None, :], k1.to(cdt), mask=mk)
        tl.store(kc + HALF + offs_d[None, :], k2.to(cdt), mask=mk)
        if HAS_PASS:
            tl.store(kc + ROT + offs_p[None, :], k3.to(cdt), mask=hk_mask[:, None] & (offs_p[None, :] < HEAD_DIM - ROT))
        offs_v = tl.arange(0, BLOCK_D)
        mv = hk_mask[:, None] & (offs_v[None, :] < HEAD_DIM)
        v = tl.load(v_ptr + t * s_vt + offs_hk[:, None] * s_vh + offs_v[None, :], mask=mv)
        tl.store(vc_ptr + blk * s_vcb + off * s_vcs + offs_hk[:, None] * s_vch + offs_v[None, :],
                 v.to(vc_ptr.dtype.element_ty), mask=mv)


def rotary_and_write_kv(positions, q, k, v, cos_sin_cache, k_cache, v_cache, slot_mapping, q_out,
                        q_norm_weight, k_norm_weight, eps) -> None:
    t, hq, d = q.shape
    if t == 0:
        return
    hk = k.shape[1]
    rot = cos_sin_cache.shape[1]
    half = rot // 2
    norm = q_norm_weight is not None
    width = max(hq, hk) * next_pow2(d)
    _rope_kv_kernel[(t,)](
        positions, cos_sin_cache, q, k, v,
        q_norm_weight if norm else q, k_norm_weight if norm else k,
        q_out, k_cache, v_cache, slot_mapping,
        hq, hk, float(eps),
        cos_sin_cache.stride(0), q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        q_out.stride(0), q_out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1),
        v_cache.stride(2),
        HEAD_DIM=d, HALF=half, ROT=rot, NORM=norm, HAS_PASS=rot < d,
        BLOCK_HQ=next_pow2(hq), BLOCK_HK=next_pow2(hk), BLOCK_HALF=next_pow2(half),
        BLOCK_P=next_pow2(d - rot) if rot < d else 1, BLOCK_D=next_pow2(d), PAGE=k_cache.shape[1],
        num_warps=4 if width >= 2048 else 2,
    )
