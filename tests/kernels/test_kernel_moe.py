"""The fused MoE layer (kernels.fused_moe, kernels.moe_routing): the Triton grouped GEMM (the interpreter here),
the CPU path (sorted pairs, torch's grouped GEMM) and the reference, each against a naive float64 oracle written
here (a loop over tokens and their experts); float, INT8 and INT4 experts; the routing against transformers'."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hetero_infer import kernels
from hetero_infer.kernels import _backend, moe, reference
from hetero_infer.kernels.cpu import moe as cpu_moe
from hetero_infer.kernels.cpu import native
from tests.kernels.kernel_testing import DTYPES, assert_close


def naive_moe(x, w1, w2, weights, ids) -> torch.Tensor:
    """float64, one (token, expert) pair at a time: the definition."""
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            h = w1[e].double().cpu() @ x[t].double().cpu()
            i = h.shape[0] // 2
            out[t] += float(weights[t, j]) * (w2[e].double().cpu() @ (F.silu(h[:i]) * h[i:]))
    return out


def make_case(t, h, i, e, k, dtype, device, method="float", group=32):
    x = (torch.randn(t, h) * 0.5).to(device, dtype)
    w1 = (torch.randn(e, 2 * i, h) * h**-0.5).to(device, dtype)
    w2 = (torch.randn(e, h, i) * i**-0.5).to(device, dtype)
    weights, ids = kernels.moe_routing(torch.randn(t, e, device=device), k, renormalize=bool(k % 2))
    if method == "float":
        return x, w1, w2, w1, w2, weights, ids
    q1, q2 = quantized(w1.float(), method, group), quantized(w2.float(), method, group)
    return x, q1, q2, q1.dequantized(), q2.dequantized(), weights, ids


def quantized(w: torch.Tensor, method: str, group: int) -> kernels.ExpertWeights:
    e, n, k = w.shape
    rows = w.reshape(e * n, k)
    if method == "int8":
        q, s = kernels.quantize_int8(rows)
        return kernels.ExpertWeights(q.reshape(e, n, k), s.reshape(e, n))
    q, s, z = kernels.quantize_int4(rows, group)
    return kernels.ExpertWeights(q.reshape(e, n, k // 2), s.reshape(e, n, -1), z.reshape(e, n, -1), group)


# (tokens, hidden, intermediate, experts, top-k): decode-sized and prefill-sized steps, 4-16 experts, top-k 1-4;
# hidden/intermediate not multiples of the tiles (72, 40) as well as multiples
SHAPES = [(1, 64, 32, 4, 1), (7, 64, 32, 8, 2), (33, 72, 40, 16, 4), (20, 128, 64, 6, 3)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("path", ["triton", "cpu", "reference"])
def test_fused_moe_matches_oracle(device, path, shape, dtype):
    if path != "triton" and device.type == "cuda":
        pytest.skip("the CPU path and the reference are checked on the CPU")
    x, w1, w2, d1, d2, weights, ids = make_case(*shape, dtype, device)
    backend = {"triton": "triton", "cpu": "auto", "reference": "reference"}[path]
    with kernels.use_backend(backend):
        out = kernels.fused_moe(x, w1, w2, weights, ids)
    assert out.dtype == dtype and out.shape == x.shape
    # two roundings to the dtype inside (after gate|up and after the activation) on top of the output's own
    assert_close(out, naive_moe(x, d1, d2, weights, ids), dtype, scale=4, what=f"{path} fused_moe")


@pytest.mark.parametrize("method", ["int8", "int4"])
@pytest.mark.parametrize("shape", [(5, 64, 32, 4, 2), (18, 64, 64, 8, 4)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("path", ["triton", "cpu", "reference"])
def test_quantized_experts_match_oracle(device, path, shape, method):
    if path != "triton" and device.type == "cuda":
        pytest.skip("the CPU path and the reference are checked on the CPU")
    dtype = torch.bfloat16
    x, q1, q2, d1, d2, weights, ids = make_case(*shape, dtype, device, method)
    backend = {"triton": "triton", "cpu": "auto", "reference": "reference"}[path]
    with kernels.use_backend(backend):
        out = kernels.fused_moe(x, q1, q2, weights, ids)
    assert_close(out, naive_moe(x, d1, d2, weights, ids), dtype, scale=4, what=f"{path} {method} fused_moe")


def test_cpu_path_is_the_grouped_gemm_and_matches_the_reference(monkeypatch):
    """On the CPU `auto` takes the grouped path (not the reference) past a decode step's tokens, float32 within
    rounding of the reference."""
    x, w1, w2, _, _, weights, ids = make_case(cpu_moe.MAX_TOKENS + 1, 64, 32, 8, 2, torch.float32, "cpu")
    calls = []
    monkeypatch.setattr(moe, "grouped_moe", lambda *a: calls.append(1) or reference.fused_moe(*a))
    with kernels.use_backend("auto"):
        kernels.fused_moe(x, w1, w2, weights, ids)
    assert calls == [1]
    monkeypatch.undo()
    ew1, ew2 = kernels.ExpertWeights(w1), kernels.ExpertWeights(w2)
    torch.testing.assert_close(moe.grouped_moe(x, ew1, ew2, weights, ids),
                               reference.fused_moe(x, ew1, ew2, weights, ids), atol=1e-6, rtol=1e-5)


@pytest.mark.skipif(native.library() is None, reason="no C compiler: the CPU path is the grouped GEMM everywhere")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape", [(1, 64, 32, 4, 1), (8, 72, 40, 16, 4), (cpu_moe.MAX_TOKENS, 128, 64, 64, 8),
                                   (3, 1024, 384, 64, 8)], ids=lambda s: "x".join(map(str, s)))
def test_cpu_decode_kernel_is_the_grouped_path_within_rounding(monkeypatch, shape, dtype):
    """A decode step's tokens (up to MAX_TOKENS) on float experts take the C kernel (kernels/cpu/moe.py), which
    computes what the grouped path computes: float32 to its accumulation order, bfloat16 within one rounding;
    HETERO_INFER_CPU_MOE=0 turns it off."""
    x, w1, w2, _, _, weights, ids = make_case(*shape, dtype, "cpu")
    calls = []
    kernel = cpu_moe.moe_experts
    monkeypatch.setattr(cpu_moe, "moe_experts", lambda *a: calls.append(1) or kernel(*a))
    with kernels.use_backend("auto"):
        out = kernels.fused_moe(x, w1, w2, weights, ids)
    assert calls == [1] and out.dtype == dtype
    grouped = moe.grouped_moe(x, kernels.ExpertWeights(w1), kernels.ExpertWeights(w2), weights, ids)
    if dtype == torch.float32:
        torch.testing.assert_close(out, grouped, atol=1e-6, rtol=1e-5)
    else:
        assert_close(out, grouped, dtype, scale=2, what="C moe vs grouped")
    monkeypatch.setenv("HETERO_INFER_CPU_MOE", "0")
    with kernels.use_backend("auto"):
        kernels.fused_moe(x, w1, w2, weights, ids)
    assert calls == [1]


def test_align_pads_each_expert_to_whole_tiles_and_shapes_do_not_depend_on_routing():
    from hetero_infer.kernels._triton_moe import moe_align

    block = 4
    ids_a = torch.tensor([[0, 3], [3, 1], [3, 0], [2, 3], [3, 1]], dtype=torch.int32)
    ids_b = torch.zeros_like(ids_a)  # every pair to expert 0 (but top-k distinct in practice; any ids here)
    sorted_a, tiles_a, padded_a = moe_align(ids_a, 5, block)
    sorted_b, tiles_b, padded_b = moe_align(ids_b, 5, block)
    assert sorted_a.shape == sorted_b.shape and tiles_a.shape == tiles_b.shape
    pairs = ids_a.numel()
    n = int(padded_a)
    assert n % block == 0 and n == sum(-(-c // block) * block for c in torch.bincount(ids_a.flatten()).tolist())
    real = sorted_a[:n]
    assert sorted(real[real < pairs].tolist()) == list(range(pairs))  # each pair once
    assert (sorted_a[n:] == pairs).all()
    for tile in range(n // block):  # every pair in a tile belongs to the tile's expert
        members = real[tile * block:(tile + 1) * block]
        members = members[members < pairs].long()
        assert (ids_a.flatten()[members] == tiles_a[tile]).all() and members.numel() > 0


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
@pytest.mark.parametrize("top_k", [1, 2, 4])
def test_routing_matches_transformers(family, top_k):
    from transformers import MixtralConfig, Qwen3MoeConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralTopKRouter
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    for norm in ([True, False] if family == "qwen3_moe" else [True]):
        if family == "qwen3_moe":
            router = Qwen3MoeTopKRouter(Qwen3MoeConfig(hidden_size=32, num_experts=8, num_experts_per_tok=top_k,
                                                       norm_topk_prob=norm))
        else:
            router = MixtralTopKRouter(MixtralConfig(hidden_size=32, num_local_experts=8, num_experts_per_tok=top_k))
        torch.nn.init.normal_(router.weight)
        x = torch.randn(11, 32)
        _, hf_weights, hf_ids = router(x)
        weights, ids = kernels.moe_routing(F.linear(x, router.weight), top_k, norm)
        assert torch.equal(ids.long(), hf_ids) and torch.equal(weights, hf_weights.float())


def test_argument_errors():
    x, w1, w2, _, _, weights, ids = make_case(3, 64, 32, 4, 2, torch.float32, "cpu")
    with pytest.raises(ValueError, match=r"top_k must be an integer in \[1, 4\]"):
        kernels.moe_routing(torch.randn(3, 4), 5, True)
    with pytest.raises(ValueError, match=r"w1 must be \[E, 2I, H\]"):
        kernels.fused_moe(x, w2, w1, weights, ids)
    with pytest.raises(TypeError, match="w1 has dtype"):
        kernels.fused_moe(x, w1.double(), w2, weights, ids)
    with pytest.raises(ValueError, match=r"topk_ids must lie in \[0, 4\)"):
        kernels.fused_moe(x, w1, w2, weights, ids + 3)
    with pytest.raises(ValueError, match="both be"):
        kernels.fused_moe(x, w1, w2, weights[:, :1], ids)
    with pytest.raises(TypeError, match="topk_ids has dtype"):
        kernels.fused_moe(x, w1, w2, weights, ids.float())
    with pytest.raises(ValueError, match=r"scales must be \[E, N\]"):
        q = quantized(w1, "int8", 32)
        kernels.fused_moe(x, q._replace(scales=q.scales[:, :3]), w2, weights, ids)
    with pytest.raises(ValueError, match="group_size must be one of"):
        kernels.fused_moe(x, quantized(w1, "int4", 32)._replace(group_size=48), w2, weights, ids)


def test_triton_module_is_listed():
    assert "_triton_moe" in _backend.TRITON_MODULES
