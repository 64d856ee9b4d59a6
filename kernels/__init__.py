"""hetero_infer.kernels: inference primitives with Triton kernels and PyTorch references.

Every public function validates its arguments (TypeError for a wrong type or dtype,
ValueError for a wrong shape, device mix or value) and then dispatches:

* CUDA tensors and Triton importable -> the Triton kernel;
* otherwise -> the PyTorch reference in :mod:`hetero_infer.kernels.reference`.

Force one path with ``HETERO_INFER_KERNELS=auto|triton|reference`` (read at import),
:func:`set_backend` or the :func:`use_backend` context manager. The ``triton`` backend
with CPU tensors runs the kernels in Triton's interpreter (``TRITON_INTERPRET=1`` must be
set before the first kernel call); the test-suite does this.

Primitives (see docs/kernels.md for the math, layouts and numbers):

* KV cache and attention: :func:`write_kv_cache`, :func:`rotary_and_write_kv` (q/k norm, rotary and KV
  write fused), :func:`paged_attention_decode`,
  :func:`paged_attention_prefill`.
* Layers: :func:`rms_norm` (fused residual add), :func:`rotary_embedding` with
  :func:`compute_cos_sin_cache` (default / linear / llama3 scaling), :func:`silu_and_mul`.
* Weight-only quantization: :func:`quantize_int8`, :func:`dequantize_int8`,
  :func:`quantize_int4`, :func:`dequantize_int4`, :func:`int8_matmul` (W8A16),
  :func:`int4_matmul` (W4A16).
* Mixture of experts: :func:`moe_routing`, :func:`fused_moe` (one grouped GEMM over all experts; float,
  INT8 or INT4 experts as :class:`ExpertWeights`).
* LoRA over a batch of mixed adapters: :func:`lora_shrink`, :func:`lora_expand`, :func:`lora_apply` (with
  :func:`lora_groups`, the CPU path's grouping).
* Sampling: :func:`top_k_top_p_filter`.
"""

from . import reference
from ._backend import BACKENDS, get_backend, interpret_mode, set_backend, triton_available, use_backend
from .attention import (
    MAX_HEAD_DIM,
    decode_workspace,
    paged_attention_decode,
    paged_attention_prefill,
    rotary_and_write_kv,
    write_kv_cache,
)
from .lora import LoRAGroups, lora_apply, lora_expand, lora_groups, lora_shrink
from .moe import ExpertWeights, fused_moe, moe_routing
from .ops import compute_cos_sin_cache, compute_inv_freq, rms_norm, rotary_embedding, silu_and_mul
from .quant import (
    INT4_GROUP_SIZES,
    dequantize_int4,
    dequantize_int8,
    int4_matmul,
    int8_matmul,
    quantize_int4,
    quantize_int8,
    unpack_int4,
)
from .sampling import top_k_top_p_filter

__all__ = [
    "BACKENDS",
    "ExpertWeights",
    "INT4_GROUP_SIZES",
    "MAX_HEAD_DIM",
    "compute_cos_sin_cache",
    "compute_inv_freq",
    "decode_workspace",
    "dequantize_int4",
    "dequantize_int8",
    "fused_moe",
    "get_backend",
    "int4_matmul",
    "int8_matmul",
    "interpret_mode",
    "LoRAGroups",
    "lora_apply",
    "lora_expand",
    "lora_groups",
    "lora_shrink",
    "moe_routing",
    "paged_attention_decode",
    "rotary_and_write_kv",
    "paged_attention_prefill",
    "quantize_int4",
    "quantize_int8",
    "reference",
    "rms_norm",
    "rotary_embedding",
    "set_backend",
    "silu_and_mul",
    "top_k_top_p_filter",
    "triton_available",
    "unpack_int4",
    "use_backend",
    "write_kv_cache",
]
