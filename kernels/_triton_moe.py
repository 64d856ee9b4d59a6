"""Triton kernel: the grouped GEMM of the fused MoE layer (vLLM's ``fused_moe`` scheme).

``moe_align`` sorts the (token, expert) pairs by expert and pads each expert's run to a multiple of BLOCK_M, so
every BLOCK_M-row tile belongs to one expert; one launch then covers all experts: program (tile, n-block) loads
its rows (gathered from the activations by pair index, ``row = pair // a_div``), multiplies them by its expert's
weights (float; INT8 with per-channel scales; INT4 in groups, read as two contiguous halves as ``_triton_quant``
does) and stores each row at its pair's index, optionally weighted by the pair's routing weight. Shapes never
depend on the routing (the padded length is an upper bound; tiles past the real one return at once), so a step
can be captured in a CUDA graph.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _backend as B
from . import ops
from ._triton_quant import _mma
from .reference import ExpertWeights


@triton.jit(do_not_specialize=["num_pairs"])
def _moe_gemm_kernel(
    a_ptr, b_ptr, s_ptr, z_ptr, w_ptr, c_ptr, sorted_ptr, expert_ptr, padded_ptr,
    N, K, num_pairs, a_div,
    s_am, s_be, s_bn, s_se, s_sn, s_ze, s_zn, s_cm,
    QUANT: tl.constexpr, GROUP: tl.constexpr, MUL_WEIGHT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_F32: tl.constexpr,
):
    HALF: tl.constexpr = GROUP // 2
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    if pid_m * BLOCK_M >= tl.load(padded_ptr):
        return
    pairs = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    m_mask = pairs < num_pairs
    expert = tl.load(expert_ptr + pid_m).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    a_rows = a_ptr + (pairs // a_div).to(tl.int64)[:, None] * s_am
    b_cols = b_ptr + expert * s_be + offs_n.to(tl.int64)[None, :] * s_bn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if QUANT == 4:
        offs_h = tl.arange(0, HALF)
        for g in range(0, K // GROUP):
            k0 = g * GROUP
            x_lo = tl.load(a_rows + (k0 + offs_h)[None, :], mask=m_mask[:, None], other=0.0)
            x_hi = tl.load(a_rows + (k0 + HALF + offs_h)[None, :], mask=m_mask[:, None], other=0.0)
            packed = tl.load(b_cols + (g * HALF + offs_h)[:, None], mask=n_mask[None, :], other=0)
            zero = tl.load(z_ptr + expert * s_ze + offs_n * s_zn + g, mask=n_mask, other=0).to(tl.float32)
            scale = tl.load(s_ptr + expert * s_se + offs_n * s_sn + g, mask=n_mask, other=0.0).to(tl.float32)
            w_lo = ((packed & 15).to(tl.float32) - zero[None, :]).to(x_lo.dtype)
            w_hi = ((packed >> 4).to(tl.float32) - zero[None, :]).to(x_lo.dtype)
            acc += (_mma(x_lo, w_lo, DOT_F32) + _mma(x_hi, w_hi, DOT_F32)) * scale[None, :]
    else:
        offs_k = tl.arange(0, BLOCK_K)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + offs_k
            k_mask = kk < K
            a = tl.load(a_rows + kk[None, :], mask=m_mask[:, None] & k_mask[None, :], other=0.0)
            b = tl.load(b_cols + kk[:, None], mask=k_mask[:, None] & n_mask[None, :], other=0)
            if QUANT == 8:
                if DOT_F32:  # (the interpreter mis-converts int8 -> bf16 directly)
                    acc += _mma(a, b.to(tl.float32), DOT_F32)
                else:
                    acc += _mma(a, b.to(a.dtype), DOT_F32)
            else:
                acc += _mma(a, b, DOT_F32)
        if QUANT == 8:
            acc *= tl.load(s_ptr + expert * s_se + offs_n * s_sn, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    if MUL_WEIGHT:
        acc *= tl.load(w_ptr + pairs, mask=m_mask, other=0.0).to(tl.float32)[:, None]
    c = c_ptr + pairs.to(tl.int64)[:, None] * s_cm + offs_n[None, :]
    tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def moe_align(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(pair indices sorted by expert, each expert's run padded to a multiple of ``block_m`` with ``T*k`` (no pair);
    each tile's expert; the padded length, a one-element tensor). Shapes depend only on ``T*k``, E and block_m; no
    value reaches the host."""
    flat = topk_ids.reshape(-1).long()
    pairs, device = flat.numel(), flat.device
    counts = torch.zeros(num_experts, dtype=torch.long, device=device).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    ends = padded.cumsum(0)
    first = ends - padded  # each expert's first padded slot
    order = torch.argsort(flat, stable=True)
    experts = flat[order]
    rank = torch.arange(pairs, device=device) - (counts.cumsum(0) - counts)[experts]
    bound = pairs + min(num_experts, pairs) * (block_m - 1)  # at most min(E, pairs) runs, each padded by < block_m
    bound = triton.cdiv(bound, block_m) * block_m
    sorted_pairs = torch.full((bound,), pairs, dtype=torch.int32, device=device)
    sorted_pairs[first[experts] + rank] = order.to(torch.int32)
    tile_starts = torch.arange(0, bound, block_m, device=device)
    tile_expert = torch.searchsorted(ends, tile_starts, right=True).clamp_(max=num_experts - 1).to(torch.int32)
    return sorted_pairs, tile_expert, ends[-1:].to(torch.int32)


def _blocks(m: int, device: torch.device, dtype: torch.dtype) -> tuple[int, int, int]:
    if not B.compiled(device):  # interpreter: small tiles so tests cover several of each
        return 16, 32, 32
    if dtype == torch.float32:
        return 16, 32, 32
    return (16, 64, 64) if m <= 64 else (64, 128, 64)


def _gemm(a, ew: ExpertWeights, c, align, a_div: int, weights, block: tuple[int, int, int]) -> None:
    sorted_pairs, tile_expert, padded = align
    block_m, block_n, block_k = block
    e, n, kdim = ew.shape
    quant = {"float": 0, "int8": 8, "int4": 4}[ew.method]
    s = ew.scales if ew.scales is not None else ew.weight
    z = ew.zeros if ew.zeros is not None else ew.weight
    compiled = B.compiled(a.device)
    dot_f32 = not compiled or a.dtype == torch.float32
    stages = 3 if compiled else 1
    if quant == 4 and compiled:  # the two half-group dots and their dequantized tiles: 64 x 128 spills (sm_90)
        block_n, stages = min(block_n, 64), 1 if dot_f32 else stages
    grid = (sorted_pairs.shape[0] // block_m, triton.cdiv(n, block_n))
    _moe_gemm_kernel[grid](
        a, ew.weight, s, z, weights if weights is not None else s, c, sorted_pairs, tile_expert, padded,
        n, kdim, c.shape[0], a_div,
        a.stride(0), ew.weight.stride(0), ew.weight.stride(1), s.stride(0), s.stride(1) if s.dim() > 1 else 0,
        z.stride(0), z.stride(1) if z.dim() > 1 else 0, c.stride(0),
        QUANT=quant, GROUP=ew.group_size or 32, MUL_WEIGHT=weights is not None,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, DOT_F32=dot_f32, num_warps=4, num_stages=stages,
    )


def fused_moe(x, w1: ExpertWeights, w2: ExpertWeights, topk_weights, topk_ids) -> torch.Tensor:
    t, k = topk_ids.shape
    block = _blocks(t * k, x.device, x.dtype)
    align = moe_align(topk_ids, w1.shape[0], block[0])
    h = torch.empty((t * k, w1.shape[1]), dtype=x.dtype, device=x.device)
    _gemm(x, w1, h, align, k, None, block)
    a = ops.silu_and_mul(h)
    y = torch.empty((t * k, x.shape[1]), dtype=torch.float32, device=x.device)
    _gemm(a, w2, y, align, 1, topk_weights.reshape(-1).contiguous(), block)
    return y.view(t, k, -1).sum(dim=1).to(x.dtype)
