"""Triton kernels: weight-only quantized matmuls that dequantize inside the kernel.

* W8A16: ``y = (x @ q.T) * scale[n]``; the int8 tile is converted to the activation
  dtype (exact: |q| <= 127) and fed to the tensor cores; the per-channel scale is applied
  once to the float32 accumulator.
* W4A16: per group g of G columns, ``y += (x_g @ (q_g - zero_g).T) * scale_g``; the
  4-bit values minus their zero point are small integers, exact in fp16/bf16; the group
  scale is applied to the float32 partial product. The packing (see
  ``reference.quantize_int4``) lets a group be read as two contiguous halves, so the
  kernel issues two dots per group and never interleaves nibbles.

Decode batches (small M) are memory-bound on the weights: the grid is split along K
(``SPLIT_K``) until it fills the GPU, and the partial sums are added in a fixed order
(deterministic) by the wrapper.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _backend as B


@triton.jit
def _mma(a, b, F32: tl.constexpr):
    if F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit(do_not_specialize=["M", "s_os"])
def _w8_kernel(
    x_ptr, w_ptr, s_ptr, bias_ptr, out_ptr,
    M, N, K, k_per_split,
    s_xm, s_wn, s_om, s_os,
    HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_F32: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < N
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(K, k_lo + k_per_split)
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * s_xm
    w_cols = w_ptr + offs_n.to(tl.int64)[None, :] * s_wn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        kk = k0 + offs_k
        k_mask = kk < k_hi
        x = tl.load(x_rows + kk[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0)
        w = tl.load(w_cols + kk[:, None], mask=k_mask[:, None] & n_mask[None, :], other=0)
        if DOT_F32:  # (the interpreter mis-converts int8 -> bf16 directly)
            acc += _mma(x, w.to(tl.float32), DOT_F32)
        else:
            acc += _mma(x, w.to(x.dtype), DOT_F32)
    scale = tl.load(s_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    acc = acc * scale[None, :]
    out_mask = m_mask[:, None] & n_mask[None, :]
    if SPLIT:
        tl.store(out_ptr + pid_k * s_os + offs_m.to(tl.int64)[:, None] * s_om + offs_n[None, :], acc, mask=out_mask)
    else:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        tl.store(
            out_ptr + offs_m.to(tl.int64)[:, None] * s_om + offs_n[None, :],
            acc.to(out_ptr.dtype.element_ty),
            mask=out_mask,
        )


@triton.jit(do_not_specialize=["M", "s_os"])
def _w4_kernel(
    x_ptr, w_ptr, s_ptr, z_ptr, bias_ptr, out_ptr,
    M, N, num_groups, groups_per_split,
    s_xm, s_wn, s_sn, s_zn, s_om, s_os,
    HAS_BIAS: tl.constexpr, SPLIT: tl.constexpr, GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_F32: tl.constexpr,
):
    HALF: tl.constexpr = GROUP // 2
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_h = tl.arange(0, HALF)
    m_mask = offs_m < M
    n_mask = offs_n < N
    g_lo = pid_k * groups_per_split
    g_hi = tl.minimum(num_groups, g_lo + groups_per_split)
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * s_xm
    w_cols = w_ptr + offs_n.to(tl.int64)[None, :] * s_wn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    x_mask = m_mask[:, None]
    w_mask = n_mask[None, :]
    for g in range(g_lo, g_hi):
        k0 = g * GROUP
        x_lo = tl.load(x_rows + (k0 + offs_h)[None, :], mask=x_mask, other=0.0)
        x_hi = tl.load(x_rows + (k0 + HALF + offs_h)[None, :], mask=x_mask, other=0.0)
        packed = tl.load(w_cols + (g * HALF + offs_h)[:, None], mask=w_mask, other=0)
        zero = tl.load(z_ptr + offs_n * s_zn + g, mask=n_mask, other=0).to(tl.float32)
        scale = tl.load(s_ptr + offs_n * s_sn + g, mask=n_mask, other=0.0).to(tl.float32)
        w_lo = ((packed & 15).to(tl.float32) - zero[None, :]).to(x_lo.dtype)
        w_hi = ((packed >> 4).to(tl.float32) - zero[None, :]).to(x_lo.dtype)
        part = _mma(x_lo, w_lo, DOT_F32) + _mma(x_hi, w_hi, DOT_F32)
        acc += part * scale[None, :]
    out_mask = m_mask[:, None] & n_mask[None, :]
    if SPLIT:
        tl.store(out_ptr + pid_k * s_os + offs_m.to(tl.int64)[:, None] * s_om + offs_n[None, :], acc, mask=out_mask)
    else:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        tl.store(
            out_ptr + offs_m.to(tl.int64)[:, None] * s_om + offs_n[None, :],
            acc.to(out_ptr.dtype.element_ty),
            mask=out_mask,
        )


@triton.jit(do_not_specialize=["M"])
def _splitk_reduce_kernel(
    ws_ptr, bias_ptr, out_ptr, M, N, s_om,
    SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr,
):
    """out[m, n] = sum_s ws[s, m, n] (+ bias[n]), summed in a fixed order (deterministic)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M * N
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in tl.static_range(SPLIT):
        acc += tl.load(ws_ptr + s * M * N + offs, mask=mask, other=0.0)
    n = offs % N
    if HAS_BIAS:
        acc += tl.load(bias_ptr + n, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + (offs // N) * s_om + n, acc.to(out_ptr.dtype.element_ty), mask=mask)


#: Most K-splits of one matmul (each adds an [M, N] float32 partial to the workspace).
MAX_SPLIT_K = 16


def _pick(m: int, n: int, k_units: int, device: torch.device, dtype: torch.dtype) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, split) for an [m, n] output with ``k_units`` K-steps.

    Small M is weight-bandwidth bound: output tiles are few, so K is split until about
    two programs per SM stream weights (each split keeping >= 4 K-steps)."""
    if not B.compiled(device):  # interpreter: small tiles so tests cover several of each
        block_m, block_n = 16, 32
        tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
        return block_m, block_n, min(k_units, max(1, 8 // tiles))
    if dtype == torch.float32:  # FMA dot: small tiles or it spills
        block_m, block_n = 16, 32
    elif m <= 16:
        block_m, block_n = 16, 64
    elif m <= 32:
        block_m, block_n = 32, 64
    elif m <= 64:
        block_m, block_n = 64, 64
    else:
        block_m, block_n = 64, 128
    tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
    target = 2 * B.num_sms(device)
    split = 1
    if tiles < target:
        split = max(1, min(k_units // 4, triton.cdiv(target, tiles), MAX_SPLIT_K))
    return block_m, block_n, split


def _finish(partials, bias, out):
    split, m, n = partials.shape
    block = 1024
    _splitk_reduce_kernel[(triton.cdiv(m * n, block),)](
        partials, bias if bias is not None else partials, out, m, n, out.stride(0),
        SPLIT=split, HAS_BIAS=bias is not None, BLOCK=block, num_warps=4,
    )


def _config(m, n, k_units, x2, config, fp32_stages):
    block_m, block_n, split = _pick(m, n, k_units, x2.device, x2.dtype)
    cfg = {"BLOCK_M": block_m, "BLOCK_N": block_n, "SPLIT_K": split, "num_warps": 4,
           "num_stages": (fp32_stages if x2.dtype == torch.float32 else 4) if B.compiled(x2.device) else 1}
    cfg.update(config or {})
    return cfg


def int8_matmul(x2, qweight, scales, bias, out2, *, config=None) -> None:
    """``config`` (tuning/tests) overrides BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages."""
    m, kdim = x2.shape
    n = qweight.shape[0]
    if m == 0 or n == 0:
        return
    block_k = (32 if x2.dtype == torch.float32 else 128) if B.compiled(x2.device) else 64
    block_k = (config or {}).get("BLOCK_K", block_k)
    k_steps = triton.cdiv(kdim, block_k)
    cfg = _config(m, n, k_steps, x2, config, 2)
    block_m, block_n = cfg["BLOCK_M"], cfg["BLOCK_N"]
    steps_per_split = triton.cdiv(k_steps, cfg["SPLIT_K"])
    split = triton.cdiv(k_steps, steps_per_split)
    dot_f32 = not B.compiled(x2.device) or x2.dtype == torch.float32
    grid = (triton.cdiv(n, block_n), triton.cdiv(m, block_m), split)
    target = out2
    if split > 1:
        target = torch.empty((split, m, n), dtype=torch.float32, device=x2.device)
    _w8_kernel[grid](
        x2, qweight, scales, bias if bias is not None else scales, target,
        m, n, kdim, steps_per_split * block_k,
        x2.stride(0), qweight.stride(0), target.stride(-2), target.stride(0) if split > 1 else 0,
        HAS_BIAS=bias is not None, SPLIT=split > 1,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, DOT_F32=dot_f32,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    if split > 1:
        _finish(target, bias, out2)


def int4_matmul(x2, packed, scales, zeros, group_size, bias, out2, *, config=None) -> None:
    """``config`` (tuning/tests) overrides BLOCK_M, BLOCK_N, SPLIT_K, num_warps, num_stages."""
    m, kdim = x2.shape
    n = packed.shape[0]
    if m == 0 or n == 0:
        return
    num_groups = kdim // group_size
    cfg = _config(m, n, num_groups, x2, config, 1)
    block_m, block_n = cfg["BLOCK_M"], cfg["BLOCK_N"]
    per_split = triton.cdiv(num_groups, cfg["SPLIT_K"])
    split = triton.cdiv(num_groups, per_split)
    dot_f32 = not B.compiled(x2.device) or x2.dtype == torch.float32
    grid = (triton.cdiv(n, block_n), triton.cdiv(m, block_m), split)
    target = out2
    if split > 1:
        target = torch.empty((split, m, n), dtype=torch.float32, device=x2.device)
    _w4_kernel[grid](
        x2, packed, scales, zeros, bias if bias is not None else scales, target,
        m, n, num_groups, per_split,
        x2.stride(0), packed.stride(0), scales.stride(0), zeros.stride(0),
        target.stride(-2), target.stride(0) if split > 1 else 0,
        HAS_BIAS=bias is not None, SPLIT=split > 1, GROUP=group_size,
        BLOCK_M=block_m, BLOCK_N=block_n, DOT_F32=dot_f32,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    if split > 1:
        _finish(target, bias, out2)
