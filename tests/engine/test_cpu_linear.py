"""oneDNN-packed linear layers give nn.Linear's results."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from hetero_infer.kernels.cpu import linear as cpu_linear
from hetero_infer.kernels.cpu import native as cpu_native


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("rows", [1, 7, 33, 300])
def test_packed_linear_matches_nn_linear(dtype, tol, bias, rows):
    assert cpu_linear.available(), "oneDNN packing must be available with the CPU torch build"
    torch.manual_seed(rows)
    linear = nn.Linear(96, 200, bias=bias).to(dtype)
    x = torch.randn(rows, 96).to(dtype)
    packed = cpu_linear.PackedLinear(linear.weight, linear.bias)
    with torch.no_grad():
        torch.testing.assert_close(packed(x).float(), linear(x).float(), atol=tol, rtol=tol)
        torch.testing.assert_close(packed(x[:, :].t().contiguous().t()).float(), linear(x).float(), atol=tol, rtol=tol)


def native_build() -> bool:
    """The library built for this CPU (no HETERO_INFER_CPU_MARCH target; HETERO_INFER_CPU_ISA may lower it)."""
    return os.environ.get("HETERO_INFER_CPU_MARCH", "native") == "native"


def bf16_gemm_here() -> bool:
    return cpu_linear._gemm_bf16() is not None


@pytest.mark.parametrize("rows,k,n", [(1, 576, 960), (7, 96, 200), (32, 576, 49152 // 64), (300, 1536, 33), (13, 2, 1)])
@pytest.mark.parametrize("bias", [True, False])
def test_bf16_gemm_against_float64(rows, k, n, bias):
    """The C bfloat16 GEMM: exact bf16 products, float32 sums, one rounding to bfloat16 at the end."""
    if native_build():  # AVX512_BF16, else AVX2 + FMA (bfloat16 widened to float32); the portable level: none
        flags = cpu_native.cpu_flags()
        expected = cpu_native.isa_request() != "portable" and ("avx512_bf16" in flags or {"avx2", "fma"} <= flags)
        assert bf16_gemm_here() == expected, "built wherever the CPU (and the level asked for) has it"
    if not bf16_gemm_here():
        pytest.skip("no AVX512_BF16 or AVX2 + FMA in this build: the oneDNN path is tested above")
    gen = torch.Generator().manual_seed(rows * k + n)
    linear = nn.Linear(k, n, bias=bias).to(torch.bfloat16)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(n, k, generator=gen))
        if bias:
            linear.bias.copy_(torch.randn(n, generator=gen))
    x = torch.randn(rows, k, generator=gen).to(torch.bfloat16)
    packed = cpu_linear.PackedLinear(linear.weight, linear.bias)
    assert packed.packed.kind == "gemm_bf16"
    with torch.no_grad():
        out = packed(x)
    ref = x.double() @ linear.weight.double().T + (linear.bias.double() if bias else 0)
    assert out.dtype == torch.bfloat16 and out.shape == (rows, n)
    # float32 accumulation error is far below bfloat16's half-ulp rounding of the result
    torch.testing.assert_close(out.double(), ref, rtol=2**-8, atol=1e-3 * k**0.5)


def test_pack_linears_replaces_only_plain_linears():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 4)), nn.Embedding(5, 8))
    assert cpu_linear.pack_linears(model) == 2
    assert isinstance(model[0], cpu_linear.PackedLinear) and isinstance(model[2][0], cpu_linear.PackedLinear)
    assert isinstance(model[3], nn.Embedding)


def _random_int8(n: int, k: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    q = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
    return q, torch.rand(n, generator=gen) * 0.02 + 1e-3


def _random_int4(n: int, k: int, g: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    levels = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    scales = torch.rand(n, k // g, generator=gen) * 0.02 + 1e-3
    zeros = torch.randint(0, 16, (n, k // g), generator=gen, dtype=torch.uint8)
    return levels, scales, zeros


QUANT_SHAPES = [(1, 576, 960), (3, 576, 100), (4, 1536, 64), (2, 128, 17), (7, 128, 200), (8, 576, 65), (9, 128, 64), (33, 1536, 130), (300, 576, 64), (5, 128, 1), (250, 256, 70)]


@pytest.mark.parametrize("rows,k,n", QUANT_SHAPES)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("method", ["int8", "int4"])
def test_quantized_gemm_against_float64(rows, k, n, bias, method):
    """W8A16: exact integer weights, float32 sums, times the column scale, one rounding to bfloat16 at the end.
    W4A16: against the exact weights (q - zero) * scale; up to 4 rows the kernel sums x * q per group exactly
    (scale and zero applied per group), beyond that it rounds each weight to bfloat16 once: within one
    bfloat16 step of the largest output."""
    assert cpu_linear.quantized_gemm_available() == bf16_gemm_here()
    if not bf16_gemm_here():
        pytest.skip("no bfloat16 GEMM in this build: quantized layers use the kernels' reference there")
    from hetero_infer.kernels import reference

    gen = torch.Generator().manual_seed(rows * k + n)
    x = torch.randn(rows, k, generator=gen).to(torch.bfloat16)
    b = torch.randn(n, generator=gen) if bias else None
    if method == "int8":
        q, s = _random_int8(n, k, gen)
        packed = cpu_linear.pack_int8(q, s)
        ref = (x.double() @ q.double().T) * s.double()
    else:
        g = 64 if k % 128 else 128
        levels, s, z = _random_int4(n, k, g, gen)
        packed = cpu_linear.pack_int4(levels, s, z, g)
        w = reference.dequantize_int4(reference.pack_int4(levels, g), s.double(), z, g, torch.float64)
        ref = x.double() @ w.T
    if bias:
        ref = ref + b.double()
    out = cpu_linear.packed_linear(x, packed, b)
    assert out.dtype == torch.bfloat16 and out.shape == (rows, n)
    atol = 1e-4 * k**0.5 if method == "int8" else 2**-8 * ref.abs().max().item()
    torch.testing.assert_close(out.double(), ref, rtol=2**-8, atol=atol)


def test_quantized_linear_packed_for_cpu_gives_the_same_layer():
    """Packed where the build has the quantized GEMM; elsewhere (the portable build) the layer stays as it was,
    on the kernels' reference."""
    from hetero_infer.worker.quant.quantize import QuantizedLinear, weight_bytes

    here = cpu_linear.quantized_gemm_available()
    assert here == bf16_gemm_here()
    torch.manual_seed(0)
    dense = nn.Linear(256, 200, bias=True).to(torch.bfloat16)
    x = torch.randn(3, 4, 256).to(torch.bfloat16)
    for method in ("int8", "int4"):
        layer = QuantizedLinear.from_linear(dense, method)
        expected = layer(x).float()  # the kernels' reference: float32 math
        assert not layer.pack_for_cpu(torch.float32)  # only for bfloat16 activations
        if not here:
            assert not layer.pack_for_cpu(torch.bfloat16) and layer.cpu_packed is None
            assert torch.equal(layer(x).float(), expected)
            assert layer.dequantized_weight().shape == (200, 256)  # still in the kernels' layout
            continue
        assert layer.pack_for_cpu(torch.bfloat16)
        assert not layer.pack_for_cpu(torch.bfloat16)  # once
        assert not hasattr(layer, "qweight") or layer.qweight is None
        got = layer(x)
        assert got.shape == (3, 4, 200) and got.dtype == torch.bfloat16
        scale = expected.abs().max().item()
        torch.testing.assert_close(got.float(), expected, rtol=0, atol=2**-7 * scale)
        # 1 (INT8) or 0.5 (INT4) bytes per weight, columns padded to panels of 64; float32 scales (and zeros)
        padded, groups = 256, 256 // layer.group_size
        quantized = padded * 256 + padded * 4 if method == "int8" else padded * 128 + 2 * padded * groups * 4
        assert weight_bytes(layer) == quantized + 200 * 2  # + the bfloat16 bias
        with pytest.raises(RuntimeError, match="pack_for_cpu"):
            layer.dequantized_weight()
