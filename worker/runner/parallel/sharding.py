"""Which part of each checkpoint tensor a tensor-parallel rank holds (Megatron's split), and the checks that a
model can be split N ways. Pure functions over tensor names, shapes and config.json values.

The split, for rank r of N:
- column-parallel (output rows split): q_proj by query heads, k_proj / v_proj by KV heads (each KV head on
  N / num_kv_heads ranks where there are fewer KV heads than ranks: rank r holds head r * num_kv_heads // N,
  the one its query heads read), gate_proj / up_proj by intermediate rows; their biases alike;
- row-parallel (input columns split; the partial outputs are all-reduced): o_proj, down_proj; their biases on
  rank 0 only (zeros elsewhere), so that the sum adds them once;
- experts: every expert's intermediate dimension split (gate|up rows, down columns), each rank a slice of every
  expert; the router is whole on every rank;
- embedding and LM head: vocabulary rows in N equal slices of ceil(V / N) rows, the last padded with zeros
  (the logits are gathered and cut back to V);
- everything else (norms, the router, a shared expert's gate) whole on every rank.
Fused q|k|v and gate|up parameters are filled from these per-projection slices, so each rank owns whole heads
and matching gate/up rows."""

from __future__ import annotations

from typing import Any

import torch

from hetero_infer.worker.runner.models.rotary import head_dim_of
from hetero_infer.worker.runner.parallel.checks import first_kv_head, kv_heads_per_rank, vocab_per_rank

_COLUMN = ("gate_proj", "up_proj")
_ROW = ("o_proj", "down_proj")
_VOCAB = ("embed_tokens", "lm_head")


def _rows(t: torch.Tensor, dim: int, start: int, count: int) -> torch.Tensor:
    return t.narrow(dim, start, count)


def _even(t: torch.Tensor, dim: int, rank: int, world_size: int) -> torch.Tensor:
    size = t.shape[dim] // world_size
    return t.narrow(dim, rank * size, size)


def shard_tensor(name: str, tensor: torch.Tensor, rank: int, world_size: int, config: Any) -> torch.Tensor:
    """Rank `rank`'s part of checkpoint tensor `name` (in the decoder's naming: "layers.0.self_attn.q_proj.weight",
    "layers.1.mlp.experts.3.down_proj.weight", "layers.1.mlp.experts.gate_up_proj", "embed_tokens.weight", ...)."""
    if world_size == 1:
        return tensor
    parts = name.split(".")
    leaf = parts[-1]
    proj = parts[-2] if leaf in ("weight", "bias") else leaf
    if "experts" in parts:  # routed experts: per expert [I, H] / [H, I], or stacked [E, 2I, H] / [E, H, I]
        stacked = leaf not in ("weight", "bias")
        if proj == "gate_up_proj":  # stacked gate|up: each half split alike
            gate, up = tensor.chunk(2, dim=1)
            return torch.cat([_even(gate, 1, rank, world_size), _even(up, 1, rank, world_size)], dim=1)
        if proj == "down_proj":
            return _even(tensor, 2 if stacked else 1, rank, world_size)
        if proj in _COLUMN:
            return _even(tensor, 0, rank, world_size)
        raise ValueError(f"no tensor-parallel split for expert tensor {name!r}")
    if proj == "q_proj":
        return _even(tensor, 0, rank, world_size)
    if proj in ("k_proj", "v_proj"):
        hd, nkv = head_dim_of(config), config.num_key_value_heads
        return _rows(tensor, 0, first_kv_head(rank, nkv, world_size) * hd, kv_heads_per_rank(nkv, world_size) * hd)
    if proj in _COLUMN:
        return _even(tensor, 0, rank, world_size)
    if proj in _ROW:
        if leaf == "bias":
            return tensor if rank == 0 else torch.zeros_like(tensor)
        return _even(tensor, 1, rank, world_size)
    if proj in _VOCAB:
        per = vocab_per_rank(tensor.shape[0], world_size)
        start = min(rank * per, tensor.shape[0])
        part = tensor[start : start + per]
        if part.shape[0] < per:
            part = torch.cat([part, part.new_zeros(per - part.shape[0], *part.shape[1:])])
        return part
    return tensor  # norms, the router, a shared expert's gate: whole on every rank
