"""oneDNN-packed linear layers give nn.Linear's results."""

from __future__ import annotations

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


def test_pack_linears_replaces_only_plain_linears():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 4)), nn.Embedding(5, 8))
    assert cpu_linear.pack_linears(model) == 2
    assert isinstance(model[0], cpu_linear.PackedLinear) and isinstance(model[2][0], cpu_linear.PackedLinear)
    assert isinstance(model[3], nn.Embedding)
