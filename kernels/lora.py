"""LoRA over a batch of mixed adapters: every token of a step runs the adapter of its slot (``slots[t]``, -1: the
base model only), through the slots' stacked weights ``a [S, n*R, in]`` and ``b [S, N, R]`` (an executor's device
slots; ranks zero-padded to R, the scale folded into ``b``; n output slices, the q, k, v of a fused projection,
each with its own rank-R part): ``y = a[s] @ x[t]``, then ``out[t, j] += b[s, j] @ y[i*R:(i+1)*R]`` for row j of
slice i.

Three implementations of one computation:

* Triton (CUDA, or the interpreter): :func:`lora_shrink` then :func:`lora_expand`, one program per token and
  block (BGMV, as Punica and vLLM's first LoRA kernels); the slots are read on the device, so a captured step
  replays with whatever the slot tensor holds.
* CPU (any other device, given the step's :class:`LoRAGroups`): the adapter tokens grouped by slot once per step
  (each slot's rows padded to the longest group, the padding rows zeroed), then per projection one gather, one
  batched GEMM over the slots (``torch.bmm``) for the shrink and per output slice one for the expand and one
  ``index_add_``; no Python loop over tokens or adapters. (The fused CPU decode step computes its decode steps'
  LoRA in C: kernels/cpu/csrc/lora.c.) (torch's grouped GEMM
  runs one GEMM per group on the CPU, each with a host sync: ten times slower at a decode step's sizes.)
* The reference (``HETERO_INFER_KERNELS=reference``, and the tests' oracle): every token with its own gathered
  weights (:func:`hetero_infer.kernels.reference.lora_shrink`, :func:`~hetero_infer.kernels.reference.lora_expand`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import reference
from ._backend import FLOAT_DTYPES, check_same_device, check_tensor, get_backend, use_triton

__all__ = ["LoRAGroups", "lora_apply", "lora_expand", "lora_groups", "lora_shrink"]

_SLOT_DTYPES = (torch.int32, torch.int64)


@dataclass(frozen=True)
class LoRAGroups:
    """A step's adapter tokens grouped by slot (the CPU path), slots 0 .. `num_slots` - 1 each padded to `width`
    rows: `gather` [num_slots * width] the token row of each padded position (row 0 for padding), `padding` the
    positions that hold no token (their gathered rows are zeroed, so they add nothing to row 0). `runs`: where
    the step's adapter tokens come in runs of one slot averaging at least `MIN_RUN` tokens (prefill chunks), each
    run's (first row, end row, slot), which the CPU path then computes in place, run by run; else None."""

    num_slots: int
    width: int
    gather: torch.Tensor
    padding: torch.Tensor
    runs: tuple[tuple[int, int, int], ...] | None = None


def lora_groups(slots: torch.Tensor, num_slots: int) -> LoRAGroups:
    """The grouping of `slots` (``[T]``, -1: no adapter; values below ``num_slots``)."""
    idx = slots.long().cpu()
    rows = torch.nonzero(idx >= 0).squeeze(1)
    empty = torch.zeros(0, dtype=torch.long)
    if rows.numel() == 0:
        return LoRAGroups(0, 0, empty, empty)
    runs = _runs(idx, rows.numel())
    if runs is not None:
        return LoRAGroups(max(slot for _, _, slot in runs) + 1, 0, empty, empty, runs)
    chosen = idx.index_select(0, rows)
    order = torch.argsort(chosen, stable=True)
    rows, chosen = rows.index_select(0, order), chosen.index_select(0, order)
    used = int(chosen[-1]) + 1
    counts = torch.bincount(chosen, minlength=used)
    width = int(counts.max())
    starts = counts.cumsum(0) - counts
    valid = chosen * width + (torch.arange(rows.numel()) - starts.index_select(0, chosen))
    gather = torch.zeros(used * width, dtype=torch.long).index_copy_(0, valid, rows)
    padding = torch.ones(used * width, dtype=torch.bool).index_fill_(0, valid, False).nonzero().squeeze(1)
    device = slots.device
    return LoRAGroups(used, width, gather.to(device), padding.to(device))


# the shortest mean run of one slot's tokens (over a step's adapter tokens) that the CPU path computes run by run:
# at prefill chunks of 64 tokens, run by run is 3-5x faster than the gathered batched GEMMs (no gather, no
# padding, the expand added in place: measured per projection of the default model, one thread); per decode token
# it would be a Python loop over the tokens
MIN_RUN = 16


def _runs(idx: torch.Tensor, adapter_tokens: int) -> tuple[tuple[int, int, int], ...] | None:
    """(first row, end row, slot) of each run of one slot in `idx` (adapter slots only), where they average at
    least MIN_RUN tokens; else None."""
    if adapter_tokens < MIN_RUN:
        return None
    ends = (torch.nonzero(idx[1:] != idx[:-1]).squeeze(1) + 1).tolist() + [idx.numel()]
    starts = [0, *ends[:-1]]
    slots = idx.index_select(0, torch.tensor(starts)).tolist()
    runs = tuple((a, b, s) for a, b, s in zip(starts, ends, slots) if s >= 0)
    return runs if len(runs) * MIN_RUN <= adapter_tokens else None


def _check(x: torch.Tensor, w: torch.Tensor, slots: torch.Tensor, name: str, inner: int) -> None:
    """The shrink's arguments."""
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


def _slices(slices: tuple[int, ...] | None, n: int, width: int, r: int) -> tuple[int, ...]:
    sizes = tuple(slices) if slices else (n,)
    if sum(sizes) != n or not 1 <= len(sizes) <= 3 or any(x < 1 for x in sizes):
        raise ValueError(f"slices must be 1 to 3 positive sizes adding up to N={n}, got {slices!r}")
    if width != len(sizes) * r:
        raise ValueError(f"y must be [T, slices x R] = [T, {len(sizes)} x {r}], got width {width}")
    return sizes


def lora_expand(y: torch.Tensor, b: torch.Tensor, slots: torch.Tensor, out: torch.Tensor,
                slices: tuple[int, ...] | None = None) -> torch.Tensor:
    """``out[t, j] += b[slots[t], j] @ y[t, i*R:(i+1)*R]`` in place for tokens with a slot, row j in output slice
    i (float32 sums, rounded once); returns out.

    Args:
        y: ``[T, n * R]`` (:func:`lora_shrink`'s result: the n slices' rank-R parts side by side).
        b: ``[S, N, R]`` the slots' stacked B matrices (scale folded in), in y's dtype.
        slots: ``[T]`` as for :func:`lora_shrink`.
        out: ``[T, N]`` the base layer's output, in y's dtype, contiguous in its last dimension.
        slices: the sizes of the n output slices (a fused q/k/v's three; at most 3), adding up to N; None: one.
    """
    check_tensor("y", y, ndim=2, dtypes=FLOAT_DTYPES, last_contiguous=True)
    check_tensor("b", b, ndim=3, dtypes=(y.dtype,), last_contiguous=True)
    check_tensor("slots", slots, ndim=1, dtypes=_SLOT_DTYPES)
    check_tensor("out", out, ndim=2, dtypes=(y.dtype,), last_contiguous=True)
    sizes = _slices(slices, b.shape[1], y.shape[1], b.shape[2])
    if tuple(out.shape) != (y.shape[0], b.shape[1]) or slots.shape[0] != y.shape[0]:
        raise ValueError(f"out must be [T, N] = [{y.shape[0]}, {b.shape[1]}] and slots [T]; got "
                         f"{tuple(out.shape)} and {tuple(slots.shape)}")
    check_same_device(y=y, b=b, slots=slots, out=out)
    if slots.device.type == "cpu" and slots.numel() and int(slots.max()) >= b.shape[0]:
        raise ValueError(f"slots must lie in [-1, {b.shape[0]}), got max {int(slots.max())}")
    if use_triton(y, b, slots, out):
        from . import _triton_lora

        return _triton_lora.expand(y, b, slots, out, sizes)
    return reference.lora_expand(y, b, slots, out, sizes)


def lora_apply(x: torch.Tensor, out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, slots: torch.Tensor,
               slices: tuple[int, ...] | None = None, groups: LoRAGroups | None = None) -> torch.Tensor:
    """``out[t] += expand(b[s], a[s] @ x[t])`` with ``s = slots[t]`` (nothing where -1), in place, over the output
    `slices` (see :func:`lora_expand`); returns out. `groups`: the step's :func:`lora_groups` of `slots`, for the
    CPU path (else the reference runs there)."""
    if groups is None or get_backend() == "reference" or use_triton(x, a, slots):
        return lora_expand(lora_shrink(x, a, slots), b, slots, out, slices)
    return grouped_lora(x, out, a, b, groups, _slices(slices, b.shape[1], a.shape[1], b.shape[2]))


def grouped_lora(x: torch.Tensor, out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, groups: LoRAGroups,
                 slices: tuple[int, ...]) -> torch.Tensor:
    """The CPU path of :func:`lora_apply`. Run by run where the step's adapter tokens come in long runs of one slot
    (`groups.runs`): ``y = x[run] @ a[s]^T``, then per output slice ``out[run, slice] += y[:, slice's R] @
    b[s, slice]^T`` in place. Else grouped: per slot, ``y = x_s @ a[s]^T`` then per output slice
    ``out[rows of s, slice] += y[:, slice's R] @ b[s, slice]^T``, as batched GEMMs whose weight operands are the
    stored matrices, transposed views (no copy of the adapters' weights, the bytes that bound a decode step), and
    whose results are already one row per token (added back with one ``index_add_`` per slice; a padding row is
    zeros and adds nothing)."""
    n, width = groups.num_slots, groups.width
    if n == 0:
        return out
    r = b.shape[2]
    if groups.runs is not None:
        for first, end, slot in groups.runs:
            y = x[first:end] @ a[slot].T  # [run, slices x R]
            start = 0
            for i, size in enumerate(slices):
                out[first:end, start:start + size].addmm_(y[:, i * r:(i + 1) * r], b[slot, start:start + size].T)
                start += size
        return out
    xs = x.index_select(0, groups.gather)
    if groups.padding.numel():
        xs.index_fill_(0, groups.padding, 0)
    y = torch.bmm(xs.view(n, width, x.shape[1]), a[:n].transpose(1, 2))  # [n, width, slices x R]
    start = 0
    for i, size in enumerate(slices):
        z = torch.bmm(y[:, :, i * r:(i + 1) * r], b[:n, start:start + size].transpose(1, 2))  # [n, width, size]
        out[:, start:start + size].index_add_(0, groups.gather, z.view(n * width, size))
        start += size
    return out
