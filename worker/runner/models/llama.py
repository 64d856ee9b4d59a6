"""Decoder for the Llama family (Llama 2/3, Mistral, Qwen2, Qwen3) over flattened batches.

Numerics follow Hugging Face transformers (RMSNorm in float32, rotary tables from
transformers' own rope functions) so greedy float32 decoding is token-identical to it.
q/k/v and gate/up projections are fused into single matmuls.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from hetero_infer.worker.runner.attention import AttentionBackend, KVCache
from hetero_infer.worker.runner.models.rotary import RotaryEmbedding, head_dim_of


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor, backend: AttentionBackend, residual: torch.Tensor | None = None):
        """RMSNorm(x); with `residual`, (RMSNorm(residual + x), residual + x), the sum in x's dtype."""
        return backend.rms_norm(x, self.weight, self.eps, residual)


class Attention(nn.Module):
    def __init__(self, config, layer_idx: int) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = head_dim_of(config)
        self.layer_idx = layer_idx
        model_type = config.model_type
        qkv_bias = model_type == "qwen2" or bool(getattr(config, "attention_bias", False))
        o_bias = model_type not in ("qwen2",) and bool(getattr(config, "attention_bias", False))
        qkv_out = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        self.qkv_proj = nn.Linear(config.hidden_size, qkv_out, bias=qkv_bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=o_bias)
        self.qk_norm = model_type == "qwen3"
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
    def __init__(self, config) -> None:
        super().__init__()
        bias = bool(getattr(config, "mlp_bias", False))
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=bias)
        if getattr(config, "hidden_act", "silu") != "silu":
            raise ValueError(f"unsupported activation {config.hidden_act!r} (only silu)")

    def forward(self, x: torch.Tensor, backend: AttentionBackend) -> torch.Tensor:
        return self.down_proj(backend.silu_and_mul(self.gate_up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, config, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = Attention(config, layer_idx)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, h, residual, backend: AttentionBackend, meta, kv_cache: KVCache):
        """(layer input, residual stream) -> (MLP output, residual stream); residual None on the first layer."""
        if residual is None:
            residual = h
            h = self.input_layernorm(h, backend)
        else:
            h, residual = self.input_layernorm(h, backend, residual)
        h = self.self_attn(h, backend, meta, kv_cache)
        h, residual = self.post_attention_layernorm(h, backend, residual)
        return self.mlp(h, backend), residual


class LlamaForCausalLM(nn.Module):
    def __init__(self, config, max_positions: int | None = None) -> None:
        super().__init__()
        self.config = config
        # Given its tensor, the embedding skips its random init (the weights are loaded next): on the meta device
        # that init would import torch's Python reference kernels, over a second of every engine's start.
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size,
                                         _weight=torch.empty(config.vocab_size, config.hidden_size))
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        if not self.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.max_positions = max_positions or config.max_position_embeddings
        self.packed_lm_head: nn.Module | None = None  # the CPU GEMMs' LM head (pack_for_cpu)

    def rotary_embedding(self, dtype: torch.dtype, device) -> RotaryEmbedding:
        """The model's rotary tables for `max_positions` positions, for its backend."""
        return RotaryEmbedding.from_config(self.config, self.max_positions, dtype, device)

    def forward(self, input_ids: torch.Tensor, backend: AttentionBackend, meta, kv_caches: list[KVCache]) -> torch.Tensor:
        """Hidden states [T, hidden] of the step's rows; `meta` is `backend.prepare(batch)` of the step."""
        h = self.embed_tokens(input_ids)
        residual = None
        for layer, kv in zip(self.layers, kv_caches):
            h, residual = layer(h, residual, backend, meta, kv)
        return self.norm(h, backend, residual)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.packed_lm_head is not None:
            return self.packed_lm_head(hidden)
        weight = self.embed_tokens.weight if self.tie_word_embeddings else self.lm_head.weight
        return F.linear(hidden, weight)

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

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy Hugging Face tensors into the fused parameters; error on anything missing or unknown."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        cfg = self.config
        hd = head_dim_of(cfg)
        q_size, kv_size = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
        shards = {
            "q_proj": ("qkv_proj", 0, q_size),
            "k_proj": ("qkv_proj", q_size, kv_size),
            "v_proj": ("qkv_proj", q_size + kv_size, kv_size),
            "gate_proj": ("gate_up_proj", 0, cfg.intermediate_size),
            "up_proj": ("gate_up_proj", cfg.intermediate_size, cfg.intermediate_size),
        }
        for name, tensor in weights:
            if "rotary_emb" in name:
                continue
            if name.startswith("model."):
                name = name[len("model.") :]
            if name == "lm_head.weight" and self.tie_word_embeddings:
                continue
            parts = name.split(".")
            target, offset, size = name, None, None
            for i, part in enumerate(parts):
                if part in shards:
                    fused, offset, size = shards[part]
                    target = ".".join(parts[:i] + [fused] + parts[i + 1 :])
                    break
            if target not in params:
                raise ValueError(f"unexpected weight {name!r} for {cfg.model_type}")
            param = params[target]
            with torch.no_grad():
                dst = param if offset is None else param.narrow(0, offset, size)
                if dst.shape != tensor.shape:
                    raise ValueError(f"weight {name!r} has shape {tuple(tensor.shape)}, expected {tuple(dst.shape)}")
                dst.copy_(tensor)
            loaded.add(f"{target}:{offset}")
        expected = set()
        for pname in params:
            if pname.endswith("qkv_proj.weight") or pname.endswith("qkv_proj.bias"):
                expected |= {f"{pname}:0", f"{pname}:{q_size}", f"{pname}:{q_size + kv_size}"}
            elif pname.endswith("gate_up_proj.weight") or pname.endswith("gate_up_proj.bias"):
                expected |= {f"{pname}:0", f"{pname}:{cfg.intermediate_size}"}
            else:
                expected.add(f"{pname}:None")
        missing = sorted(expected - loaded)
        if missing:
            raise ValueError(f"weights missing from the checkpoint: {', '.join(missing[:8])}")
