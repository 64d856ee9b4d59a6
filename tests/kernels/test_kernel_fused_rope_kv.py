"""`rotary_and_write_kv` (q/k norm, rotary and the KV write in one kernel) against the unfused kernels it
replaces, run one after the other on the same inputs."""

from __future__ import annotations

import pytest
import torch
from kernel_testing import DTYPES, poison, randn

from hetero_infer import kernels

# (tokens, q heads, kv heads, head dim, rotary width): Qwen3/Llama-like GQA, an odd head count, partial rotary
SHAPES = [(5, 4, 2, 32, 32), (3, 6, 3, 24, 16), (7, 16, 8, 128, 128)]


def _unfused(positions, q, k, v, cache, k_cache, v_cache, slots, qw, kw, eps):
    if qw is not None:
        q, k = kernels.rms_norm(q, qw, eps), kernels.rms_norm(k, kw, eps)
    q, k = kernels.rotary_embedding(positions, q, k, cache)
    kernels.write_kv_cache(k, v, k_cache, v_cache, slots)
    return q


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.view({4: torch.int32, 2: torch.int16}[x.element_size()])


def _ulps(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> float:
    """Largest difference in units of the dtype's spacing at the magnitude of b's head (the rotation's
    differences cancel: an error in an operand is relative to the head's values, not to the result's)."""
    spacing = torch.finfo(dtype).eps * b.float().abs().amax(-1, keepdim=True).clamp_min(torch.finfo(dtype).tiny)
    return float(((a.float() - b.float()).abs() / spacing).max()) if a.numel() else 0.0


@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_fused_equals_the_unfused_kernels(shape, dtype, norm, device, triton_backend):
    t, h, kvh, d, rot = shape
    page, blocks = 4, 16
    cache = kernels.compute_cos_sin_cache(rot, 3000, 10000.0, device=device)
    positions = torch.randint(0, 3000, (t,), device=device)
    qkv = randn(t, (h + 2 * kvh) * d, dtype=dtype, device=device)  # the fused projection's output, as the model has it
    q = qkv[:, : h * d].view(t, h, d)
    k = qkv[:, h * d : (h + kvh) * d].view(t, kvh, d)
    v = qkv[:, (h + kvh) * d :].view(t, kvh, d)
    qw = kw = None
    if norm:
        qw, kw = randn(d, dtype=dtype, device=device), randn(d, dtype=dtype, device=device)
    slots = torch.randperm(blocks * page, device=device)[:t]
    slots[t // 2] = -1  # a padding row: nothing written
    want_k, want_v = poison(torch.empty(blocks, page, kvh, d, dtype=dtype, device=device)), None
    want_v = poison(torch.empty_like(want_k))
    got_k, got_v = want_k.clone(), want_v.clone()
    qkv0 = qkv.clone()
    want_q = _unfused(positions, q, k, v, cache, want_k, want_v, slots, qw, kw, 1e-6)
    q_out = poison(torch.empty(t, h, d, dtype=dtype, device=device))
    got_q = kernels.rotary_and_write_kv(positions, q, k, v, cache, got_k, got_v, slots, q_norm_weight=qw,
                                        k_norm_weight=kw, eps=1e-6, q_out=q_out)
    assert got_q is q_out
    assert torch.equal(qkv, qkv0), "the fused kernel modified its inputs"
    assert torch.equal(_bits(got_v), _bits(want_v))  # v is copied, never rounded; untouched slots keep their NaN
    # The norm's sum of squares may be added in another order: where the rstd differs in its last float32 bit,
    # each of the three roundings after it (norm, weight, rotation) may land one step apart. Without the norm the
    # operations are the same, but a GPU compiler may contract the rotation's x*cos - y*sin into a fused
    # multiply-add in one kernel and not the other (seen on an H100 at head dim 128): one rounding, one step.
    bound = 3.0 if norm else 1.0
    assert _ulps(got_q, want_q, dtype) <= bound
    written = slots[slots >= 0]
    assert _ulps(got_k.view(-1, kvh, d)[written], want_k.view(-1, kvh, d)[written], dtype) <= bound
    untouched = torch.ones(blocks * page, dtype=torch.bool, device=device)
    untouched[written] = False
    assert torch.equal(_bits(got_k.view(-1, kvh, d)[untouched]), _bits(want_k.view(-1, kvh, d)[untouched]))


def test_reference_path_equals_the_unfused_reference(device):
    t, h, kvh, d = 4, 4, 2, 16
    cache = kernels.compute_cos_sin_cache(d, 100, 10000.0, device=device)
    positions = torch.arange(t, device=device)
    f32 = torch.float32
    q, k, v = (randn(t, h, d, dtype=f32, device=device), randn(t, kvh, d, dtype=f32, device=device),
               randn(t, kvh, d, dtype=f32, device=device))
    qw, kw = randn(d, dtype=f32, device=device), randn(d, dtype=f32, device=device)
    slots = torch.arange(t, device=device)
    want_k, want_v = torch.zeros(2, 4, kvh, d, device=device), torch.zeros(2, 4, kvh, d, device=device)
    got_k, got_v = want_k.clone(), want_v.clone()
    with kernels.use_backend("reference"):
        want_q = _unfused(positions, q, k, v, cache, want_k, want_v, slots, qw, kw, 1e-5)
        got_q = kernels.rotary_and_write_kv(positions, q, k, v, cache, got_k, got_v, slots, q_norm_weight=qw,
                                            k_norm_weight=kw, eps=1e-5)
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k) and torch.equal(got_v, want_v)


def test_bad_arguments_are_refused_and_change_nothing(device):
    t, h, kvh, d = 2, 4, 2, 16
    cache = kernels.compute_cos_sin_cache(d, 10, 10000.0, device=device)
    f32 = torch.float32
    q, k, v = (randn(t, h, d, dtype=f32, device=device), randn(t, kvh, d, dtype=f32, device=device),
               randn(t, kvh, d, dtype=f32, device=device))
    k_cache, v_cache = torch.zeros(2, 4, kvh, d, device=device), torch.zeros(2, 4, kvh, d, device=device)
    pos, slots = torch.arange(t, device=device), torch.arange(t, device=device)
    with pytest.raises(ValueError, match="go together"):
        kernels.rotary_and_write_kv(pos, q, k, v, cache, k_cache, v_cache, slots, q_norm_weight=randn(d, dtype=f32,
                                                                                                      device=device))
    with pytest.raises(ValueError, match="one entry per token"):
        kernels.rotary_and_write_kv(pos[:1], q, k, v, cache, k_cache, v_cache, slots)
    with pytest.raises(TypeError, match="one dtype"):
        kernels.rotary_and_write_kv(pos, q, k, v, cache, k_cache.half(), v_cache.half(), slots)
    with pytest.raises(ValueError, match="heads"):
        kernels.rotary_and_write_kv(pos, q, k[:, :1], v[:, :1], cache, k_cache, v_cache, slots)
    assert not k_cache.any() and not v_cache.any()
