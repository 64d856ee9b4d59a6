"""Weight-only quantization of a loaded model: INT8 per output channel (W8A16) or INT4 in
groups along K (W4A16), through `hetero_infer.kernels` (Triton on CUDA, PyTorch elsewhere), or on CPUs with
AVX512_BF16 and bfloat16 activations through the project's C GEMM (`cpu_linear`, after `pack_for_cpu`).

Only the decoder's projections are quantized (the Linears its family names: `quant_projections`, e.g.
qkv_proj, o_proj, gate_up_proj, down_proj) and the experts of MoE layers (worker/quant/experts.py, every expert's
gate|up and down, round to nearest); embeddings, lm_head, norms and MoE routers stay in the model dtype, as in
most weight-only schemes.

How the integers are chosen (the format, and so the kernels, are the same either way):

* GPTQ, when calibration text is at hand (by default: the fixed chat conversations of
  `quant_calibration`, rendered with the tokenizer of the model's folder). As in the GPTQ
  reference implementation, layers are quantized in order, each projection from the inputs
  it sees with everything before it already quantized: the calibration tokens run through
  the model once to the first decoder layer, then through each layer as it is quantized.
* Otherwise round to nearest: INT8 over each row's range, INT4 over each group's range
  chosen by clip search (`kernels.quantize_int4`). HETERO_INFER_GPTQ=0 asks for this
  (a faster load: GPTQ takes 30-50 s for the default model on 2 CPU cores).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from hetero_infer import kernels
from hetero_infer.kernels.cpu import linear as cpu_linear
from hetero_infer.worker.quant.experts import quantize_experts
from hetero_infer.worker.runner.models.rotary import head_dim_of

log = logging.getLogger(__name__)

METHODS = ("int8", "int4")
PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")  # for a model that does not name its own
INT4_GROUP_SIZE = 128


@dataclass(frozen=True)
class QuantReport:
    method: str
    bytes_before: int  # parameters and buffers of the whole model, before
    bytes_after: int
    num_quantized: int  # Linear layers replaced, and stacks of experts' projections (two per MoE layer)
    calibration_tokens: int = 0  # tokens the GPTQ statistics came from; 0: rounded to nearest

    @property
    def ratio(self) -> float:
        return self.bytes_after / self.bytes_before


def int4_group_size(in_features: int, preferred: int = INT4_GROUP_SIZE) -> int:
    """`preferred`, or the largest smaller supported group dividing K (SmolLM2's K = 576 is not a multiple of 128)."""
    for g in sorted((g for g in kernels.INT4_GROUP_SIZES if g <= preferred), reverse=True):
        if in_features % g == 0:
            return g
    raise ValueError(f"INT4 needs in_features divisible by one of {kernels.INT4_GROUP_SIZES}; got {in_features}")


class QuantizedLinear(nn.Module):
    """A Linear layer with INT8 (per output channel) or INT4 (asymmetric, per group) weights.

    The activations and output keep their dtype (float32 accumulation); scales are float32.
    """

    def __init__(self, in_features: int, out_features: int, method: str, group_size: int = INT4_GROUP_SIZE,
                 bias: torch.Tensor | None = None, device: torch.device | str | None = None) -> None:
        super().__init__()
        if method not in METHODS:
            raise ValueError(f"unknown quantization method {method!r}; expected one of {METHODS}")
        self.in_features, self.out_features, self.method = in_features, out_features, method
        n, k = out_features, in_features
        if method == "int8":
            self.group_size = k
            self.register_buffer("qweight", torch.zeros(n, k, dtype=torch.int8, device=device))
            self.register_buffer("scales", torch.ones(n, dtype=torch.float32, device=device))
            self.zeros: torch.Tensor | None = None
        else:
            if group_size not in kernels.INT4_GROUP_SIZES or k % group_size:
                raise ValueError(f"group_size {group_size} must be one of {kernels.INT4_GROUP_SIZES} and divide K={k}")
            self.group_size = group_size
            self.register_buffer("qweight", torch.zeros(n, k // 2, dtype=torch.uint8, device=device))
            self.register_buffer("scales", torch.ones(n, k // group_size, dtype=torch.float32, device=device))
            self.register_buffer("zeros", torch.zeros(n, k // group_size, dtype=torch.uint8, device=device))
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)
        self.cpu_packed: cpu_linear.PackedWeight | None = None

    @classmethod
    def from_linear(cls, linear: nn.Linear, method: str, group_size: int = INT4_GROUP_SIZE,
                    hessian: torch.Tensor | None = None) -> QuantizedLinear:
        """Quantize `linear`: GPTQ with `hessian` (the mean of x x^T over calibration inputs), else round to nearest
        (INT4 with clip search)."""
        w = linear.weight.detach()
        if method == "int4":
            group_size = int4_group_size(linear.in_features, group_size)
        layer = cls(linear.in_features, linear.out_features, method, group_size, linear.bias, device=w.device)
        if method == "int8":
            q, s = kernels.quantize_int8(w, hessian=hessian)
            layer.qweight.copy_(q)
            layer.scales.copy_(s)
        else:
            q, s, z = kernels.quantize_int4(w, layer.group_size, clip_search=True, hessian=hessian)
            layer.qweight.copy_(q)
            layer.scales.copy_(s)
            layer.zeros.copy_(z)
        return layer

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        if self.cpu_packed is not None:
            raise RuntimeError("the weights are in the CPU GEMM's layout (pack_for_cpu); dequantize before packing")
        if self.method == "int8":
            return kernels.dequantize_int8(self.qweight, self.scales, dtype)
        return kernels.dequantize_int4(self.qweight, self.scales, self.zeros, self.group_size, dtype)

    def pack_for_cpu(self, activation_dtype: torch.dtype) -> bool:
        """Move the weights into the layout of the C W8A16 / W4A16 GEMM (the same number of weight bytes; the
        kernels' layout is dropped) where it runs: CPU tensors, bfloat16 activations, AVX512_BF16. A decode step
        then reads 1 or 0.5 bytes per weight instead of the reference's dequantization to float32 on every
        call. Returns whether it did."""
        if (self.cpu_packed is not None or activation_dtype != torch.bfloat16 or self.qweight.device.type != "cpu"
                or not cpu_linear.quantized_gemm_available()):
            return False
        if self.method == "int8":
            packed = cpu_linear.pack_int8(self.qweight, self.scales)
        else:
            levels = kernels.unpack_int4(self.qweight, self.group_size)
            packed = cpu_linear.pack_int4(levels, self.scales, self.zeros, self.group_size)
        del self.qweight, self.scales
        self.zeros = None  # (INT4: a None buffer, which buffers() skips)
        # as buffers, so that weight_bytes and .to() see them
        self.register_buffer("packed_qweight", packed.data)
        self.register_buffer("packed_scales", packed.scales)
        if packed.zeros is not None:
            self.register_buffer("packed_zeros", packed.zeros)
        self.cpu_packed = packed
        return True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.cpu_packed is not None:
            return cpu_linear.packed_linear(x, self.cpu_packed, self.bias)
        if self.method == "int8":
            return kernels.int8_matmul(x, self.qweight, self.scales, self.bias)
        return kernels.int4_matmul(x, self.qweight, self.scales, self.zeros, self.group_size, self.bias)

    def extra_repr(self) -> str:
        group = f", group_size={self.group_size}" if self.method == "int4" else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, method={self.method}{group}, "
                f"bias={self.bias is not None}")


def weight_bytes(model: nn.Module) -> int:
    """Bytes of all parameters and buffers (tied tensors once)."""
    tensors = {id(t): t for t in (*model.parameters(), *model.buffers())}
    return sum(t.numel() * t.element_size() for t in tensors.values())


_AUTO = "auto"


@torch.no_grad()
def quantize_model(model: nn.Module, method: str, group_size: int = INT4_GROUP_SIZE,
                   calibration: Sequence[Sequence[int]] | str | None = _AUTO) -> QuantReport:
    """Replace the projection Linears of a loaded model by QuantizedLinear, and its experts by QuantizedExperts,
    in place.

    calibration: token-id sequences for GPTQ; "auto": `calibration_tokens(model)` (None when the model has no
    tokenizer folder or HETERO_INFER_GPTQ=0); None (or a model without decoder `layers`): round to nearest.
    """
    if method not in METHODS:
        raise ValueError(f"unknown quantization method {method!r}; expected one of {METHODS}")
    before = weight_bytes(model)
    if isinstance(calibration, str):
        if calibration != _AUTO:
            raise ValueError(f"calibration must be token-id sequences, None or {_AUTO!r}")
        calibration = calibration_tokens(model) if os.environ.get("HETERO_INFER_GPTQ", "1") != "0" else None
    supported = getattr(getattr(model, "family", None), "supports", None)
    if supported is not None and method not in supported.quantization:
        raise ValueError(f"{type(model).__name__} does not support {method} (it supports {supported.quantization})")
    projections = getattr(model, "quant_projections", PROJECTIONS)
    tokens = 0
    if calibration and isinstance(getattr(model, "layers", None), nn.ModuleList):
        count, tokens = _quantize_sequential(model, method, group_size, [list(s) for s in calibration], projections)
    else:
        # (parent, name) only: holding no reference to the float Linear frees it as soon as it is replaced
        targets = [(parent, name) for parent in model.modules() for name, child in parent.named_children()
                   if name in projections and isinstance(child, nn.Linear)]
        for parent, name in targets:
            setattr(parent, name, QuantizedLinear.from_linear(getattr(parent, name), method, group_size))
        count = len(targets)
    count += quantize_experts(model, method, group_size)
    return QuantReport(method, before, weight_bytes(model), count, tokens)


def calibration_tokens(model: nn.Module) -> list[list[int]] | None:
    """The `quant_calibration` conversations, tokenized by the tokenizer in the model's folder
    (`config.name_or_path`; through its chat template when it has one, else as plain text) and cut to the model's
    length; None without a local tokenizer."""
    from hetero_infer.contracts.tokenizer import Tokenizer
    from hetero_infer.worker.quant.calibration import CONVERSATIONS

    folder = getattr(getattr(model, "config", None), "name_or_path", None)
    if not folder or not Path(folder).is_dir():
        return None
    try:
        tokenizer = Tokenizer.from_pretrained(folder)
        if getattr(tokenizer.hf, "chat_template", None):
            seqs = [tokenizer.apply_chat_template([{"role": "user", "content": prompt},
                                                   {"role": "assistant", "content": answer}],
                                                  add_generation_prompt=False)
                    for prompt, answer in CONVERSATIONS]
        else:
            seqs = [tokenizer.encode(f"{prompt}\n{answer}") for prompt, answer in CONVERSATIONS]
    except Exception as e:  # no usable tokenizer in the folder
        log.warning("no calibration text for GPTQ (%s: %s): rounding to nearest", type(e).__name__, e)
        return None
    limit = getattr(model, "max_positions", None) or max(len(s) for s in seqs)
    return [s[:limit] for s in seqs]


class _Captured(Exception):
    """Raised by a hook to stop a forward pass once it has what it needs."""


def _quantize_sequential(model: nn.Module, method: str, group_size: int, seqs: list[list[int]],
                         projections: Sequence[str]) -> tuple[int, int]:
    """GPTQ layer by layer ("true sequential"); returns (Linears replaced, calibration tokens)."""
    inputs = _first_layer_inputs(model, seqs)
    count = 0
    for layer in model.layers:
        # projections in execution order; each one's inputs come through the projections quantized before it
        targets = [(parent, name) for name in projections for parent in layer.modules()
                   if isinstance(getattr(parent, name, None), nn.Linear)]
        quantized = []
        for parent, name in targets:
            linear = getattr(parent, name)
            hessian = _input_hessian(layer, linear, inputs)
            quantized.append(QuantizedLinear.from_linear(linear, method, group_size, hessian=hessian))
            # until the layer is done, a float Linear with the quantized weight (faster than the CPU reference)
            linear.weight.copy_(quantized[-1].dequantized_weight(linear.weight.dtype))
        # a layer returns the leading arguments of the next one (hidden states, or hidden states and residual)
        out = layer(*_copies(inputs))
        out = out if isinstance(out, tuple) else (out,)
        inputs = (*out, *inputs[len(out):])
        for (parent, name), q in zip(targets, quantized, strict=True):
            setattr(parent, name, q)
        count += len(targets)
    return count, sum(len(s) for s in seqs)


def _copies(inputs: tuple) -> tuple:
    """`inputs` with its tensors cloned: a layer may update its residual input in place."""
    return tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in inputs)


def _first_layer_inputs(model: nn.Module, seqs: list[list[int]]) -> tuple:
    """The arguments of the first decoder layer for `seqs` (one prefill chunk each): hidden states (and whatever
    else the model passes from layer to layer), then the attention backend, its metadata and a scratch KV cache,
    the same for every layer."""
    from hetero_infer.worker.runner.attention import StepBatch, TorchBackend

    device, dtype = model.embed_tokens.weight.device, model.embed_tokens.weight.dtype
    batch = StepBatch.fresh_prompts([len(s) for s in seqs], block_size=1)
    cfg = model.config
    kv = torch.zeros(2, batch.num_blocks, 1, model.num_kv_heads, head_dim_of(cfg), dtype=dtype, device=device)
    backend = TorchBackend(model.rotary_embedding(dtype, device), device)  # calibrated on the reference path
    meta = backend.prepare(batch)
    ids = torch.tensor([t for s in seqs for t in s], device=device)
    captured = {}

    def capture(module, inputs):
        captured["inputs"] = inputs
        raise _Captured

    hook = model.layers[0].register_forward_pre_hook(capture)
    try:
        model(ids, backend, meta, [(kv[0], kv[1])] * len(model.layers))
    except _Captured:
        pass
    finally:
        hook.remove()
    return captured["inputs"]


def _input_hessian(layer: nn.Module, linear: nn.Linear, inputs: tuple) -> torch.Tensor:
    """Mean of x x^T (float32 [K, K]) over the inputs x that `linear` receives when `layer` runs on `inputs`."""
    captured = {}

    def capture(module, args):
        captured["x"] = args[0]
        raise _Captured

    hook = linear.register_forward_pre_hook(capture)
    try:
        layer(*_copies(inputs))
    except _Captured:
        pass
    finally:
        hook.remove()
    x = captured["x"].reshape(-1, linear.in_features).to(torch.float32)
    return x.t() @ x / x.shape[0]
