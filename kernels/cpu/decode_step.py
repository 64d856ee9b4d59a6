"""The decoder stack of a decode step in one C call (kernels/cpu/csrc/decode_step.c): bfloat16, a few rows.

The per-op CPU path spends about as long in Python/ctypes dispatch and OpenMP fork/joins (some 270 calls and
200 parallel regions a step) as in streaming the weights at one row. This runs all layers in one parallel
region, with the same kernels' numerics (bit for bit the per-op path's hidden states).

It engages only where its preconditions hold (`FusedDecodeStack.build` says why not otherwise): the C library
with AVX512_BF16, a bfloat16 model on the C attention backend, every projection served by the project's
bfloat16 GEMM (`gemm_bf16`) in the row buckets up to `max_rows()`, no per-head q/k norms (Qwen3). Per step it
takes steps of at most `max_rows()` rows; anything else runs the per-op path. HETERO_INFER_CPU_FUSED=0 turns
it off.
"""

from __future__ import annotations

import ctypes
import logging
import os

import torch
from torch import nn

from hetero_infer.kernels.cpu import native, select

log = logging.getLogger(__name__)

_P, _I, _F = ctypes.c_void_p, ctypes.c_int, ctypes.c_float


class _Layer(ctypes.Structure):
    _fields_ = [(name, _P) for name in (
        "input_norm", "post_norm", "qkv", "qkv_bias", "o", "o_bias", "gate_up", "gate_up_bias", "down", "down_bias",
        "k_cache", "v_cache")]


class _Shape(ctypes.Structure):
    _fields_ = [(name, _I) for name in (
        "layers", "rows", "hidden", "heads", "kv_heads", "head_dim", "intermediate", "block_size", "max_blocks")] + [
        ("eps", _F), ("scale", _F)]


def enabled() -> bool:
    return os.environ.get("HETERO_INFER_CPU_FUSED", "1") != "0"


def available() -> bool:
    """The C library is built with the fused step's instructions (AVX512_BF16)."""
    if native.library() is None:
        return False
    return bool(native.function("decode_step_available", [], _I)())


def max_rows() -> int:
    return int(native.function("decode_step_max_rows", [], _I)())


def _step_fn():
    return native.function("decode_step_bf16", [_P] * 10, _I)


class FusedDecodeStack:
    """A model's decoder layers with their packed weights and KV caches, as the C step takes them."""

    def __init__(self, model: nn.Module, backend, kv_caches, keep: list[torch.Tensor], layers: ctypes.Array,
                 shape: _Shape) -> None:
        self.model, self.backend, self.rope, self.kv_caches = model, backend, backend.rope, kv_caches
        self._keep = keep  # float32 biases: the C step holds their pointers
        self._layers, self._shape = layers, shape
        self.max_rows = max_rows()

    @classmethod
    def build(cls, model: nn.Module, backend, kv_caches, dtype: torch.dtype) -> FusedDecodeStack | None:
        """The fused stack of `model` (a LlamaForCausalLM packed for the CPU), or None with the reason logged."""
        reason = _unsupported(model, backend, dtype)
        if reason:
            log.info("fused CPU decode step off: %s", reason)
            return None
        cfg = model.config
        keep: list[torch.Tensor] = []

        def ptr(t: torch.Tensor | None) -> int | None:
            return None if t is None else t.data_ptr()

        def bias(linear) -> int | None:
            if linear.bias is None:
                return None
            keep.append(linear.bias.detach().float().contiguous())
            return keep[-1].data_ptr()

        layers = (_Layer * len(model.layers))()
        for entry, layer, (k_cache, v_cache) in zip(layers, model.layers, kv_caches):
            attn, mlp = layer.self_attn, layer.mlp
            entry.input_norm, entry.post_norm = ptr(layer.input_layernorm.weight), ptr(layer.post_attention_layernorm.weight)
            for name, linear in (("qkv", attn.qkv_proj), ("o", attn.o_proj), ("gate_up", mlp.gate_up_proj),
                                 ("down", mlp.down_proj)):
                setattr(entry, name, ptr(linear.by_bucket[0].data))
                setattr(entry, name + "_bias", bias(linear))
            entry.k_cache, entry.v_cache = ptr(k_cache), ptr(v_cache)
        a0 = model.layers[0].self_attn
        k0 = kv_caches[0][0]
        shape = _Shape(layers=len(model.layers), rows=0, hidden=cfg.hidden_size, heads=a0.num_heads,
                       kv_heads=a0.num_kv_heads, head_dim=a0.head_dim, intermediate=cfg.intermediate_size,
                       block_size=k0.shape[1], max_blocks=0, eps=cfg.rms_norm_eps, scale=a0.scale)
        return cls(model, backend, kv_caches, keep, layers, shape)

    def accepts(self, rows: int) -> bool:
        return 1 <= rows <= self.max_rows

    def run(self, input_ids: torch.Tensor, meta) -> torch.Tensor:
        """Hidden states [T, hidden] of the step's rows (the final norm applied), as the model's forward."""
        model = self.model
        h = model.embed_tokens(input_ids).contiguous()  # a fresh tensor: the C step writes into it
        residual = torch.empty_like(h)
        tables, lens = meta.block_tables, meta.context_lens
        positions, slots = meta.positions, meta.slot_mapping
        assert tables.dtype == lens.dtype == torch.int32 and positions.dtype == slots.dtype == torch.int64
        assert tables.is_contiguous() and lens.is_contiguous() and positions.is_contiguous() and slots.is_contiguous()
        shape = self._shape
        shape.rows, shape.max_blocks = h.shape[0], tables.shape[1]
        rc = _step_fn()(ctypes.addressof(self._layers), ctypes.addressof(shape), h.data_ptr(), residual.data_ptr(),
                        positions.data_ptr(), slots.data_ptr(), self.rope.cos.data_ptr(), self.rope.sin.data_ptr(),
                        tables.data_ptr(), lens.data_ptr())
        if rc != 0:
            raise RuntimeError(f"decode_step_bf16 failed ({rc})")
        return model.norm(h, self.backend, residual)[0]


def _unsupported(model: nn.Module, backend, dtype: torch.dtype) -> str | None:
    """Why the fused step cannot run `model` here, or None where it can."""
    from hetero_infer.kernels.cpu.linear import PackedLinear

    if not enabled():
        return "HETERO_INFER_CPU_FUSED=0"
    if dtype != torch.bfloat16:
        return f"dtype {dtype} (bfloat16 only)"
    if getattr(backend, "name", None) != "cpu":
        return f"attention backend {getattr(backend, 'name', backend)!r} (the C backend only)"
    if not available():
        return "no AVX512_BF16 in this build of the C kernels"
    rows_buckets = select.bucket_index(max_rows()) + 1
    for i, layer in enumerate(model.layers):
        attn, mlp = layer.self_attn, layer.mlp
        if attn.qk_norm:
            return "per-head q/k norms (Qwen3)"
        for linear in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj):
            if not isinstance(linear, PackedLinear):
                return f"layer {i}: {type(linear).__name__} is not a packed linear"
            kinds = {p.kind for p in linear.by_bucket[:rows_buckets]}
            if kinds != {"gemm_bf16"} or len({id(p) for p in linear.by_bucket[:rows_buckets]}) != 1:
                return f"layer {i}: kernels {sorted(kinds)} up to {max_rows()} rows (gemm_bf16 only)"
    if backend.rope.cos.dtype != torch.bfloat16 or not backend.rope.cos.is_contiguous():
        return "rotary tables not bfloat16"
    return None
