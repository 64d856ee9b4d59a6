"""Rotary position embedding tables of one model, computed as transformers computes them."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RotaryEmbedding:
    """Neox-style rotary tables for positions 0..max_positions-1, in the layouts the backends read.

    `cos`/`sin` (the model's dtype) are what the PyTorch and CPU paths multiply by; `cos_sin_cache` (float32,
    the cos half then the sin half of the frequencies) is the Triton kernels' layout.
    """

    cos: torch.Tensor  # [max_positions, head_dim]
    sin: torch.Tensor  # [max_positions, head_dim]
    cos_sin_cache: torch.Tensor  # [max_positions, head_dim] float32

    @classmethod
    def from_config(cls, config, max_positions: int, dtype: torch.dtype, device) -> RotaryEmbedding:
        cos, sin = rope_tables(config, max_positions, device)
        half = cos.shape[-1] // 2
        cache = torch.cat((cos[:, :half], sin[:, :half]), dim=-1).contiguous()
        return cls(cos.to(dtype), sin.to(dtype), cache)

    def apply(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [T, heads, D] rotated by the rows `cos`, `sin` [T, 1, D] gathered at its positions (`at`)."""
        return x * cos + rotate_half(x) * sin

    def at(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) rows of `positions`, shaped [T, 1, D] to broadcast over heads."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)


def rope_tables(config, max_positions: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 cos/sin tables [max_positions, head_dim] computed exactly as transformers does."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        base = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        dim = head_dim_of(config)
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        scaling = 1.0
    elif rope_type in ROPE_INIT_FUNCTIONS and rope_type != "dynamic":
        inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, "cpu")
    else:
        raise ValueError(f"unsupported rope type {rope_type!r}")
    positions = torch.arange(max_positions, dtype=torch.float32)
    freqs = positions[:, None] * inv_freq.float()[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * scaling).to(device), (emb.sin() * scaling).to(device)


def head_dim_of(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
