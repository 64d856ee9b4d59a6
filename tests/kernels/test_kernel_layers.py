"""RMSNorm (+ residual), rotary embedding (+ cos/sin cache), SiLU-and-mul."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from kernel_testing import DTYPES, assert_close, poison, randn, strided_view

from hetero_infer import kernels
from hetero_infer.kernels import reference

gpu = pytest.mark.gpu


def _one_ulp_or_equal(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> None:
    """Equal, except bfloat16 under Triton's interpreter (which truncates on float32 ->
    bfloat16 casts instead of rounding): then within one bfloat16 ulp."""
    a, b = a.cpu(), b.cpu()
    if dtype == torch.bfloat16 and not a.is_cuda and kernels.interpret_mode():
        diff = (a.float() - b.float()).abs()
        assert bool((diff <= b.float().abs() * 2**-7 + 1e-30).all())
    else:
        assert torch.equal(a, b)


# --------------------------------------------------------------------------- RMSNorm

RMS_SHAPES = [
    pytest.param((5, 96), id="5x96"),
    pytest.param((3, 1000), id="3x1000"),
    pytest.param((1, 576), id="1x576"),
    pytest.param((4, 3, 64), id="qk-norm-3d"),
    pytest.param((4096, 4096), id="4096x4096", marks=gpu),
    pytest.param((77, 8192), id="77x8192", marks=gpu),
    pytest.param((8192, 9, 128), id="qk-norm-large", marks=gpu),
]


def _rms_oracle(x, w, eps):
    xd = x.double()
    return xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps) * w.double()


@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", RMS_SHAPES)
def test_rms_norm_triton(shape, dtype, with_residual, device, triton_backend):
    x = randn(*shape, dtype=dtype, device=device, scale=3.0)
    w = randn(shape[-1], dtype=dtype, device=device) + 1.0
    eps = 1e-5
    out = poison(torch.empty_like(x))
    if with_residual:
        r = randn(*shape, dtype=dtype, device=device)
        r_out = poison(torch.empty_like(x))
        y, s = kernels.rms_norm(x, w, eps, r, out=out, residual_out=r_out)
        assert y is out and s is r_out
        _one_ulp_or_equal(s, (x.float() + r.float()).to(dtype), dtype)
        ref_in = s
    else:
        y = kernels.rms_norm(x, w, eps, out=out)
        assert y is out
        ref_in = x
    # the oracle normalizes the (rounded) residual sum, like the kernel and HF
    assert_close(y, _rms_oracle(ref_in.cpu(), w.cpu(), eps), dtype, scale=1.5, what="rms_norm")


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_float32_weight_and_alloc(dtype, device, triton_backend):
    x = randn(6, 200, dtype=dtype, device=device)
    w = randn(200, dtype=torch.float32, device=device)
    y = kernels.rms_norm(x, w, 1e-6)
    assert y.dtype == dtype and y.shape == x.shape
    assert_close(y, _rms_oracle(x.cpu(), w.cpu(), 1e-6), dtype, scale=1.5, what="rms_norm f32 weight")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rms_norm_reference_is_hf_llama_rmsnorm(dtype):
    """The reference rounds exactly like transformers' LlamaRMSNorm (bit for bit)."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    n = 64
    norm = LlamaRMSNorm(n, eps=1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(n) * 0.5 + 1)
    x = torch.randn(7, n).to(dtype)
    r = torch.randn(7, n).to(dtype)
    with torch.no_grad():
        assert torch.equal(reference.rms_norm(x, norm.weight, 1e-6), norm(x))
        y, s = reference.rms_norm(x, norm.weight, 1e-6, residual=r)
        assert torch.equal(s, r + x)
        assert torch.equal(y, norm(r + x))


# --------------------------------------------------------------------------- rotary


def _hf_config(head_dim, rope_parameters, max_pos=4096):
    from transformers import LlamaConfig

    return LlamaConfig(
        hidden_size=head_dim * 2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=head_dim,
        max_position_embeddings=max_pos,
        rope_parameters=rope_parameters,
    )


ROPE_CONFIGS = [
    pytest.param(64, 10000.0, None, id="default"),
    pytest.param(128, 1000000.0, {"rope_type": "linear", "factor": 4.0}, id="linear"),
    pytest.param(
        128,
        500000.0,
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        id="llama3",
    ),
    pytest.param(
        64,
        10000.0,
        {
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 1024,
        },
        id="llama3-3.2-style",
    ),
]


@pytest.mark.parametrize("head_dim,theta,scaling", ROPE_CONFIGS)
def test_cos_sin_cache_matches_transformers(head_dim, theta, scaling):
    """Exact (float32, bit for bit) agreement with transformers' Llama rotary embedding."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    params = {"rope_type": "default", "rope_theta": theta}
    if scaling:
        params = {**scaling, "rope_theta": theta}
    config = _hf_config(head_dim, params)
    max_pos = 3000
    cache = kernels.compute_cos_sin_cache(head_dim, max_pos, theta, scaling, dtype=torch.float32)
    assert cache.shape == (max_pos, head_dim) and cache.dtype == torch.float32
    inv = kernels.compute_inv_freq(head_dim, theta, scaling)
    if scaling:
        hf_inv, attn_factor = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](config, None)
        assert attn_factor == 1.0
        assert torch.equal(inv, hf_inv)
    rope = LlamaRotaryEmbedding(config)
    assert torch.equal(inv, rope.inv_freq)
    pos = torch.arange(max_pos)[None]
    cos, sin = rope(torch.zeros(1, max_pos, head_dim), pos)
    half = head_dim // 2
    assert torch.equal(cache[:, :half], cos[0, :, :half]) and torch.equal(cache[:, :half], cos[0, :, half:])
    assert torch.equal(cache[:, half:], sin[0, :, :half]) and torch.equal(cache[:, half:], sin[0, :, half:])


def test_rope_scaling_errors():
    with pytest.raises(ValueError, match="unsupported rope"):
        kernels.compute_cos_sin_cache(64, 10, 10000.0, {"rope_type": "yarn", "factor": 2.0})
    with pytest.raises(ValueError, match="low_freq_factor"):
        kernels.compute_cos_sin_cache(64, 10, 10000.0, {"rope_type": "llama3", "factor": 8.0})
    # the older "type" key and an explicit default are accepted
    a = kernels.compute_cos_sin_cache(64, 10, 10000.0, {"type": "linear", "factor": 2.0})
    b = kernels.compute_cos_sin_cache(64, 10, 10000.0, {"rope_type": "linear", "factor": 2.0})
    assert torch.equal(a, b)


def _rope_oracle(positions, x, cache):
    rot = cache.shape[1]
    half = rot // 2
    cs = cache.cpu().double()[positions.long().cpu()]
    cos, sin = cs[:, None, :half], cs[:, None, half:]
    xd = x.cpu().double()
    out = xd.clone()
    x1, x2 = xd[..., :half], xd[..., half:rot]
    out[..., :half] = x1 * cos - x2 * sin
    out[..., half:rot] = x2 * cos + x1 * sin
    return out


ROPE_SHAPES = [
    pytest.param((7, 4, 2, 64, 64), id="gqa"),
    pytest.param((3, 9, 3, 64, 32), id="partial-rotary"),
    pytest.param((5, 2, 2, 80, 80), id="hd80"),
    pytest.param((4096, 32, 8, 128, 128), id="large", marks=gpu),
]


@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", ROPE_SHAPES)
def test_rotary_triton(shape, dtype, inplace, device, triton_backend):
    t, h, kvh, d, rot = shape
    cache = kernels.compute_cos_sin_cache(rot, 5000, 10000.0, device=device)
    positions = torch.randint(0, 5000, (t,), device=device)
    q = strided_view(randn(t, h, d, dtype=dtype, device=device))
    k = randn(t, kvh, d, dtype=dtype, device=device)
    q0, k0 = q.clone(), k.clone()
    want_q, want_k = _rope_oracle(positions, q, cache), _rope_oracle(positions, k, cache)
    if inplace:
        qo, ko = kernels.rotary_embedding(positions, q, k, cache, inplace=True)
        assert qo is q and ko is k
    else:
        q_out = poison(torch.empty_like(q0))
        qo, ko = kernels.rotary_embedding(positions, q, k, cache, q_out=q_out)
        assert qo is q_out
        assert torch.equal(q, q0) and torch.equal(k, k0), "out-of-place rotary modified its inputs"
    assert_close(qo, want_q, dtype, what="rotary q")
    assert_close(ko, want_k, dtype, what="rotary k")


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
def test_rotary_q_only_int32_positions(cache_dtype, device, triton_backend):
    cache = kernels.compute_cos_sin_cache(32, 100, 10000.0, dtype=cache_dtype, device=device)
    positions = torch.randint(0, 100, (6,), device=device, dtype=torch.int32)
    q = randn(6, 3, 32, dtype=torch.float16, device=device)
    qo, ko = kernels.rotary_embedding(positions, q, None, cache)
    assert ko is None
    assert_close(qo, _rope_oracle(positions, q, cache), torch.float16, what="rotary q-only")


def test_rotary_reference_matches_hf_apply(device):
    """The reference equals transformers' apply_rotary_pos_emb in float32 (to rounding)."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    d = 64
    cache = kernels.compute_cos_sin_cache(d, 200, 10000.0)
    pos = torch.randint(0, 200, (9,))
    q = torch.randn(9, 4, d)
    k = torch.randn(9, 2, d)
    qo, ko = reference.rotary_embedding(pos, q, k, cache)
    cos = torch.cat([cache[pos, : d // 2]] * 2, dim=-1)
    sin = torch.cat([cache[pos, d // 2 :]] * 2, dim=-1)
    hq, hk = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos[None], sin[None])
    torch.testing.assert_close(qo, hq[0].transpose(0, 1), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ko, hk[0].transpose(0, 1), rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------- SiLU and mul

SILU_SHAPES = [
    pytest.param((5, 96), id="5x96"),
    pytest.param((3, 2000), id="3x2000"),
    pytest.param((2, 3, 128), id="3d"),
    pytest.param((4096, 2 * 14336), id="llama8b", marks=gpu),
    pytest.param((1, 2 * 1536), id="one-token", marks=gpu),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SILU_SHAPES)
def test_silu_and_mul_triton(shape, dtype, device, triton_backend):
    x = randn(*shape, dtype=dtype, device=device, scale=2.0)
    out = poison(torch.empty((*shape[:-1], shape[-1] // 2), dtype=dtype, device=device))
    y = kernels.silu_and_mul(x, out=out)
    assert y is out
    xd = x.cpu().double()
    i = shape[-1] // 2
    want = F.silu(xd[..., :i]) * xd[..., i:]
    assert_close(y, want, dtype, what="silu_and_mul")
    y2 = kernels.silu_and_mul(x)
    assert torch.equal(y2.cpu(), y.cpu())
