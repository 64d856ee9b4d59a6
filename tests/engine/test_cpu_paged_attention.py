"""The C decode kernel against a float64 reference computed from gathered blocks; the CPU attention backend
against the PyTorch reference backend; which backend is chosen."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hetero_infer.kernels.cpu import paged_attention as cpu_paged_attention


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


def _mixed_step(dtype, block_size=4, heads=4, kv_heads=2, d=64):
    """Two decodes, prefill chunks over a cached prefix and fresh prompts, small and large (with the SDPA threshold
    of the test below: the paged kernel, or SDPA over the gathered blocks, the small ones' rows on both sides of a
    large one's), over a
    cache already holding the cached tokens, with rotary tables of a Llama config: (batch, rope, q, k, v, k_cache,
    v_cache)."""
    from transformers import LlamaConfig

    from hetero_infer.worker.runner.attention import SeqSpan, StepBatch
    from hetero_infer.worker.runner.models.rotary import RotaryEmbedding

    gen = torch.Generator().manual_seed(7)
    config = LlamaConfig(hidden_size=heads * d, num_attention_heads=heads, num_key_value_heads=kv_heads)
    rope = RotaryEmbedding.from_config(config, 64, dtype, "cpu")
    # (cached tokens, new tokens, is_prefill): decodes first, as the scheduler orders them
    shapes = [(6, 1, False), (19, 1, False), (5, 6, True), (9, 10, True), (0, 4, True), (0, 12, True)]
    blocks = torch.randperm(32, generator=gen).tolist()
    spans, positions, slots = [], [], []
    for start, n, prefill in shapes:
        nblocks = -(-(start + n) // block_size)
        table, blocks = blocks[:nblocks], blocks[nblocks:]
        spans.append(SeqSpan(table, start, n, prefill))
        for p in range(start, start + n):
            positions.append(p)
            slots.append(table[p // block_size] * block_size + p % block_size)
    batch = StepBatch(spans, np.array(positions, dtype=np.int64), np.array(slots, dtype=np.int64), block_size)
    t = len(positions)
    qkv = torch.randn(t, (heads + 2 * kv_heads) * d, generator=gen).to(dtype)
    q = qkv[:, : heads * d].view(t, heads, d)
    k = qkv[:, heads * d : (heads + kv_heads) * d].view(t, kv_heads, d)
    v = qkv[:, (heads + kv_heads) * d :].view(t, kv_heads, d)
    k_cache = torch.randn(32, block_size, kv_heads, d, generator=gen).to(dtype)  # the cached prefixes, and junk
    v_cache = torch.randn(32, block_size, kv_heads, d, generator=gen).to(dtype)
    return batch, rope, q, k, v, k_cache, v_cache


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_cpu_backend_matches_reference_backend_on_a_mixed_step(dtype, tol):
    from hetero_infer.worker.runner.attention import CpuBackend, TorchBackend

    batch, rope, q, k, v, k_cache, v_cache = _mixed_step(dtype)
    outs, caches = [], []
    # from 60 pairs: chunks of 145 and 78 pairs take SDPA, of 51 and 10 not
    for backend in (TorchBackend(rope, "cpu"), CpuBackend(rope, sdpa_min_pairs=60)):
        kc, vc = k_cache.clone(), v_cache.clone()
        qkv = torch.cat((q, k, v), dim=1).clone()  # the C path rotates q and k in place
        h, kvh = q.shape[1], k.shape[1]
        meta = backend.prepare(batch)
        if isinstance(backend, CpuBackend):
            assert [(p.start, p.num_tokens) for p in meta.prefills] == [(9, 10), (0, 12)]
        outs.append(backend.attention(qkv[:, :h], qkv[:, h : h + kvh], qkv[:, h + kvh :], (kc, vc), meta, 0.125))
        caches.append((kc, vc))
    torch.testing.assert_close(outs[1].float(), outs[0].float(), atol=tol, rtol=tol)
    # the same rotated keys and values landed in the same slots, and nothing else was written
    torch.testing.assert_close(caches[1][0], caches[0][0], atol=tol, rtol=tol)
    assert torch.equal(caches[1][1], caches[0][1])
    assert not torch.equal(caches[0][0], k_cache)


def test_backend_selection(monkeypatch):
    from hetero_infer.worker.runner.attention import CpuBackend, TorchBackend, select_backend

    _, rope, *_ = _mixed_step(torch.float32)
    cpu = torch.device("cpu")
    assert isinstance(select_backend(cpu, torch.float32, rope), CpuBackend)
    assert isinstance(select_backend(cpu, torch.bfloat16, rope), CpuBackend)
    assert isinstance(select_backend(cpu, torch.float16, rope), TorchBackend)  # no C kernels for float16
    monkeypatch.setenv("HETERO_INFER_CPU_KERNEL", "0")
    assert isinstance(select_backend(cpu, torch.float32, rope), TorchBackend)
