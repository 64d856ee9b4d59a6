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

from hetero_infer.worker import cpu_ops
from hetero_infer.worker.attention import AttentionMetadata, paged_attention, reference_paged_attention


class RMSNorm(nn.Module):
    use_kernels = False  # set per instance by LlamaForCausalLM.use_kernels
    use_cpu_ops = False  # set per instance by LlamaForCausalLM.use_cpu_ops

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """RMSNorm(x); with `residual`, (RMSNorm(residual + x), residual + x), the sum in x's dtype."""
        if self.use_kernels:
            from hetero_infer import kernels

            return kernels.rms_norm(x, self.weight, self.eps, residual)
        if self.use_cpu_ops and x.dim() == 2 and x.is_contiguous():
            if residual is None:
                return cpu_ops.add_rms_norm(None, x, self.weight, self.eps)
            return cpu_ops.add_rms_norm(x, residual, self.weight, self.eps), residual  # residual updated in place
        if residual is not None:
            residual = residual + x
            return self._norm(residual), residual
        return self._norm(x)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_tables(config, max_positions: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables [max_positions, head_dim] computed exactly as transformers does."""
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


class Attention(nn.Module):
    use_kernels = False
    use_cpu_ops = False

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

    def forward(self, x, rope, meta: AttentionMetadata, kv_cache) -> torch.Tensor:
        t = x.shape[0]
        qkv = self.qkv_proj(x)
        hq, hk = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        q = qkv[:, :hq].view(t, self.num_heads, self.head_dim)
        k = qkv[:, hq : hq + hk].view(t, self.num_kv_heads, self.head_dim)
        v = qkv[:, hq + hk :].view(t, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.use_kernels:
            from hetero_infer import kernels

            positions, cos_sin_cache = rope
            q, k = kernels.rotary_embedding(positions, q, k, cos_sin_cache)
        elif self.use_cpu_ops:  # rotary in place and the cache write in one pass
            positions, cos, sin = rope
            k_cache, v_cache = kv_cache
            cpu_ops.rope_and_cache(q, k, v, positions, cos, sin, k_cache, v_cache, meta.slot_mapping)
            o = reference_paged_attention(q, k, v, k_cache, v_cache, meta, self.scale)
            return self.o_proj(o.reshape(t, hq))
        else:
            cos, sin = rope
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
        o = paged_attention(q, k, v.contiguous(), kv_cache[0], kv_cache[1], meta, self.scale)
        return self.o_proj(o.reshape(t, hq))


class MLP(nn.Module):
    use_kernels = False
    use_cpu_ops = False

    def __init__(self, config) -> None:
        super().__init__()
        bias = bool(getattr(config, "mlp_bias", False))
        self.intermediate = config.intermediate_size
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=bias)
        if getattr(config, "hidden_act", "silu") != "silu":
            raise ValueError(f"unsupported activation {config.hidden_act!r} (only silu)")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        if self.use_kernels:
            from hetero_infer import kernels

            return self.down_proj(kernels.silu_and_mul(gate_up))
        if self.use_cpu_ops:
            return self.down_proj(cpu_ops.silu_and_mul(gate_up))
        return self.down_proj(F.silu(gate_up[:, : self.intermediate]) * gate_up[:, self.intermediate :])


class DecoderLayer(nn.Module):
    def __init__(self, config, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = Attention(config, layer_idx)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, h, residual, rope, meta, kv_cache):
        """(layer input, residual stream) -> (MLP output, residual stream); residual None on the first layer."""
        if residual is None:
            residual = h
            h = self.input_layernorm(h)
        else:
            h, residual = self.input_layernorm(h, residual)
        h = self.self_attn(h, rope, meta, kv_cache)
        h, residual = self.post_attention_layernorm(h, residual)
        return self.mlp(h), residual


class LlamaForCausalLM(nn.Module):
    def __init__(self, config, max_positions: int | None = None) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        if not self.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.max_positions = max_positions or config.max_position_embeddings
        self.cos: torch.Tensor | None = None
        self.sin: torch.Tensor | None = None
        self.cos_sin_cache: torch.Tensor | None = None  # kernels' layout: cos half | sin half
        self.kernels_enabled = False
        self.cpu_ops_enabled = False
        self.packed_logits_weight: torch.Tensor | None = None

    def init_rope(self, dtype: torch.dtype, device) -> None:
        cos, sin = rope_tables(self.config, self.max_positions, device)
        self.cos, self.sin = cos.to(dtype), sin.to(dtype)
        half = cos.shape[-1] // 2
        self.cos_sin_cache = torch.cat((cos[:, :half], sin[:, :half]), dim=-1).contiguous()

    def use_kernels(self, enabled: bool = True) -> None:
        """Run norms, rotary, activation and attention through hetero_infer.kernels (Triton)."""
        self.kernels_enabled = enabled
        for module in self.modules():
            if isinstance(module, (RMSNorm, Attention, MLP)):
                module.use_kernels = enabled

    def use_cpu_ops(self, enabled: bool = True) -> None:
        """Run norms, rotary + cache write and activation through the fused C ops of `cpu_ops`."""
        self.cpu_ops_enabled = enabled
        for module in self.modules():
            if isinstance(module, (RMSNorm, Attention, MLP)):
                module.use_cpu_ops = enabled

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata, kv_caches) -> torch.Tensor:
        h = self.embed_tokens(input_ids)
        if self.kernels_enabled:
            rope = (positions, self.cos_sin_cache)
        elif self.cpu_ops_enabled:
            rope = (positions, self.cos, self.sin)
        else:
            rope = (self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1))
        residual = None
        for layer, kv in zip(self.layers, kv_caches):
            h, residual = layer(h, residual, rope, meta, kv)
        return self.norm(h, residual)[0]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.packed_logits_weight is not None:
            from hetero_infer.worker.cpu_linear import packed_linear

            return packed_linear(hidden, self.packed_logits_weight, None)
        weight = self.embed_tokens.weight if self.tie_word_embeddings else self.lm_head.weight
        return F.linear(hidden, weight)

    def pack_for_cpu(self) -> int:
        """Pre-pack every projection and the LM head for the CPU GEMMs (see cpu_linear), quantized projections
        included where their GEMM runs; return the count."""
        from hetero_infer.worker.cpu_linear import pack_linears, pack_weight
        from hetero_infer.worker.quantization import QuantizedLinear

        weight = self.embed_tokens.weight if self.tie_word_embeddings else self.lm_head.weight
        self.packed_logits_weight = pack_weight(weight)
        if not self.tie_word_embeddings:
            del self.lm_head  # its packed copy is all the logits need
        quantized = sum(m.pack_for_cpu(weight.dtype) for m in self.modules() if isinstance(m, QuantizedLinear))
        return pack_linears(self) + quantized + 1

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
