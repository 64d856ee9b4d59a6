"""Every candidate linear kernel that the measurement may choose (kernels/cpu/linear.py CANDIDATES) against
float64, on odd shapes in both dtypes; a mixed plan serves each row count with its bucket's kernel."""

from __future__ import annotations

import pytest
import torch

from hetero_infer.kernels.cpu import linear as cpu_linear
from hetero_infer.kernels.cpu import select

SHAPES = [(24, 17), (72, 131), (33, 65), (200, 1)]  # (in, out): none a multiple of 16 out; K = 33 is odd
ROWS = [1, 3, 17, 33]


def _case(rows: int, k: int, n: int, dtype: torch.dtype, bias: bool):
    gen = torch.Generator().manual_seed(rows * 1000 + k * 10 + n)
    w = torch.randn(n, k, generator=gen).to(dtype)
    x = torch.randn(rows, k, generator=gen).to(dtype)
    b = torch.randn(n, generator=gen).to(dtype) if bias else None
    ref = x.double() @ w.double().T + (b.double() if bias else 0)
    return w, x, b, ref


def _check(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype, k: int) -> None:
    assert out.shape == ref.shape and out.dtype == dtype
    if dtype == torch.float32:  # float32 sums of exact products
        torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5 * k**0.5)
    else:  # bfloat16 inputs are exact in float32 products; float32 sums; one rounding of the output
        torch.testing.assert_close(out.double(), ref, rtol=2**-8, atol=1e-3 * k**0.5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("k,n", SHAPES)
@pytest.mark.parametrize("bias", [False, True])
def test_every_candidate_against_float64(dtype, k, n, bias):
    ran = []
    for kind in cpu_linear.CANDIDATES[dtype]:
        w, _, b, _ = _case(1, k, n, dtype, bias)
        reason = cpu_linear.unsupported(kind, w)
        if reason is not None:
            with pytest.raises(cpu_linear.Unsupported):
                cpu_linear.pack_as(kind, w)
            continue
        packed = cpu_linear.pack_as(kind, w)
        assert packed.kind == kind
        for rows in ROWS:
            w, x, b, ref = _case(rows, k, n, dtype, bias)
            packed = cpu_linear.pack_as(kind, w)
            _check(cpu_linear.packed_linear(x, packed, b), ref, dtype, k)
            _check(cpu_linear.packed_linear(x.view(1, rows, k), packed, b).view(rows, n), ref, dtype, k)
        ran.append(kind)
    # oneDNN runs where torch has it, for bfloat16 only on a CPU with its bf16 instructions (AVX2-only: not)
    onednn_here = cpu_linear.available() and (dtype != torch.bfloat16 or cpu_linear._onednn_bf16())
    assert "torch" in ran and (onednn_here == ("onednn" in ran))
    # the project's GEMM runs wherever its build has AVX512_BF16, for bfloat16 with an even K
    expect_own = dtype == torch.bfloat16 and k % 2 == 0 and cpu_linear._gemm_bf16() is not None
    assert ("gemm_bf16" in ran) == expect_own


def test_mixed_plan_serves_each_bucket_with_its_kernel(monkeypatch):
    kinds = [k for k in cpu_linear.CANDIDATES[torch.bfloat16]
             if cpu_linear.unsupported(k, torch.zeros(1, 2, dtype=torch.bfloat16)) is None]
    plan = tuple(kinds[i % len(kinds)] for i in range(len(select.BUCKETS)))
    w, _, b, _ = _case(1, 72, 131, torch.bfloat16, True)
    layer = cpu_linear.PackedLinear(w, b, plan)
    assert len({id(p) for p in layer.by_bucket}) == len(set(plan))  # one layout per distinct kernel
    used: list[str] = []
    real = cpu_linear.packed_linear

    def spy(x, packed, bias):
        used.append(packed.kind)
        return real(x, packed, bias)

    monkeypatch.setattr(cpu_linear, "packed_linear", spy)
    for rows, bucket in ((1, 0), (3, 1), (8, 1), (17, 2), (33, 3), (300, 3)):
        x = torch.randn(rows, 72).to(torch.bfloat16)
        ref = x.double() @ w.double().T + b.double()
        _check(layer(x), ref, torch.bfloat16, 72)
        assert used[-1] == plan[bucket], rows
