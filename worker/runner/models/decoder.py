"""The decoder every family here shares (pre-norm, GQA attention with rotary, gated SiLU MLP or MoE) over
flattened batches; a family module (llama.py, qwen3_moe.py, ...) subclasses `DecoderForCausalLM` with its
attention layout, its per-layer MLP and its checkpoint names.

Numerics follow Hugging Face transformers (RMSNorm in float32, rotary tables from
transformers' own rope functions) so greedy float32 decoding is token-identical to it.
q/k/v and gate/up projections are fused into single matmuls.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from hetero_infer.worker.runner.attention import AttentionBackend, KVCache
from hetero_infer.worker.runner.models.rotary import RotaryEmbedding, head_dim_of
from hetero_infer.worker.runner.parallel import group as tp_group
from hetero_infer.worker.runner.parallel.checks import kv_heads_per_rank, vocab_per_rank
from hetero_infer.worker.runner.parallel.sharding import shard_tensor


@dataclass(frozen=True)
class AttentionLayout:
    """Where a family's attention differs: biases of the fused q/k/v and of o, per-head q/k RMSNorm (Qwen3)."""

    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor, backend: AttentionBackend, residual: torch.Tensor | None = None):
        """RMSNorm(x); with `residual`, (RMSNorm(residual + x), residual + x), the sum in x's dtype."""
        return backend.rms_norm(x, self.weight, self.eps, residual)


class Attention(nn.Module):
    def __init__(self, config, layout: AttentionLayout) -> None:
        super().__init__()
        tp = tp_group.current()  # tensor parallel: this rank's heads (KV heads replicated below one per rank)
        self.num_heads = tp.part(config.num_attention_heads)
        self.num_kv_heads = kv_heads_per_rank(config.num_key_value_heads, tp.world_size)
        self.head_dim = head_dim_of(config)
        qkv_out = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        self.qkv_proj = nn.Linear(config.hidden_size, qkv_out, bias=layout.qkv_bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=layout.o_bias)
        self.qk_norm = layout.qk_norm
        if self.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.scale = self.head_dim**-0.5

    def forward(self, x: torch.Tensor, backend: AttentionBackend, meta, kv_cache: KVCache) -> torch.Tensor:
        t = x.shape[0]
        qkv = self.qkv_proj(x)
        hq, hk = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q = qkv[:, :hq].view(t, self.num_heads, self.head_dim)
        k = qkv[:, hq : hq + hk].view(t, self.num_kv_heads, self.head_dim)
        v = qkv[:, hq + hk :].view(t, self.num_kv_heads, self.head_dim)
        qk_norm = (self.q_norm.weight, self.k_norm.weight, self.q_norm.eps) if self.qk_norm else None
        o = backend.attention(q, k, v, kv_cache, meta, self.scale, qk_norm)
        return self.o_proj(o.reshape(t, hq))


class MLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False) -> None:
        super().__init__()
        intermediate_size = tp_group.current().part(intermediate_size)  # tensor parallel: this rank's rows
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor, backend: AttentionBackend) -> torch.Tensor:
        return self.down_proj(backend.silu_and_mul(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, config, attention: AttentionLayout, mlp: nn.Module) -> None:
        super().__init__()
        self.self_attn = Attention(config, attention)
        self.mlp = mlp
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.tp = tp_group.current()  # o_proj and the MLP's down projections are row-parallel: summed here

    def forward(self, h, residual, backend: AttentionBackend, meta, kv_cache: KVCache):
        """(layer input, residual stream) -> (MLP output, residual stream); residual None on the first layer."""
        if residual is None:
            residual = h
            h = self.input_layernorm(h, backend)
        else:
            h, residual = self.input_layernorm(h, backend, residual)
        h = self.tp.all_reduce(self.self_attn(h, backend, meta, kv_cache))
        h, residual = self.post_attention_layernorm(h, backend, residual)
        return self.tp.all_reduce(self.mlp(h, backend)), residual


def check_activation(config) -> None:
    if getattr(config, "hidden_act", "silu") != "silu":
        raise ValueError(f"unsupported activation {config.hidden_act!r} (only silu)")


# checkpoint projection -> (fused parameter, which part): q/k/v of qkv_proj, gate/up halves of gate_up_proj
_SHARDS = {"q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v"),
           "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}
# an expert's projection in a per-expert checkpoint -> (the stacked parameter of all experts, which part)
_EXPERT_SHARDS = {"gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1), "down_proj": ("down_proj", None)}


class DecoderForCausalLM(nn.Module):
    """A family's model: `attention_layout` and `layer_mlp` say how its layers differ; `checkpoint_name` maps its
    checkpoint's tensor names onto this layout's (after a leading "model." is dropped)."""

    # the decoder layout of every layer, named for the kernels that take whole layers (kernels/cpu/decode_step.py
    # declares the ones it computes): "llama" is pre-norm, fused q/k/v (+ bias), rotary GQA attention, o, fused
    # gate|up SiLU MLP, down
    decode_layout: ClassVar[str] = "llama"
    # the Linear layers weight-only quantization replaces (worker/quant), in execution order within a layer
    quant_projections: ClassVar[tuple[str, ...]] = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")

    @classmethod
    def attention_layout(cls, config) -> AttentionLayout:
        bias = bool(getattr(config, "attention_bias", False))
        return AttentionLayout(qkv_bias=bias, o_bias=bias)

    @classmethod
    def layer_mlp(cls, config, layer_idx: int) -> nn.Module:
        return MLP(config.hidden_size, config.intermediate_size, bool(getattr(config, "mlp_bias", False)))

    @classmethod
    def checkpoint_name(cls, name: str) -> str:
        return name

    def __init__(self, config, max_positions: int | None = None) -> None:
        super().__init__()
        check_activation(config)
        self.config = config
        self.tp = tp_group.current()
        # tensor parallel: this rank's slice of the vocabulary (embedding rows, LM head rows; parallel/sharding.py)
        vocab = vocab_per_rank(config.vocab_size, self.tp.world_size)
        self.num_kv_heads = kv_heads_per_rank(config.num_key_value_heads, self.tp.world_size)  # this rank's
        # Given its tensor, the embedding skips its random init (the weights are loaded next): on the meta device
        # that init would import torch's Python reference kernels, over a second of every engine's start.
        self.embed_tokens = nn.Embedding(vocab, config.hidden_size, _weight=torch.empty(vocab, config.hidden_size))
        attention = self.attention_layout(config)
        self.layers = nn.ModuleList(DecoderLayer(config, attention, self.layer_mlp(config, i))
                                    for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        if not self.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, vocab, bias=False)
        self.max_positions = max_positions or config.max_position_embeddings
        self.packed_lm_head: nn.Module | None = None  # the CPU GEMMs' LM head (pack_for_cpu)

    def rotary_embedding(self, dtype: torch.dtype, device) -> RotaryEmbedding:
        """The model's rotary tables for `max_positions` positions, for its backend."""
        return RotaryEmbedding.from_config(self.config, self.max_positions, dtype, device)

    def forward(self, input_ids: torch.Tensor, backend: AttentionBackend, meta, kv_caches: list[KVCache]) -> torch.Tensor:
        """Hidden states [T, hidden] of the step's rows; `meta` is `backend.prepare(batch)` of the step."""
        h = self.embed_tokens(input_ids) if self.tp.group is None else self._embed_parallel(input_ids)
        residual = None
        for layer, kv in zip(self.layers, kv_caches):
            h, residual = layer(h, residual, backend, meta, kv)
        return self.norm(h, backend, residual)[0]

    def _embed_parallel(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The vocabulary-parallel embedding: each rank looks up the ids in its slice (zeros elsewhere), summed."""
        rows = self.embed_tokens.weight.shape[0]
        local = input_ids - self.tp.rank * rows
        outside = (local < 0) | (local >= rows)
        h = self.embed_tokens(local.masked_fill(outside, 0))
        return self.tp.all_reduce(h.masked_fill_(outside.unsqueeze(-1), 0))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.packed_lm_head is not None:
            logits = self.packed_lm_head(hidden)
        else:
            logits = F.linear(hidden, self.embed_tokens.weight if self.tie_word_embeddings else self.lm_head.weight)
        if self.tp.group is None:
            return logits
        return self.tp.all_gather_last(logits)[..., : self.config.vocab_size]  # the vocabulary slices, gathered once

    def decode_weights(self) -> list[dict[str, object]]:
        """Per layer, what a whole-layer kernel of the "llama" layout reads: the two norms' weights and the four
        projections (modules)."""
        if self.decode_layout != "llama":
            raise ValueError(f"{type(self).__name__} layers are in the {self.decode_layout!r} layout, not 'llama'")
        return [{"input_norm": layer.input_layernorm.weight, "post_norm": layer.post_attention_layernorm.weight,
                 "qkv": layer.self_attn.qkv_proj, "o": layer.self_attn.o_proj,
                 "gate_up": layer.mlp.gate_up_proj, "down": layer.mlp.down_proj} for layer in self.layers]

    def pack_for_cpu(self, selector=None) -> int:
        """Pre-pack every projection and the LM head for the CPU GEMMs (see cpu_linear), each on the kernels
        `selector` (a `LinearSelector`) measured fastest here, the defaults without one; quantized projections
        included where their GEMM runs; return the count."""
        from hetero_infer.kernels.cpu.linear import PackedLinear, pack_linears
        from hetero_infer.worker.quant.quantize import QuantizedLinear

        weight = self.embed_tokens.weight if self.tie_word_embeddings else self.lm_head.weight
        with torch.no_grad():
            self.packed_lm_head = PackedLinear(weight, None, selector.plan(weight) if selector else None)
        if not self.tie_word_embeddings:
            del self.lm_head  # its packed copy is all the logits need
        quantized = sum(m.pack_for_cpu(weight.dtype) for m in self.modules() if isinstance(m, QuantizedLinear))
        return pack_linears(self, selector) + quantized + 1

    def _target(self, name: str, params: dict[str, nn.Parameter]) -> tuple[str, int | None, int | None, int | None]:
        """(parameter, expert index or None, row offset or None, rows) that checkpoint tensor `name` fills."""
        parts = self.checkpoint_name(name).split(".")
        for i, part in enumerate(parts):
            if part == "experts" and i + 2 < len(parts) and parts[i + 1].isdigit() and parts[i + 2] in _EXPERT_SHARDS:
                stacked, half = _EXPERT_SHARDS[parts[i + 2]]
                target = ".".join(parts[: i + 1] + [stacked])
                if half is None or target not in params:
                    return target, int(parts[i + 1]), None, None
                rows = params[target].shape[1] // 2
                return target, int(parts[i + 1]), half * rows, rows
            if part in _SHARDS:
                fused, which = _SHARDS[part]
                target = ".".join(parts[:i] + [fused] + parts[i + 1 :])
                if target not in params:
                    return target, None, None, None
                if isinstance(which, int):
                    rows = params[target].shape[0] // 2
                    return target, None, which * rows, rows
                hd = head_dim_of(self.config)  # this rank's heads (tensor parallel)
                q, kv = self.tp.part(self.config.num_attention_heads) * hd, self.num_kv_heads * hd
                return target, None, {"q": 0, "k": q, "v": q + kv}[which], q if which == "q" else kv
        return ".".join(parts), None, None, None

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy Hugging Face tensors (a checkpoint's, per expert or stacked as transformers holds them) into the fused
        parameters; error on anything missing, unknown or given twice."""
        params = dict(self.named_parameters())
        filled: dict[str, int] = {}
        seen: set[tuple] = set()
        for name, tensor in weights:
            if "rotary_emb" in name:
                continue
            if name.startswith("model."):
                name = name[len("model.") :]
            if name == "lm_head.weight" and self.tie_word_embeddings:
                continue
            target, expert, offset, size = self._target(name, params)
            if target not in params:
                raise ValueError(f"unexpected weight {name!r} for {type(self).__name__}")
            if self.tp.world_size > 1:  # this rank's part of it
                tensor = shard_tensor(self.checkpoint_name(name), tensor, self.tp.rank, self.tp.world_size, self.config)
            key = (target, expert, offset)
            if key in seen:
                raise ValueError(f"weight {name!r} given twice")
            seen.add(key)
            with torch.no_grad():
                dst = params[target] if expert is None else params[target][expert]
                if offset is not None:
                    dst = dst.narrow(0, offset, size)
                if dst.shape != tensor.shape:
                    raise ValueError(f"weight {name!r} has shape {tuple(tensor.shape)}, expected {tuple(dst.shape)}")
                dst.copy_(tensor)
            filled[target] = filled.get(target, 0) + dst.numel()
        missing = sorted(p for p, param in params.items() if filled.get(p, 0) != param.numel())
        if missing:
            raise ValueError(f"weights missing from the checkpoint: {', '.join(missing[:8])}")
