"""INT8 / INT4 weight-only quantization and the W8A16 / W4A16 matmuls."""

from __future__ import annotations

import pytest
import torch
from kernel_testing import DTYPES, assert_close, dot_slack, poison, randn

from hetero_infer import kernels
from hetero_infer.kernels import reference

gpu = pytest.mark.gpu


def test_int8_quantize_bounds_and_roundtrip():
    w = torch.randn(37, 300) * torch.rand(37, 1) * 4
    w[3] = 0.0  # an all-zero row
    q, s = kernels.quantize_int8(w)
    assert q.dtype == torch.int8 and s.dtype == torch.float32 and s.shape == (37,)
    assert int(q.abs().max()) == 127 and int(q.min()) >= -127
    deq = kernels.dequantize_int8(q, s)
    assert torch.all((deq - w).abs() <= s[:, None] / 2 + 1e-7)
    assert torch.all(deq[3] == 0)
    # each nonzero row uses its full range
    assert torch.all(q.abs().amax(dim=1)[w.abs().amax(dim=1) > 0] == 127)


@pytest.mark.parametrize("group_size", [32, 64, 128, 256])
def test_int4_quantize_bounds_and_roundtrip(group_size):
    n, k = 19, 512
    w = torch.randn(n, k) * 2 + torch.randn(n, 1)  # shifted rows exercise the zero point
    w[:, :group_size] = 0.5  # a constant group
    packed, scales, zeros = kernels.quantize_int4(w, group_size)
    assert packed.dtype == torch.uint8 and packed.shape == (n, k // 2)
    assert scales.shape == zeros.shape == (n, k // group_size) and zeros.dtype == torch.uint8
    assert int(zeros.max()) <= 15
    q = kernels.unpack_int4(packed, group_size)
    assert q.shape == (n, k) and int(q.max()) <= 15
    deq = kernels.dequantize_int4(packed, scales, zeros, group_size)
    step = scales.repeat_interleave(group_size, dim=1)
    assert torch.all((deq - w).abs() <= step / 2 + 1e-6)
    # zero stays exactly representable
    assert torch.all(kernels.dequantize_int4(*kernels.quantize_int4(torch.zeros(2, k), group_size), group_size) == 0)


def test_int4_packing_layout():
    """Byte i of a group holds column i (low nibble) and column i + G/2 (high nibble)."""
    g = 32
    vals = torch.arange(64) % 16
    w = vals.float()[None, :]  # one row, two groups, values 0..15 -> scale 1, zero 0
    packed, scales, zeros = reference.quantize_int4(w, g)
    assert torch.all(scales == 1) and torch.all(zeros == 0)
    for grp in range(2):
        for i in range(g // 2):
            byte = int(packed[0, grp * g // 2 + i])
            assert byte & 0xF == int(vals[grp * g + i])
            assert byte >> 4 == int(vals[grp * g + g // 2 + i])


def _group_sq_err(w, packed, scales, zeros, g):
    deq = kernels.dequantize_int4(packed, scales, zeros, g)
    return (deq - w).square().reshape(w.shape[0], -1, g).sum(-1)


@pytest.mark.parametrize("group_size", [32, 128])
def test_int4_clip_search_never_worse_than_minmax(group_size):
    """Per group, the clip search's squared error is at most min/max rounding's, and clearly lower on average."""
    torch.manual_seed(0)
    n, k = 64, 1024
    w = torch.randn(n, k) * torch.rand(n, 1)  # Gaussian rows of varied scale
    w[:8] = torch.rand(8, k) + 0.5  # all-positive groups (the range is widened to 0)
    w[8:16] = torch.distributions.StudentT(2.0).sample((8, k))  # heavy tails: outliers
    w[16, :group_size] = 0.25  # a constant group
    w[17, :group_size] = 0.0  # an all-zero group
    clip = kernels.quantize_int4(w, group_size, clip_search=True)
    minmax = kernels.quantize_int4(w, group_size)
    err_clip, err_minmax = _group_sq_err(w, *clip, group_size), _group_sq_err(w, *minmax, group_size)
    assert bool((err_clip <= err_minmax * (1 + 1e-6)).all())
    assert float(err_clip.sum()) < 0.98 * float(err_minmax.sum())
    assert float(err_clip[17, 0]) == 0.0 and torch.equal(clip[2], kernels.quantize_int4(w, group_size, clip_search=True)[2])
    assert int(clip[2].max()) <= 15 and clip[1].dtype == torch.float32


def _hessian(k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Correlated inputs with a few large channels (as in LLM activations) and their mean x x^T."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4096, k, generator=g) @ (torch.eye(k) + 0.3 * torch.randn(k, k, generator=g) / k**0.5)
    x = x * (torch.rand(k, generator=g) * 2 + 0.1)
    x[:, :4] *= 10
    return x, x.t() @ x / x.shape[0]


def _output_err(w, deq, x):
    return float((x @ (deq - w).t()).square().mean() / (x @ w.t()).square().mean())


def test_gptq_lowers_the_output_error():
    """With the inputs' Hessian, the layer-output error is below round-to-nearest's, in the same formats."""
    torch.manual_seed(1)
    w = torch.randn(96, 256)
    x, h = _hessian(256)
    packed, scales, zeros = kernels.quantize_int4(w, 64, clip_search=True, hessian=h)
    assert packed.shape == (96, 128) and scales.shape == zeros.shape == (96, 4) and int(zeros.max()) <= 15
    gptq4 = _output_err(w, kernels.dequantize_int4(packed, scales, zeros, 64), x)
    rtn4 = _output_err(w, kernels.dequantize_int4(*kernels.quantize_int4(w, 64, clip_search=True), 64), x)
    assert gptq4 < 0.8 * rtn4
    q, s = kernels.quantize_int8(w, hessian=h)
    assert q.dtype == torch.int8 and int(q.abs().max()) <= 127
    assert torch.equal(s, kernels.quantize_int8(w)[1])  # same scales, other integers
    gptq8 = _output_err(w, kernels.dequantize_int8(q, s), x)
    assert gptq8 < 0.9 * _output_err(w, kernels.dequantize_int8(*kernels.quantize_int8(w)), x)


def test_gptq_dead_inputs_and_errors():
    w = torch.randn(8, 128)
    x, h = _hessian(128)
    h[5, :] = h[:, 5] = 0.0  # an input that is always 0
    packed, scales, zeros = kernels.quantize_int4(w, 32, hessian=h)
    assert bool(torch.isfinite(kernels.dequantize_int4(packed, scales, zeros, 32)).all())
    with pytest.raises(ValueError, match=r"\[K, K\]"):
        kernels.quantize_int4(w, 32, hessian=h[:64, :64])
    with pytest.raises(ValueError, match="inf or NaN"):
        kernels.quantize_int8(w, hessian=torch.full((128, 128), float("nan")))
    with pytest.raises(TypeError, match="dtype"):
        kernels.quantize_int8(w, hessian=h.to(torch.bfloat16))


def test_quantize_errors():
    with pytest.raises(ValueError, match="multiple of group_size"):
        kernels.quantize_int4(torch.randn(4, 100))
    with pytest.raises(ValueError, match="group_size"):
        kernels.quantize_int4(torch.randn(4, 96), group_size=48)
    with pytest.raises(TypeError, match="dtype"):
        kernels.quantize_int8(torch.randint(0, 5, (4, 4)))
    with pytest.raises(ValueError, match="inf or NaN"):
        kernels.quantize_int8(torch.tensor([[1.0, float("nan")]]))
    q, s = kernels.quantize_int8(torch.randn(8, 64))
    with pytest.raises(ValueError, match="expects K=64"):
        kernels.int8_matmul(torch.randn(2, 65), q, s)
    with pytest.raises(ValueError, match="scales"):
        kernels.int8_matmul(torch.randn(2, 64), q, s[:4])
    p, sc, z = kernels.quantize_int4(torch.randn(8, 128))
    with pytest.raises(ValueError, match="K/G"):
        kernels.int4_matmul(torch.randn(2, 128), p, sc, z, group_size=64)


# (M, N, K) -- M spans decode batch sizes; N, K odd where the format allows
INT8_SHAPES = [
    pytest.param((1, 70, 200), id="m1"),
    pytest.param((5, 33, 256), id="m5"),
    pytest.param((17, 64, 130), id="m17"),
    pytest.param((40, 100, 64), id="m40"),
    pytest.param((1, 4096, 4096), id="gpu-m1", marks=gpu),
    pytest.param((16, 14336, 4096), id="gpu-m16", marks=gpu),
    pytest.param((64, 4096, 14336), id="gpu-m64", marks=gpu),
    pytest.param((300, 1536, 576), id="gpu-m300", marks=gpu),
]
INT4_SHAPES = [
    pytest.param((1, 70, 256, 128), id="m1"),
    pytest.param((5, 33, 384, 128), id="m5-3groups"),
    pytest.param((17, 48, 128, 32), id="m17-g32"),
    pytest.param((33, 20, 256, 64), id="m33-g64"),
    pytest.param((1, 4096, 4096, 128), id="gpu-m1", marks=gpu),
    pytest.param((16, 14336, 4096, 128), id="gpu-m16", marks=gpu),
    pytest.param((64, 4096, 14336, 128), id="gpu-m64", marks=gpu),
    pytest.param((300, 1536, 576, 64), id="gpu-m300", marks=gpu),
]


def _dense_oracle(x, w_deq, bias):
    y = x.cpu().double() @ w_deq.cpu().double().t()
    if bias is not None:
        y = y + bias.cpu().double()
    return y


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", INT8_SHAPES)
def test_int8_matmul_triton(shape, dtype, with_bias, device, triton_backend):
    m, n, k = shape
    w = randn(n, k, dtype=torch.float32, device=device)
    q, s = kernels.quantize_int8(w)
    x = randn(m, k, dtype=dtype, device=device)
    bias = randn(n, dtype=dtype, device=device) if with_bias else None
    out = poison(torch.empty(m, n, dtype=dtype, device=device))
    y = kernels.int8_matmul(x, q, s, bias, out=out)
    assert y is out
    # error grows like sqrt(K) for the rounded inputs; widen for long dots
    deq = kernels.dequantize_int8(q, s, torch.float64)
    assert_close(y, _dense_oracle(x, deq, bias), dtype, scale=1.5, what="int8_matmul", slack=dot_slack(x, deq))


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", INT4_SHAPES)
def test_int4_matmul_triton(shape, dtype, with_bias, device, triton_backend):
    m, n, k, g = shape
    w = randn(n, k, dtype=torch.float32, device=device) + 0.3
    packed, scales, zeros = kernels.quantize_int4(w, g)
    x = randn(m, k, dtype=dtype, device=device)
    bias = randn(n, dtype=dtype, device=device) if with_bias else None
    out = poison(torch.empty(m, n, dtype=dtype, device=device))
    y = kernels.int4_matmul(x, packed, scales, zeros, g, bias, out=out)
    assert y is out
    deq = kernels.dequantize_int4(packed, scales, zeros, g, torch.float64)
    assert_close(y, _dense_oracle(x, deq, bias), dtype, scale=1.5, what="int4_matmul", slack=dot_slack(x, deq))


@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_quant_matmul_batched_input_and_split_k(backend, device):
    """3-D activations, and explicit split-K configurations of the kernels."""
    x = randn(2, 3, 256, dtype=torch.float16, device=device)
    w = randn(40, 256, dtype=torch.float32, device=device)
    q, s = kernels.quantize_int8(w)
    p, sc, z = kernels.quantize_int4(w, 64)
    with kernels.use_backend(backend):
        y8 = kernels.int8_matmul(x, q, s)
        y4 = kernels.int4_matmul(x, p, sc, z, 64)
    assert y8.shape == (2, 3, 40) and y4.shape == (2, 3, 40)
    x2 = x.reshape(6, 256)
    assert_close(y8.reshape(6, 40), _dense_oracle(x2, kernels.dequantize_int8(q, s), None), torch.float16, scale=1.5)
    assert_close(y4.reshape(6, 40), _dense_oracle(x2, kernels.dequantize_int4(p, sc, z, 64), None), torch.float16,
                 scale=1.5)
    if backend == "triton":
        from hetero_infer.kernels import _triton_quant

        for split in (1, 2, 4):
            out = poison(torch.empty(6, 40, dtype=torch.float16, device=device))
            _triton_quant.int8_matmul(x2, q, s, None, out, config={"BLOCK_M": 16, "BLOCK_N": 32, "SPLIT_K": split})
            assert_close(out, _dense_oracle(x2, kernels.dequantize_int8(q, s), None), torch.float16, scale=1.5)
            out = poison(torch.empty(6, 40, dtype=torch.float16, device=device))
            _triton_quant.int4_matmul(x2, p, sc, z, 64, None, out, config={"BLOCK_M": 16, "BLOCK_N": 32, "SPLIT_K": split})
            assert_close(out, _dense_oracle(x2, kernels.dequantize_int4(p, sc, z, 64), None), torch.float16, scale=1.5)


def test_quantized_matmul_approximates_dense():
    """End to end: the quantized layers stay close to the float layer they replace."""
    w = torch.randn(64, 512) * 0.05
    x = torch.randn(4, 512)
    dense = x @ w.t()
    y8 = kernels.int8_matmul(x, *kernels.quantize_int8(w))
    y4 = kernels.int4_matmul(x, *kernels.quantize_int4(w, 128), 128)
    rel8 = float((y8 - dense).norm() / dense.norm())
    rel4 = float((y4 - dense).norm() / dense.norm())
    assert rel8 < 0.01, rel8
    assert rel4 < 0.15, rel4
