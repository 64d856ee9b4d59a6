"""Mixture-of-Experts: routing and the fused expert MLP (gate|up GEMM, SiLU-and-mul, down GEMM, weighted sum over
each token's experts), as vLLM's ``fused_moe``.

Three implementations of one function:

* Triton (CUDA, or the interpreter): the (token, expert) pairs are sorted by expert and each expert's run padded
  to the tile height (``moe_align``), so one launch of one grouped GEMM covers every expert: each program multiplies
  a tile of one expert's rows by that expert's weights (float, or INT8 / INT4 dequantized in the kernel).
* CPU (any other device): for a decode step's few tokens and float experts, one C call (kernels/cpu/moe.py: every
  weight row of the experts hit read once, each a GEMV of its expert's tokens); otherwise the pairs sorted by expert
  and both products as ``torch.nn.functional.grouped_mm``, one call each over all experts (quantized experts: only
  the experts hit are dequantized first); no Python loop over experts.
* The reference (``HETERO_INFER_KERNELS=reference``, and the tests' oracle): every pair with its own gathered
  weights (:func:`hetero_infer.kernels.reference.fused_moe`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import reference
from ._backend import FLOAT_DTYPES, check_out, check_same_device, check_tensor, get_backend, use_triton
from .quant import INT4_GROUP_SIZES
from .reference import ExpertWeights

__all__ = ["ExpertWeights", "fused_moe", "moe_routing"]


def moe_routing(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``top_k`` experts of each token from its router logits ``[T, E]``: (weights float32 ``[T, top_k]``, ids
    int32 ``[T, top_k]``); softmax in float32 over all experts, then the top ``top_k``, renormalised to sum to 1
    when ``renormalize`` (Mixtral; Qwen3-MoE's ``norm_topk_prob``)."""
    check_tensor("router_logits", router_logits, ndim=2, dtypes=FLOAT_DTYPES)
    if not isinstance(top_k, int) or not 1 <= top_k <= router_logits.shape[1]:
        raise ValueError(f"top_k must be an integer in [1, {router_logits.shape[1]}] (the experts), got {top_k!r}")
    return reference.moe_routing(router_logits, top_k, renormalize)


def _experts(name: str, w) -> ExpertWeights:
    ew = w if isinstance(w, ExpertWeights) else ExpertWeights(w)
    check_tensor(name, ew.weight, ndim=3, dtypes=(*FLOAT_DTYPES, torch.int8, torch.uint8), last_contiguous=True)
    e, n = ew.weight.shape[:2]
    if ew.method == "int8":
        check_tensor(f"{name}.scales", ew.scales, ndim=2, dtypes=FLOAT_DTYPES)
        if tuple(ew.scales.shape) != (e, n):
            raise ValueError(f"{name}.scales must be [E, N] = [{e}, {n}], got {tuple(ew.scales.shape)}")
    elif ew.method == "int4":
        if ew.group_size not in INT4_GROUP_SIZES or ew.shape[2] % ew.group_size:
            raise ValueError(f"{name}.group_size must be one of {INT4_GROUP_SIZES} and divide K={ew.shape[2]}, "
                             f"got {ew.group_size}")
        groups = ew.shape[2] // ew.group_size
        check_tensor(f"{name}.scales", ew.scales, ndim=3, dtypes=FLOAT_DTYPES)
        check_tensor(f"{name}.zeros", ew.zeros, ndim=3, dtypes=(torch.uint8,))
        if tuple(ew.scales.shape) != (e, n, groups) or tuple(ew.zeros.shape) != (e, n, groups):
            raise ValueError(f"{name}.scales and .zeros must be [E, N, K/G] = [{e}, {n}, {groups}]; got "
                             f"{tuple(ew.scales.shape)} and {tuple(ew.zeros.shape)}")
    return ew


def fused_moe(
    x: torch.Tensor,
    w1: torch.Tensor | ExpertWeights,
    w2: torch.Tensor | ExpertWeights,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The MoE layer's expert MLPs: ``out[t] = sum_j topk_weights[t, j] * down_e(silu(gate_e(x_t)) * up_e(x_t))``
    with ``e = topk_ids[t, j]``.

    Args:
        x: ``[T, H]`` float32 / float16 / bfloat16.
        w1: the experts' fused gate|up projections ``[E, 2I, H]`` (gate rows first, as transformers stacks them),
            in x's dtype, or an :class:`ExpertWeights` of INT8 / INT4 weights.
        w2: the down projections ``[E, H, I]``, the same way.
        topk_weights: ``[T, k]`` (any float dtype; computed with in float32).
        topk_ids: ``[T, k]`` int32 / int64 expert indices in ``[0, E)``.
        out: optional ``[T, H]`` output in x's dtype.

    Products accumulate in float32; the gate|up product and the activation are rounded to x's dtype, the weighted
    sum over a token's experts is float32, rounded once.
    """
    check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES, last_contiguous=True)
    w1, w2 = _experts("w1", w1), _experts("w2", w2)
    check_tensor("topk_weights", topk_weights, ndim=2, dtypes=FLOAT_DTYPES)
    check_tensor("topk_ids", topk_ids, ndim=2, dtypes=(torch.int32, torch.int64))
    t, h = x.shape
    (e, n1, k1), (e2, n2, k2) = w1.shape, w2.shape
    if k1 != h or n1 % 2 or e2 != e or n2 != h or k2 != n1 // 2:
        raise ValueError(f"w1 must be [E, 2I, H] and w2 [E, H, I] for x [T, H={h}]; got w1 {w1.shape}, w2 {w2.shape}")
    for name, ew in (("w1", w1), ("w2", w2)):
        if ew.method == "float" and ew.weight.dtype != x.dtype:
            raise TypeError(f"{name} has dtype {ew.weight.dtype} but x has {x.dtype}")
    if tuple(topk_ids.shape) != tuple(topk_weights.shape) or topk_ids.shape[0] != t:
        raise ValueError(f"topk_weights and topk_ids must both be [T={t}, k]; got {tuple(topk_weights.shape)} and "
                         f"{tuple(topk_ids.shape)}")
    device = check_same_device(x=x, w1=w1.weight, w2=w2.weight, topk_weights=topk_weights, topk_ids=topk_ids,
                               s1=w1.scales, z1=w1.zeros, s2=w2.scales, z2=w2.zeros)
    check_out(out, x.shape, x.dtype, device)
    if topk_ids.device.type == "cpu" and topk_ids.numel() and not (0 <= int(topk_ids.min()) <= int(topk_ids.max()) < e):
        raise ValueError(f"topk_ids must lie in [0, {e}), got [{int(topk_ids.min())}, {int(topk_ids.max())}]")
    if use_triton(x, w1.weight, w2.weight, topk_weights, topk_ids):
        from . import _triton_moe

        y = _triton_moe.fused_moe(x, w1, w2, topk_weights, topk_ids)
    elif get_backend() == "reference":
        y = reference.fused_moe(x, w1, w2, topk_weights, topk_ids)
    else:
        # imported here: at import the kernels package loads nothing of hetero_infer (transformers may import it)
        from .cpu import moe as cpu_moe

        if w1.method == w2.method == "float" and cpu_moe.takes(x, w1.weight, w2.weight, topk_ids):
            y = cpu_moe.moe_experts(x, w1.weight, w2.weight, topk_weights, topk_ids)
        elif not _grouped_mm_fits(x, w1, w2):
            y = reference.fused_moe(x, w1, w2, topk_weights, topk_ids)
        else:
            y = grouped_moe(x, w1, w2, topk_weights, topk_ids)
    if out is None:
        return y
    out.copy_(y)
    return out


def _grouped_mm_fits(x: torch.Tensor, w1: ExpertWeights, w2: ExpertWeights) -> bool:
    """torch's grouped GEMM takes these shapes: float32/bfloat16/float16 rows whose strides are multiples of 16
    bytes (H and I of a real model; not every tiny test shape)."""
    step = 16 // x.element_size()
    return (hasattr(F, "grouped_mm") and x.dtype in FLOAT_DTYPES
            and x.shape[1] % step == 0 and w2.shape[2] % step == 0)


def grouped_moe(
    x: torch.Tensor, w1: ExpertWeights, w2: ExpertWeights, topk_weights: torch.Tensor, topk_ids: torch.Tensor
) -> torch.Tensor:
    """The CPU path of :func:`fused_moe` (checked arguments; shapes that `_grouped_mm_fits`): the (token, expert)
    pairs sorted by expert, each product one grouped GEMM over all experts."""
    t, k = topk_ids.shape
    flat = topk_ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=w1.shape[0])
    token = order // k  # the token of each sorted pair
    xs = x.index_select(0, token)
    if w1.method == "float" and w2.method == "float":
        g1, g2, ends = w1.weight, w2.weight, counts.cumsum(0)
    else:  # only the experts hit are dequantized (a decode step's few, not all E)
        hit = counts.nonzero().squeeze(1)
        g1, g2, ends = w1.dequantized(hit, x.dtype), w2.dequantized(hit, x.dtype), counts[hit].cumsum(0)
    offs = ends.to(torch.int32)
    h = F.grouped_mm(xs, g1.transpose(1, 2), offs=offs)
    a = reference.silu_and_mul(h)
    y = F.grouped_mm(a, g2.transpose(1, 2), offs=offs).to(torch.float32)
    y *= topk_weights.reshape(-1).index_select(0, order).to(torch.float32)[:, None]
    out = torch.zeros((t, x.shape[1]), dtype=torch.float32, device=x.device)
    return out.index_add_(0, token, y).to(x.dtype)
