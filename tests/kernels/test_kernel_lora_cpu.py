"""The C LoRA row kernels of the fused CPU decode step (kernels/cpu/csrc/lora.c) against float64: the shrink
(y = a @ x) and the expand (out[j0:j1] += b[j0:j1] @ y, one rounding) in float32 and bfloat16, on sizes that fill
the vector blocks (16 rows of 16 with AVX-512, 8 of 8 with AVX2) and sizes that leave tails of rows and of
columns."""

from __future__ import annotations

import ctypes

import pytest
import torch

from hetero_infer.kernels.cpu import native

pytestmark = pytest.mark.skipif(native.library() is None, reason="no C compiler: the C kernels are not built")

_P, _I = ctypes.c_void_p, ctypes.c_int
SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}


def _shrink(x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    y = torch.empty(a.shape[0], dtype=torch.float32)
    fn = native.function(f"lora_shrink_row_{SUFFIX[x.dtype]}", [_P, _I, _P, _I, _P])
    fn(x.data_ptr(), x.shape[0], a.data_ptr(), a.shape[0], y.data_ptr())
    return y


def _expand(y: torch.Tensor, b: torch.Tensor, out: torch.Tensor, j0: int, j1: int) -> None:
    fn = native.function(f"lora_expand_rows_{SUFFIX[out.dtype]}", [_P, _P, _I, _P, _I, _I])
    fn(y.data_ptr(), b.data_ptr(), b.shape[1], out.data_ptr(), j0, j1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k,n", [(1, 5), (7, 16), (16, 33), (17, 64), (48, 576), (50, 1536), (8, 15)])
def test_shrink_against_float64(dtype, k, n):
    g = torch.Generator().manual_seed(k * 1000 + n)
    x, a = torch.randn(n, generator=g).to(dtype), torch.randn(k, n, generator=g).to(dtype)
    want = a.double() @ x.double()
    got = _shrink(x, a)
    assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-5 * n**0.5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,rank,j0,j1", [(576, 16, 0, 576), (3072, 16, 16, 32), (3072, 16, 1552, 1568),
                                             (100, 8, 3, 97), (40, 24, 0, 40), (70, 16, 5, 70), (9, 7, 0, 9)])
def test_expand_against_float64(dtype, rows, rank, j0, j1):
    g = torch.Generator().manual_seed(rows * 100 + rank + j0)
    y = torch.randn(rank, generator=g)
    b = torch.randn(rows, rank, generator=g).to(dtype)
    out = torch.randn(rows, generator=g).to(dtype)
    want = out.double().clone()
    want[j0:j1] += b[j0:j1].double() @ y.double()
    got = out.clone()
    _expand(y, b, got, j0, j1)
    assert torch.equal(got[:j0], out[:j0]) and torch.equal(got[j1:], out[j1:])  # nothing outside [j0, j1)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=8e-3, atol=8e-3)  # one rounding
    assert torch.allclose(got[j0:j1].double(), want[j0:j1], **tol)
