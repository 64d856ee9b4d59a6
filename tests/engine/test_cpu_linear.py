"""oneDNN-packed linear layers give nn.Linear's results."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from hetero_infer.worker import cpu_linear


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("rows", [1, 7, 33, 300])
def test_packed_linear_matches_nn_linear(dtype, tol, bias, rows):
    assert cpu_linear.available(), "oneDNN packing must be available with the CPU torch build"
    torch.manual_seed(rows)
    linear = nn.Linear(96, 200, bias=bias).to(dtype)
    x = torch.randn(rows, 96).to(dtype)
    packed = cpu_linear.PackedLinear(linear)
    with torch.no_grad():
        torch.testing.assert_close(packed(x).float(), linear(x).float(), atol=tol, rtol=tol)
        torch.testing.assert_close(packed(x[:, :].t().contiguous().t()).float(), linear(x).float(), atol=tol, rtol=tol)


def bf16_gemm_here() -> bool:
    return cpu_linear._gemm_bf16() is not None


@pytest.mark.parametrize("rows,k,n", [(1, 576, 960), (7, 96, 200), (32, 576, 49152 // 64), (300, 1536, 33), (13, 2, 1)])
@pytest.mark.parametrize("bias", [True, False])
def test_bf16_gemm_against_float64(rows, k, n, bias):
    """The C bfloat16 GEMM: exact bf16 products, float32 sums, one rounding to bfloat16 at the end."""
    native = os.environ.get("HETERO_INFER_CPU_MARCH", "native") == "native"
    with open("/proc/cpuinfo") as f:
        cpu_has_it = "avx512_bf16" in f.read()
    assert bf16_gemm_here() == (native and cpu_has_it), "built wherever the CPU (and the -march) has it"
    if not bf16_gemm_here():
        pytest.skip("no AVX512_BF16 in this build: the oneDNN path is tested above")
    gen = torch.Generator().manual_seed(rows * k + n)
    linear = nn.Linear(k, n, bias=bias).to(torch.bfloat16)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(n, k, generator=gen))
        if bias:
            linear.bias.copy_(torch.randn(n, generator=gen))
    x = torch.randn(rows, k, generator=gen).to(torch.bfloat16)
    packed = cpu_linear.PackedLinear(linear)
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
