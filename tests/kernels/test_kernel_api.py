"""Public API of hetero_infer.kernels: exports, backend selection and argument errors."""

from __future__ import annotations

import pytest
import torch

from hetero_infer import kernels
from hetero_infer.kernels import _backend


def test_exports():
    for name in kernels.__all__:
        assert hasattr(kernels, name), name
    from hetero_infer.kernels import reference

    for name in (
        "paged_attention_decode",
        "paged_attention_prefill",
        "write_kv_cache",
        "rms_norm",
        "rotary_embedding",
        "silu_and_mul",
        "int8_matmul",
        "int4_matmul",
        "top_k_top_p_filter",
    ):
        assert callable(getattr(reference, name))
        assert getattr(kernels, name).__doc__


def test_backend_switch():
    before = kernels.get_backend()
    with kernels.use_backend("reference"):
        assert kernels.get_backend() == "reference"
        with kernels.use_backend("TRITON"):
            assert kernels.get_backend() == "triton"
        assert kernels.get_backend() == "reference"
    assert kernels.get_backend() == before
    with pytest.raises(ValueError, match="unknown kernel backend"):
        kernels.set_backend("cuda")
    with pytest.raises(ValueError, match="unknown kernel backend"):
        _backend._parse("fast")


def test_auto_on_cpu_uses_reference(monkeypatch):
    from hetero_infer.kernels import _triton_ops

    def boom(*a, **k):
        raise AssertionError("Triton path taken for CPU tensors under 'auto'")

    monkeypatch.setattr(_triton_ops, "silu_and_mul", boom)
    x = torch.randn(3, 8)
    with kernels.use_backend("auto"):
        if not x.is_cuda:
            kernels.silu_and_mul(x)
    with kernels.use_backend("triton"), pytest.raises(AssertionError, match="Triton path"):
        kernels.silu_and_mul(x)


def test_forced_triton_on_cpu_needs_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with kernels.use_backend("triton"), pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        kernels.silu_and_mul(torch.randn(2, 4))


def _attn_args(dtype=torch.float16, b=2, h=4, kvh=2, d=32):
    q = torch.randn(b, h, d).to(dtype)
    kc = torch.randn(6, 16, kvh, d).to(dtype)
    vc = torch.randn(6, 16, kvh, d).to(dtype)
    bt = torch.zeros(b, 3, dtype=torch.int32)
    lens = torch.ones(b, dtype=torch.int32)
    return q, kc, vc, bt, lens


@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_attention_argument_errors(backend):
    q, kc, vc, bt, lens = _attn_args()
    with kernels.use_backend(backend):
        with pytest.raises(TypeError, match="q has dtype int32"):
            kernels.paged_attention_decode(q.int(), kc, vc, bt, lens, 0.1)
        with pytest.raises(TypeError, match="must equal the KV cache dtype"):
            kernels.paged_attention_decode(q.float(), kc, vc, bt, lens, 0.1)
        with pytest.raises(ValueError, match="3 dimensions"):
            kernels.paged_attention_decode(q[0], kc, vc, bt, lens, 0.1)
        with pytest.raises(ValueError, match="multiple of the KV heads"):
            kernels.paged_attention_decode(q[:, :3], kc, vc, bt, lens, 0.1)
        with pytest.raises(ValueError, match="head_dim"):
            kernels.paged_attention_decode(q[..., :16], kc, vc, bt, lens, 0.1)
        with pytest.raises(TypeError, match="block_tables has dtype float32"):
            kernels.paged_attention_decode(q, kc, vc, bt.float(), lens, 0.1)
        with pytest.raises(ValueError, match="one row per sequence"):
            kernels.paged_attention_decode(q, kc, vc, bt, lens[:1], 0.1)
        with pytest.raises(ValueError, match="match in shape and dtype"):
            kernels.paged_attention_decode(q, kc, vc[:5], bt, lens, 0.1)
        with pytest.raises(ValueError, match="one device"):
            kernels.paged_attention_decode(q, kc, vc, bt, lens.to("meta"), 0.1)
        with pytest.raises(ValueError, match="out must have shape"):
            kernels.paged_attention_decode(q, kc, vc, bt, lens, 0.1, out=torch.empty(2, 4, 31, dtype=q.dtype))
        with pytest.raises(ValueError, match="contiguous in its last dimension"):
            kernels.paged_attention_decode(q.transpose(1, 2).contiguous().transpose(1, 2), kc, vc, bt, lens, 0.1)
        with pytest.raises(TypeError, match="must be a torch.Tensor"):
            kernels.paged_attention_decode(q.tolist(), kc, vc, bt, lens, 0.1)
        # prefill
        cu = torch.tensor([0, 1, 2], dtype=torch.int32)
        with pytest.raises(ValueError, match="B\\+1=3 entries"):
            kernels.paged_attention_prefill(q, kc, vc, bt, cu[:2], lens, 0.1)
        with pytest.raises(ValueError, match="block_tables has 1 rows"):
            kernels.paged_attention_prefill(q, kc, vc, bt[:1], cu, lens, 0.1)
        # KV write
        k = torch.randn(3, 2, 32).half()
        with pytest.raises(ValueError, match="slot_mapping has 2 entries"):
            kernels.write_kv_cache(k, k, kc, vc, torch.zeros(2, dtype=torch.int64))
        with pytest.raises(TypeError, match="cache dtype"):
            kernels.write_kv_cache(k.float(), k.float(), kc, vc, torch.zeros(3, dtype=torch.int64))
        with pytest.raises(TypeError, match="slot_mapping has dtype float32"):
            kernels.write_kv_cache(k, k, kc, vc, torch.zeros(3))
        with pytest.raises(ValueError, match="cache holds"):
            kernels.write_kv_cache(k[:, :1], k[:, :1], kc, vc, torch.zeros(3, dtype=torch.int64))


def test_triton_head_dim_limit():
    q, kc, vc, bt, lens = _attn_args(d=320)
    with kernels.use_backend("triton"), pytest.raises(ValueError, match="head_dim 320"):
        kernels.paged_attention_decode(q, kc, vc, bt, lens, 0.1)
    # the reference takes it
    with kernels.use_backend("reference"):
        assert kernels.paged_attention_decode(q, kc, vc, bt, lens, 0.1).shape == q.shape


@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_layer_argument_errors(backend):
    x = torch.randn(4, 64)
    with kernels.use_backend(backend):
        with pytest.raises(ValueError, match="weight has 63 elements"):
            kernels.rms_norm(x, torch.ones(63), 1e-6)
        with pytest.raises(ValueError, match="residual must match"):
            kernels.rms_norm(x, torch.ones(64), 1e-6, residual=torch.randn(4, 64).half())
        with pytest.raises(ValueError, match="only meaningful together"):
            kernels.rms_norm(x, torch.ones(64), 1e-6, residual_out=torch.empty(4, 64))
        with pytest.raises(TypeError, match="x has dtype float64"):
            kernels.rms_norm(x.double(), torch.ones(64), 1e-6)
        with pytest.raises(ValueError, match="must be even"):
            kernels.silu_and_mul(torch.randn(3, 7))
        cache = kernels.compute_cos_sin_cache(64, 10)
        q = torch.randn(2, 4, 32)
        with pytest.raises(ValueError, match="<= head_dim 32"):
            kernels.rotary_embedding(torch.zeros(2, dtype=torch.long), q, None, cache)
        with pytest.raises(ValueError, match="positions has 3 entries"):
            kernels.rotary_embedding(torch.zeros(3, dtype=torch.long), q, None, cache[:, :32])
        with pytest.raises(TypeError, match="positions has dtype float32"):
            kernels.rotary_embedding(torch.zeros(2), q, None, cache[:, :32])
        with pytest.raises(ValueError, match="cannot be combined"):
            kernels.rotary_embedding(torch.zeros(2, dtype=torch.long), q, None, cache[:, :32], True, q_out=q)
