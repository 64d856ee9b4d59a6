"""Whether a model can be split over N tensor-parallel ranks, from config.json's values alone (no torch: the
operator and the CLI check a spec with it), and the integer arithmetic of the split (worker/runner/parallel/sharding.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# config.json fields that tensor parallelism splits evenly (an MLP's or an expert's intermediate size)
_INTERMEDIATE = ("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size")


def vocab_per_rank(vocab_size: int, world_size: int) -> int:
    return -(-vocab_size // world_size)


def kv_heads_per_rank(num_kv_heads: int, world_size: int) -> int:
    return max(1, num_kv_heads // world_size)


def first_kv_head(rank: int, num_kv_heads: int, world_size: int) -> int:
    return rank * num_kv_heads // world_size


def check_split(raw: Mapping[str, Any], world_size: int, int4_group: int | None = None) -> None:
    """A ValueError saying why config.json's model (`raw`) cannot be split over `world_size` ranks
    (`split_problems`)."""
    if world_size < 1:
        raise ValueError(f"tensor_parallel_size must be >= 1, got {world_size}")
    problems = split_problems(raw, world_size, int4_group)
    if problems:
        raise ValueError(f"the model cannot be split over tensor_parallel_size={world_size}: " + "; ".join(problems))


def split_problems(raw: Mapping[str, Any], world_size: int, int4_group: int | None = None) -> list[str]:
    """Why config.json's model (`raw`) cannot be split over `world_size` >= 1 ranks (empty: it can): the query
    heads must divide evenly, the KV heads divide or be replicated (world_size a multiple of them), every
    intermediate size divide. The vocabulary needs nothing (padded). With `int4_group` (INT4 weights: the
    smallest group size of the INT4 kernels), each row-parallel shard's input width (a rank's heads x head_dim,
    its intermediate rows) must hold whole groups. `hetero-infer fetch --tensor-parallel-size` checks the same."""
    if world_size <= 1:
        return []
    text = raw.get("text_config")
    raw = text if isinstance(text, Mapping) else raw
    heads = raw.get("num_attention_heads")
    kv = raw.get("num_key_value_heads") or heads
    problems = []
    if not heads or heads % world_size:
        problems.append(f"num_attention_heads={heads} is not divisible by {world_size}")
    if kv and kv % world_size and world_size % kv:
        problems.append(f"num_key_value_heads={kv} neither divides by {world_size} nor divides it (to replicate)")
    widths = {}
    if heads and not heads % world_size:
        hd = raw.get("head_dim") or raw["hidden_size"] // heads
        widths["num_attention_heads x head_dim"] = heads * hd
    for key in _INTERMEDIATE:
        size = raw.get(key)
        if size and size % world_size:
            problems.append(f"{key}={size} is not divisible by {world_size}")
        elif size:
            widths[key] = size
    if int4_group:
        for key, width in widths.items():
            if (width // world_size) % int4_group:
                problems.append(f"INT4 groups of {int4_group} do not divide a rank's part of {key} "
                                f"({width} / {world_size})")
    return problems
