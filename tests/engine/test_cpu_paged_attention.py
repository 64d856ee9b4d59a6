"""The C decode kernel against a float64 reference computed from gathered blocks."""

from __future__ import annotations

import pytest
import torch

from hetero_infer.worker import cpu_paged_attention


def reference(q, k_cache, v_cache, tables, lens, scale):
    out = torch.empty(q.shape, dtype=torch.float64)
    bs = k_cache.shape[1]
    group = q.shape[1] // k_cache.shape[2]
    for b in range(q.shape[0]):
        n = int(lens[b])
        slots = [int(tables[b, p // bs]) * bs + p % bs for p in range(n)]
        k = k_cache.reshape(-1, *k_cache.shape[2:])[slots].double().repeat_interleave(group, dim=1)  # [n, H, D]
        v = v_cache.reshape(-1, *v_cache.shape[2:])[slots].double().repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,nhd->hn", q[b].double(), k) * scale
        out[b] = torch.einsum("hn,nhd->hd", scores.softmax(-1), v)
    return out


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (8, 2), (16, 2), (9, 3)])  # GQA ratios 1, 4, 8
@pytest.mark.parametrize("block_size", [1, 5, 16, 32])
@pytest.mark.parametrize("d", [40, 64, 128])  # 64 and 128 take the AVX-512 path where the CPU has it
def test_matches_float64_reference(dtype, tol, heads, kv_heads, block_size, d):
    assert cpu_paged_attention.available(), "the C kernel must build on these machines"
    gen = torch.Generator().manual_seed(heads * 100 + block_size + d)
    num_blocks = 64
    k_cache = torch.randn(num_blocks, block_size, kv_heads, d, generator=gen).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, d, generator=gen).to(dtype)
    lens = torch.tensor([1, 7, 16, 17, 33, 2 * block_size, 61 // block_size * block_size + 1, 300], dtype=torch.int32)
    lens = lens.clamp(max=num_blocks * block_size // 8)
    max_blocks = int(-(-lens.max() // block_size))
    tables = torch.stack([torch.randperm(num_blocks, generator=gen)[:max_blocks] for _ in lens]).int()
    q = torch.randn(len(lens), heads, d, generator=gen).to(dtype)
    out = cpu_paged_attention.paged_decode(q, k_cache, v_cache, tables, lens, d**-0.5)
    assert out.dtype == dtype and out.shape == q.shape
    torch.testing.assert_close(out.double(), reference(q, k_cache, v_cache, tables, lens, d**-0.5), atol=tol, rtol=tol)


def test_disabled_by_environment(monkeypatch):
    monkeypatch.setenv("HETERO_INFER_CPU_KERNEL", "0")
    assert not cpu_paged_attention.available()
