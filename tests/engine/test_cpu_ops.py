"""The fused CPU ops (kernels/cpu/csrc/ops.c) against the PyTorch expressions they replace (the reference backend)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hetero_infer.kernels.cpu import ops as cpu_ops
from hetero_infer.worker.runner.attention.torch_backend import rms_norm
from hetero_infer.worker.runner.models.rotary import rotate_half

DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture(autouse=True)
def _built():
    assert cpu_ops.available(torch.float32), "the CPU kernels must build on these machines"


def ulps_apart(a: torch.Tensor, b: torch.Tensor) -> int:
    """Largest distance in units of the last place between two same-dtype tensors of finite values."""
    bits = {torch.float32: torch.int32, torch.bfloat16: torch.int16}[a.dtype]
    ia, ib = a.view(bits).long(), b.view(bits).long()
    ia = torch.where(ia < 0, -(ia & 0x7FFFFFFF if a.dtype == torch.float32 else ia & 0x7FFF), ia)
    ib = torch.where(ib < 0, -(ib & 0x7FFFFFFF if b.dtype == torch.float32 else ib & 0x7FFF), ib)
    return int((ia - ib).abs().max())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,n", [(1, 64), (7, 576), (130, 100)])
@pytest.mark.parametrize("with_x", [True, False])
def test_add_rms_norm_matches_torch(dtype, rows, n, with_x):
    gen = torch.Generator().manual_seed(rows * n)
    weight, eps = (torch.randn(n, generator=gen) * 0.5 + 1).to(dtype), 1e-5
    residual = torch.randn(rows, n, generator=gen).to(dtype) * 3
    x = torch.randn(rows, n, generator=gen).to(dtype) if with_x else None
    want_res = residual + x if with_x else residual.clone()
    want = rms_norm(want_res, weight, eps)
    res = residual.clone()
    got = cpu_ops.add_rms_norm(x, res, weight, eps)
    assert torch.equal(res, want_res), "the residual add must round exactly as PyTorch does"
    # the mean of squares is summed in another order: a few float32 ulps, at most one bfloat16 ulp
    assert ulps_apart(got, want) <= (8 if dtype == torch.float32 else 1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,d", [(9, 3, 64), (4, 4, 16), (8, 2, 128)])
def test_rope_and_cache_matches_torch(dtype, heads, kv_heads, d):
    gen = torch.Generator().manual_seed(heads + d)
    t, max_pos, blocks, bs = 11, 300, 8, 16
    qkv = torch.randn(t, (heads + 2 * kv_heads) * d, generator=gen).to(dtype)
    q = qkv[:, : heads * d].view(t, heads, d)
    k = qkv[:, heads * d : (heads + kv_heads) * d].view(t, kv_heads, d)
    v = qkv[:, (heads + kv_heads) * d :].view(t, kv_heads, d)
    angles = torch.rand(max_pos, d // 2, generator=gen, dtype=torch.float64) * 6.3
    emb = torch.cat((angles, angles), dim=-1)
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    positions = torch.randint(0, max_pos, (t,), generator=gen)
    slots = torch.randperm(blocks * bs, generator=gen)[:t]
    slots[3] = -1  # a padding row: rotated, not written
    want_q = q * cos[positions].unsqueeze(1) + rotate_half(q) * sin[positions].unsqueeze(1)
    want_k = k * cos[positions].unsqueeze(1) + rotate_half(k) * sin[positions].unsqueeze(1)
    want_v = v.clone()
    k_cache = torch.full((blocks, bs, kv_heads, d), float("nan"), dtype=dtype)
    v_cache = k_cache.clone()
    cpu_ops.rope_and_cache(q, k, v, positions, cos, sin, k_cache, v_cache, slots)
    assert torch.equal(q, want_q) and torch.equal(k, want_k) and torch.equal(v, want_v)
    flat_k, flat_v = k_cache.view(-1, kv_heads, d), v_cache.view(-1, kv_heads, d)
    keep = slots >= 0
    assert torch.equal(flat_k[slots[keep]], want_k[keep]) and torch.equal(flat_v[slots[keep]], want_v[keep])
    untouched = torch.ones(blocks * bs, dtype=torch.bool)
    untouched[slots[keep]] = False
    assert flat_k[untouched].isnan().all() and flat_v[untouched].isnan().all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,n", [(1, 40), (32, 1536), (5, 17)])
def test_silu_and_mul_matches_torch(dtype, rows, n):
    gen = torch.Generator().manual_seed(rows + n)
    gate_up = (torch.randn(rows, 2 * n, generator=gen) * 4).to(dtype)
    gate_up[0, :3] = torch.tensor([-100.0, 100.0, 0.0]).to(dtype)  # exp over/underflow at the extremes
    want = F.silu(gate_up[:, :n]) * gate_up[:, n:]
    got = cpu_ops.silu_and_mul(gate_up)
    assert got.dtype == dtype and got.shape == want.shape
    assert ulps_apart(got, want) <= (4 if dtype == torch.float32 else 1)  # a vector exp: last bits differ

