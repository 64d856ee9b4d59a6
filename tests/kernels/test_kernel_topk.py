"""top-k / top-p filtering against a naive per-row implementation."""

from __future__ import annotations

import pytest
import torch

from hetero_infer import kernels


def _naive(logits: torch.Tensor, top_k, top_p) -> torch.Tensor:
    out = torch.full_like(logits, float("-inf"), dtype=torch.float64)
    v = logits.shape[1]
    for b in range(logits.shape[0]):
        row = logits[b].double()
        order = torch.argsort(row, descending=True)
        keep = torch.ones(v, dtype=torch.bool)
        if top_k is not None:
            k = int(top_k[b])
            if 0 < k < v:
                keep &= row >= row[order[k - 1]]  # ties with the k-th largest are kept
        if top_p is not None:
            p = float(top_p[b])
            kept = order[keep[order]]
            probs = torch.softmax(row[kept], dim=0)
            before = torch.cumsum(probs, 0) - probs  # mass of strictly more likely tokens
            drop = kept[before >= p]
            keep[drop] = False
        out[b, keep] = row[keep]
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", ["k", "p", "kp"])
def test_top_k_top_p_filter(mode, dtype, device):
    b, v = 6, 300
    logits = (torch.randn(b, v) * 3).to(device=device, dtype=dtype)
    top_k = torch.tensor([1, 5, 0, 300, 1000, 17], device=device) if "k" in mode else None
    top_p = torch.tensor([0.5, 1.0, 0.9, 0.01, 0.3, 0.95], device=device) if "p" in mode else None
    got = kernels.top_k_top_p_filter(logits, top_k, top_p)
    want = _naive(logits.cpu(), top_k, top_p)
    assert got.dtype == dtype and got.shape == logits.shape
    g = got.cpu().double()
    assert torch.equal(torch.isinf(g), torch.isinf(want))
    kept = ~torch.isinf(want)
    assert torch.equal(g[kept], want[kept])
    assert kept.any(dim=1).all()
    assert not torch.equal(got, logits) or mode == "none"


def test_top_k_top_p_noop_and_errors(device):
    logits = torch.randn(2, 10, device=device)
    assert torch.equal(kernels.top_k_top_p_filter(logits), logits)
    with pytest.raises(ValueError, match="entries"):
        kernels.top_k_top_p_filter(logits, torch.tensor([1], device=device))
    with pytest.raises(TypeError):
        kernels.top_k_top_p_filter(logits, torch.tensor([1.0, 2.0], device=device))
