"""Triton kernels: LoRA shrink and expand over a batch whose tokens run different adapters (the Punica / S-LoRA
BGMV scheme: each program reads its token's adapter slot and that slot's stacked weights).

``shrink``: program (token, k-block) computes ``y[t, k] = sum_i a[slot, k, i] * x[t, i]`` (zeros for a token
without an adapter, slot -1). ``expand``: program (token, n-block) adds ``sum_k b[slot, n, k] * y[t, i*R + k]``
to ``out[t, n]``, i the output slice of row n (q, k, v of a fused projection; nothing for slot -1). Both accumulate in float32. Shapes depend only on the token count, and the
slots are read on the device from a tensor the caller fills: a step can be captured in a CUDA graph with the slot
tensor a static buffer.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _backend as B


@triton.jit(do_not_specialize=["K", "N_IN"])
def _shrink_kernel(x_ptr, a_ptr, slot_ptr, y_ptr, K, N_IN, s_xm, s_as, s_ak, s_ym,
                   BLOCK_K: tl.constexpr, BLOCK_IN: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    offs_k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    k_mask = offs_k < K
    slot = tl.load(slot_ptr + t).to(tl.int64)
    acc = tl.zeros([BLOCK_K], dtype=tl.float32)
    if slot >= 0:
        a_rows = a_ptr + slot * s_as + offs_k.to(tl.int64)[:, None] * s_ak
        for i0 in range(0, N_IN, BLOCK_IN):
            offs_i = i0 + tl.arange(0, BLOCK_IN)
            i_mask = offs_i < N_IN
            xv = tl.load(x_ptr + t * s_xm + offs_i, mask=i_mask, other=0.0).to(tl.float32)
            av = tl.load(a_rows + offs_i[None, :], mask=k_mask[:, None] & i_mask[None, :], other=0.0).to(tl.float32)
            acc += tl.sum(av * xv[None, :], axis=1)
    tl.store(y_ptr + t * s_ym + offs_k, acc.to(y_ptr.dtype.element_ty), mask=k_mask)


@triton.jit(do_not_specialize=["N", "R", "S1", "S2"])
def _expand_kernel(y_ptr, b_ptr, slot_ptr, out_ptr, N, R, S1, S2, s_ym, s_bs, s_bn, s_om,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot < 0:
        return
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    # the output slice of each row (S1, S2: where the second and third begin; N where there are fewer) picks the
    # rank-R part of y it reads
    y_cols = ((offs_n >= S1).to(tl.int32) + (offs_n >= S2).to(tl.int32)) * R
    b_rows = b_ptr + slot * s_bs + offs_n.to(tl.int64)[:, None] * s_bn
    y_row = y_ptr + t * s_ym + y_cols[:, None]
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k0 in range(0, R, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask = n_mask[:, None] & (offs_k < R)[None, :]
        yv = tl.load(y_row + offs_k[None, :], mask=mask, other=0.0).to(tl.float32)
        bv = tl.load(b_rows + offs_k[None, :], mask=mask, other=0.0).to(tl.float32)
        acc += tl.sum(bv * yv, axis=1)
    o = out_ptr + t * s_om + offs_n
    prev = tl.load(o, mask=n_mask, other=0.0).to(tl.float32)
    tl.store(o, (prev + acc).to(out_ptr.dtype.element_ty), mask=n_mask)


def shrink(x: torch.Tensor, a: torch.Tensor, slots: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    t, n_in = x.shape
    k = a.shape[1]
    if t == 0:
        return y
    big = B.compiled(x.device)
    block_k = min(B.next_pow2(k), 64 if big else 16)
    block_in = 128 if big else 32
    grid = (t, triton.cdiv(k, block_k))
    _shrink_kernel[grid](x, a, slots, y, k, n_in, x.stride(0), a.stride(0), a.stride(1), y.stride(0),
                         BLOCK_K=block_k, BLOCK_IN=block_in)
    return y


def expand(y: torch.Tensor, b: torch.Tensor, slots: torch.Tensor, out: torch.Tensor,
           slices: tuple[int, ...]) -> torch.Tensor:
    """`slices`: the output slices' sizes (at most 3: q, k, v)."""
    t = y.shape[0]
    n, r = b.shape[1], b.shape[2]
    if t == 0:
        return out
    starts = [sum(slices[:i]) for i in range(1, len(slices))] + [n, n]
    big = B.compiled(y.device)
    block_n = 128 if big else 32
    block_k = min(B.next_pow2(r), 64 if big else 16)
    grid = (t, triton.cdiv(n, block_n))
    _expand_kernel[grid](y, b, slots, out, n, r, starts[0], starts[1], y.stride(0), b.stride(0), b.stride(1),
                         out.stride(0), BLOCK_N=block_n, BLOCK_K=block_k)
    return out
