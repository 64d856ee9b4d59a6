"""The expert MLPs of a MoE layer for a decode step's few tokens in one C call (kernels/cpu/csrc/moe.c): each
weight row of the experts hit read once, from the stacked layout, and dotted with its expert's tokens; the
grouped GEMM (kernels/moe.py's `grouped_moe`) pays a GEMM call per expert and ~10 PyTorch ops of glue instead.

`takes(...)` says where it runs: the C library built, float32 or bfloat16 float experts, at most `MAX_TOKENS`
tokens (beyond that a step is a prefill, where the GEMM's register tiling wins) and top-k at most 64.
HETERO_INFER_CPU_MOE=0 turns it off (the grouped GEMM then takes every step).
"""

from __future__ import annotations

import ctypes
import os

import torch

from hetero_infer.kernels.cpu import native

_P, _I, _L = ctypes.c_void_p, ctypes.c_int, ctypes.c_long
_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}
MAX_TOKENS = 32  # the decode buckets (select.BUCKETS up to 32 rows)
_scratch = torch.empty(0, dtype=torch.uint8)  # the C call's buffers, kept from call to call


def enabled() -> bool:
    return os.environ.get("HETERO_INFER_CPU_MOE", "1") != "0"


def takes(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_ids: torch.Tensor) -> bool:
    """Whether the C call computes this layer (checked arguments of `kernels.fused_moe`, float experts)."""
    return (x.device.type == "cpu" and x.dtype in _SUFFIX and w1.dtype == w2.dtype == x.dtype
            and 1 <= x.shape[0] <= MAX_TOKENS and topk_ids.shape[1] <= 64 and enabled()
            and native.library() is not None)


def moe_experts(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                topk_ids: torch.Tensor) -> torch.Tensor:
    """`kernels.fused_moe` of float experts (w1 [E, 2I, H], w2 [E, H, I] in x's dtype) for the tokens of x [T, H]."""
    global _scratch
    t, h = x.shape
    e, two_i = w1.shape[0], w1.shape[1]
    x, w1, w2 = x.contiguous(), w1.contiguous(), w2.contiguous()
    ids = topk_ids.to(torch.int32).contiguous()
    weights = topk_weights.to(torch.float32).contiguous()
    out = torch.empty_like(x)
    fn = native.function(f"moe_experts_{_SUFFIX[x.dtype]}", [_P, _I, _I, _P, _P, _I, _I, _P, _P, _I, _P, _P, _L], _L)
    args = (x.data_ptr(), t, h, w1.data_ptr(), w2.data_ptr(), e, two_i // 2, ids.data_ptr(), weights.data_ptr(),
            ids.shape[1], out.data_ptr())
    rc = fn(*args, _scratch.data_ptr(), _scratch.numel())
    if rc > 0:  # the scratch buffer is too small: grown (with room), then the call runs
        _scratch = torch.empty(rc + rc // 4, dtype=torch.uint8)
        rc = fn(*args, _scratch.data_ptr(), _scratch.numel())
    if rc != 0:
        raise RuntimeError(f"the CPU MoE kernel failed ({rc})")
    return out
