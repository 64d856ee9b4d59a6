"""Sampling helpers: top-k / top-p (nucleus) filtering of logits.

There is no Triton kernel here on purpose: the filter is one sort per row plus a few
element-wise passes, which PyTorch already runs on the GPU with its segmented sort, and a
sort-free Triton version (threshold bisection) needs tens of passes over each row for top-p.
Whether that pays off is a measurement still owed on a GPU (see docs/kernels.md); until
then the same PyTorch code serves the CPU and CUDA.
"""

from __future__ import annotations

import torch

from . import reference
from ._backend import FLOAT_DTYPES, check_same_device, check_tensor

__all__ = ["top_k_top_p_filter"]


def top_k_top_p_filter(
    logits: torch.Tensor,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
) -> torch.Tensor:
    """Mask logits outside each row's top-k and top-p sets with -inf (returns a new tensor).

    Args:
        logits: ``[B, V]`` float32/float16/bfloat16.
        top_k: int ``[B]`` or None; a value <= 0 or >= V disables top-k for that row.
            Values tied with the k-th largest are kept.
        top_p: float ``[B]`` in (0, 1] or None; 1.0 disables it. Applied after top-k:
            keeps the smallest set of most likely tokens whose probability reaches p.
    At least one token per row always survives.
    """
    check_tensor("logits", logits, ndim=2, dtypes=FLOAT_DTYPES)
    b = logits.shape[0]
    if top_k is not None:
        check_tensor("top_k", top_k, ndim=1, dtypes=(torch.int32, torch.int64))
        if top_k.shape[0] != b:
            raise ValueError(f"top_k has {top_k.shape[0]} entries for {b} rows")
    if top_p is not None:
        check_tensor("top_p", top_p, ndim=1, dtypes=FLOAT_DTYPES + (torch.float64,))
        if top_p.shape[0] != b:
            raise ValueError(f"top_p has {top_p.shape[0]} entries for {b} rows")
    check_same_device(logits=logits, top_k=top_k, top_p=top_p)
    return reference.top_k_top_p_filter(logits, top_k, top_p)
