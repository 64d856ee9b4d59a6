"""LoRA over a batch of mixed adapters: every token of a step runs the adapter of its slot (``slots[t]``, -1: the
base model only), through the slots' stacked weights ``a [S, K, in]`` and ``b [S, N, K]`` (an executor's device
slots; ranks zero-padded to K, the scale folded into ``b``): ``out[t] += b[s] @ (a[s] @ x[t])``.

Three implementations of one computation:

* Triton (CUDA, or the interpreter): :func:`lora_shrink` then :func:`lora_expand`, one program per token and
  block (BGMV, as Punica and vLLM's first LoRA kernels); the slots are read on the device, so a captured step
  replays with whatever the slot tensor holds.
* CPU (any other device, given the step's :class:`LoRAGroups`): the adapter tokens sorted by slot once per step,
  then per layer two grouped GEMMs (``torch.nn.functional.grouped_mm``, one call each over all slots) and one
  ``index_add_``; no Python loop over tokens or adapters.
* The reference (``HETERO_INFER_KERNELS=reference``, and the tests' oracle): every token with its own gathered
  weights (:func:`hetero_infer.kernels.reference.lora_shrink`, :func:`~hetero_infer.kernels.reference.lora_expand`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from . import reference
from ._backend import FLOAT_DTYPES, check_same_device, check_tensor, get_backend, use_triton

__all__ = ["LoRAGroups", "lora_apply", "lora_expand", "lora_groups", "lora_shrink"]

_SLOT_DTYPES = (torch.int32, torch.int64)


@dataclass(frozen=True)
class LoRAGroups:
    """A step's adapter tokens grouped by slot (the CPU path): their rows, sorted by slot, and each slot's end in
    that order (int32, one per slot, cumulative)."""

    rows: torch.Tensor
    ends: torch.Tensor


def lora_groups(slots: torch.Tensor, num_slots: int) -> LoRAGroups:
    """The grouping of `slots` (``[T]``, -1: no adapter) over ``num_slots`` slots."""
    idx = slots.long()
    rows = torch.nonzero(idx >= 0).squeeze(1)
    chosen = idx.index_select(0, rows)
    order = torch.argsort(chosen, stable=True)
    counts = torch.bincount(chosen, minlength=num_slots)
    return LoRAGroups(rows.index_select(0, order), counts.cumsum(0).to(torch.int32))


def _check(x: torch.Tensor, w: torch.Tensor, slots: torch.Tensor, name: str, inner: int) -> None:
    check_tensor("x", x, ndim=2, dtypes=FLOAT_DTYPES, last_contiguous=True)
    check_tensor(name, w, ndim=3, dtypes=FLOAT_DTYPES, last_contiguous=True)
    check_tensor("slots", slots, ndim=1, dtypes=_SLOT_DTYPES)
    if w.dtype != x.dtype:
        raise TypeError(f"{name} has dtype {w.dtype} but x has {x.dtype}")
    if w.shape[2] != inner:
        raise ValueError(f"{name} must be [S, *, {inner}] for x of width {inner}, got {tuple(w.shape)}")
    if slots.shape[0] != x.shape[0]:
        raise ValueError(f"slots must have one entry per token ({x.shape[0]}), got {slots.shape[0]}")
    check_same_device(x=x, **{name: w}, slots=slots)
    if slots.device.type == "cpu" and slots.numel() and int(slots.max()) >= w.shape[0]:
        raise ValueError(f"slots must lie in [-1, {w.shape[0]}), got max {int(slots.max())}")


def lora_shrink(x: torch.Tensor, a: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """``y[t] = a[slots[t]] @ x[t]``: ``[T, K]`` in x's dtype, zeros for tokens with slot -1.

    Args:
        x: ``[T, in]`` activations (float32 / float16 / bfloat16).
        a: ``[S, K, in]`` the slots' stacked A matrices, in x's dtype.
        slots: ``[T]`` int32 / int64 slot of each token, -1 for none.
    """
    _check(x, a, slots, "a", x.shape[1])
    if use_triton(x, a, slots):
        from . import _triton_lora

        return _triton_lora.shrink(x, a, slots, torch.empty(x.shape[0], a.shape[1], dtype=x.dtype, device=x.device))
    return reference.lora_shrink(x, a, slots)


def lora_expand(y: torch.Tensor, b: torch.Tensor, slots: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out[t] += b[slots[t]] @ y[t]`` in place for tokens with a slot (float32 sums, rounded once); returns out.

    Args:
        y: ``[T, K]`` (:func:`lora_shrink`'s result).
        b: ``[S, N, K]`` the slots' stacked B matrices (scale folded in), in y's dtype.
        slots: ``[T]`` as for :func:`lora_shrink`.
        out: ``[T, N]`` the base layer's output, in y's dtype, contiguous in its last dimension.
    """
    _check(y, b, slots, "b", y.shape[1])
    check_tensor("out", out, ndim=2, dtypes=(y.dtype,), last_contiguous=True)
    if tuple(out.shape) != (y.shape[0], b.shape[1]):
        raise ValueError(f"out must be [T, N] = [{y.shape[0]}, {b.shape[1]}], got {tuple(out.shape)}")
    check_same_device(y=y, out=out)
    if use_triton(y, b, slots, out):
        from . import _triton_lora

        return _triton_lora.expand(y, b, slots, out)
    return reference.lora_expand(y, b, slots, out)


def _grouped_mm_fits(x: torch.Tensor, k: int) -> bool:
    """torch's grouped GEMM takes these shapes: rows whose strides are multiples of 16 bytes."""
    step = 16 // x.element_size()
    return hasattr(F, "grouped_mm") and x.shape[1] % step == 0 and k % step == 0


def lora_apply(x: torch.Tensor, out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, slots: torch.Tensor,
               groups: LoRAGroups | None = None) -> torch.Tensor:
    """``out[t] += b[s] @ (a[s] @ x[t])`` with ``s = slots[t]`` (nothing where -1), in place; returns out.
    `groups`: the step's :func:`lora_groups` of `slots`, for the CPU path (else the reference runs there)."""
    if groups is None or get_backend() == "reference" or use_triton(x, a, slots) \
            or not _grouped_mm_fits(x, a.shape[1]):
        return lora_expand(lora_shrink(x, a, slots), b, slots, out)
    return grouped_lora(x, out, a, b, groups)


def grouped_lora(x: torch.Tensor, out: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                 groups: LoRAGroups) -> torch.Tensor:
    """The CPU path of :func:`lora_apply` (checked shapes that `_grouped_mm_fits`)."""
    rows = groups.rows
    if rows.numel() == 0:
        return out
    xs = x.index_select(0, rows)
    y = F.grouped_mm(xs, a.transpose(1, 2), offs=groups.ends)
    return out.index_add_(0, rows, F.grouped_mm(y, b.transpose(1, 2), offs=groups.ends))
