"""Triton kernels: RMSNorm (+ fused residual add), neox rotary embedding, SiLU-and-mul.

Imported lazily (see ``_triton_attention``). Every kernel computes in float32 and rounds
the result to the output dtype once, with the rounding points documented in
:mod:`hetero_infer.kernels.reference`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._backend import next_pow2

# --------------------------------------------------------------------------- RMSNorm


@triton.jit(do_not_specialize=["n_rows"])
def _rms_norm_kernel(
    x_ptr, r_ptr, w_ptr, out_ptr, rout_ptr,
    n_rows, n_cols, eps,
    s_x, s_r, s_o, s_ro,
    HAS_RES: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_N)
    r_mask = rows < n_rows
    c_mask = cols < n_cols
    mask = r_mask[:, None] & c_mask[None, :]
    rows64 = rows.to(tl.int64)
    x = tl.load(x_ptr + rows64[:, None] * s_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        r = tl.load(r_ptr + rows64[:, None] * s_r + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        summed = (x + r).to(rout_ptr.dtype.element_ty)
        tl.store(rout_ptr + rows64[:, None] * s_ro + cols[None, :], summed, mask=mask)
        x = summed.to(tl.float32)
    var = tl.sum(x * x, 1) / n_cols
    rstd = 1.0 / tl.sqrt(var + eps)
    w = tl.load(w_ptr + cols, mask=c_mask, other=0.0).to(tl.float32)
    normed = (x * rstd[:, None]).to(out_ptr.dtype.element_ty).to(tl.float32)
    y = normed * w[None, :]
    tl.store(out_ptr + rows64[:, None] * s_o + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(x2, weight, eps, residual2, out2, rout2) -> None:
    """x2/residual2/out2/rout2 are [rows, N] views with unit column stride."""
    n_rows, n_cols = x2.shape
    if n_rows == 0:
        return
    block_n = next_pow2(n_cols)
    block_r = max(1, min(16, 2048 // block_n))
    num_warps = 8 if block_n >= 4096 else (4 if block_n >= 1024 else 2)
    if block_n >= 16384:
        num_warps = 16
    has_res = residual2 is not None
    _rms_norm_kernel[(triton.cdiv(n_rows, block_r),)](
        x2, residual2 if has_res else x2, weight, out2, rout2 if has_res else out2,
        n_rows, n_cols, float(eps),
        x2.stride(0), residual2.stride(0) if has_res else 0, out2.stride(0), rout2.stride(0) if has_res else 0,
        HAS_RES=has_res, BLOCK_R=block_r, BLOCK_N=block_n, num_warps=num_warps,
    )


# --------------------------------------------------------------------------- SiLU and mul


@triton.jit
def _silu_and_mul_kernel(
    x_ptr, out_ptr, n_cols, s_x, s_o, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    gate = tl.load(x_ptr + row * s_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * s_x + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    y = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + row * s_o + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x2, out2) -> None:
    n_rows, two_i = x2.shape
    inter = two_i // 2
    if n_rows == 0 or inter == 0:
        return
    block = min(2048, next_pow2(inter))
    _silu_and_mul_kernel[(n_rows, triton.cdiv(inter, block))](
        x2, out2, inter, x2.stride(0), out2.stride(0), BLOCK=block, num_warps=4 if block >= 1024 else 2,
    )


# --------------------------------------------------------------------------- rotary


@triton.jit
def _rotate_heads(
    src, dst, cos, sin, t, s_t, s_h, d_t, d_h, n_heads,
    HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
):
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_HALF)
    mask = (offs_h[:, None] < n_heads) & (offs_d[None, :] < HALF)
    p1 = src + t * s_t + offs_h[:, None] * s_h + offs_d[None, :]
    x1 = tl.load(p1, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(p1 + HALF, mask=mask, other=0.0).to(tl.float32)
    o1 = x1 * cos[None, :] - x2 * sin[None, :]
    o2 = x2 * cos[None, :] + x1 * sin[None, :]
    q1 = dst + t * d_t + offs_h[:, None] * d_h + offs_d[None, :]
    tl.store(q1, o1.to(dst.dtype.element_ty), mask=mask)
    tl.store(q1 + HALF, o2.to(dst.dtype.element_ty), mask=mask)


@triton.jit
def cos_sin_at(cache_ptr, pos_ptr, t, s_c, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """Token t's rotary (cos, sin) rows, float32 [BLOCK_HALF] (masked past HALF), from the [cos | sin] cache."""
    pos = tl.load(pos_ptr + t).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_HALF)
    d_mask = offs_d < HALF
    cos = tl.load(cache_ptr + pos * s_c + offs_d, mask=d_mask, other=0.0).to(tl.float32)
    sin = tl.load(cache_ptr + pos * s_c + HALF + offs_d, mask=d_mask, other=0.0).to(tl.float32)
    return cos, sin


@triton.jit
def _rotary_kernel(
    pos_ptr, cache_ptr, q_ptr, k_ptr, qo_ptr, ko_ptr,
    n_q_heads, n_k_heads,
    s_c, s_qt, s_qh, s_kt, s_kh, s_qot, s_qoh, s_kot, s_koh,
    HAS_K: tl.constexpr, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr,
    BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    cos, sin = cos_sin_at(cache_ptr, pos_ptr, t, s_c, HALF, BLOCK_HALF)
    _rotate_heads(q_ptr, qo_ptr, cos, sin, t, s_qt, s_qh, s_qot, s_qoh, n_q_heads, HALF, BLOCK_HQ, BLOCK_HALF)
    if HAS_K:
        _rotate_heads(k_ptr, ko_ptr, cos, sin, t, s_kt, s_kh, s_kot, s_koh, n_k_heads, HALF, BLOCK_HK, BLOCK_HALF)


def rotary_embedding(positions, q, k, cos_sin_cache, q_out, k_out) -> None:
    """Rotates the first ``cos_sin_cache.shape[1]`` dims of q/k into q_out/k_out (may alias)."""
    t, hq, _ = q.shape
    if t == 0:
        return
    half = cos_sin_cache.shape[1] // 2
    has_k = k is not None
    hk = k.shape[1] if has_k else 1
    kk = k if has_k else q
    ko = k_out if has_k else q_out
    width = max(hq, hk) * next_pow2(half)
    _rotary_kernel[(t,)](
        positions, cos_sin_cache, q, kk, q_out, ko,
        hq, hk,
        cos_sin_cache.stride(0), q.stride(0), q.stride(1), kk.stride(0), kk.stride(1),
        q_out.stride(0), q_out.stride(1), ko.stride(0), ko.stride(1),
        HAS_K=has_k, HALF=half, BLOCK_HALF=next_pow2(half),
        BLOCK_HQ=next_pow2(hq), BLOCK_HK=next_pow2(hk),
        num_warps=4 if width >= 2048 else 2,
    )
