"""Reading a PEFT LoRA adapter folder (`adapter_config.json` + `adapter_model.safetensors`) and checking it against
the model it is to run on: every way it can be wrong is a `LoRAAdapterError` that says what is wrong, raised before
anything is kept. Shared by every executor (the torch one and the mock, so that both refuse the same adapters).

The weights are PEFT's: per projection `lora_A` [r, in] and `lora_B` [out, r]; the update is
`x @ A^T @ B^T * scale`, `scale = lora_alpha / r` (`lora_alpha / sqrt(r)` with `use_rslora`), with PEFT's
`rank_pattern` / `alpha_pattern` per module.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hetero_infer.contracts.lora import LoRAAdapterError, LoRARequest

CONFIG_FILE = "adapter_config.json"
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")
ATTENTION_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
# PEFT's key of one LoRA weight: ...layers.<i>.<self_attn|mlp>.<projection>.lora_<A|B>.weight
_KEY = re.compile(r"(?:^|\.)layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.\w+)?\.weight$")


@dataclass(frozen=True)
class ModelShapes:
    """What an adapter must fit: the layers, and each projection it may target with its (in, out) sizes."""

    model_type: str
    num_layers: int | None
    projections: dict[str, tuple[int | None, int | None]]  # name -> (in_features, out_features); None: unknown
    refused: dict[str, str] = field(default_factory=dict)  # projections the model has that take no adapter: why

    @classmethod
    def of(cls, config: Any, moe: bool = False) -> ModelShapes:
        """From a Hugging Face config (or any object with its fields; a missing field is not checked). `moe`:
        the MLPs are experts, which take no adapter here (attention only)."""
        def get(name: str) -> int | None:
            value = getattr(config, name, None)
            return value if isinstance(value, int) else None

        hidden, heads, kv_heads = get("hidden_size"), get("num_attention_heads"), get("num_key_value_heads")
        head_dim = get("head_dim") or (hidden // heads if hidden and heads else None)
        kv_heads = kv_heads or heads
        q = heads * head_dim if heads and head_dim else None
        kv = kv_heads * head_dim if kv_heads and head_dim else None
        projections = {"q_proj": (hidden, q), "k_proj": (hidden, kv), "v_proj": (hidden, kv), "o_proj": (q, hidden)}
        refused = {}
        if moe:
            why = "its MLPs are mixture-of-experts layers, which take no LoRA here (attention only)"
            refused = {p: why for p in (*MLP_PROJECTIONS, "gate_up_proj")}
        else:
            inter = get("intermediate_size")
            projections.update(gate_proj=(hidden, inter), up_proj=(hidden, inter), down_proj=(inter, hidden))
        return cls(str(getattr(config, "model_type", "") or "the model"), get("num_hidden_layers"), projections, refused)


def config_json_shapes(folder: Path) -> ModelShapes | None:
    """The shapes in a model folder's config.json (an executor that runs no model: the mock); None without one."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        return None
    from types import SimpleNamespace

    from hetero_infer.worker.runner.models.registry import family_of

    raw = json.loads(path.read_text())
    try:
        moe = family_of(raw).supports.moe
    except ValueError:
        moe = False
    return ModelShapes.of(SimpleNamespace(**raw), moe=moe)


@dataclass
class AdapterWeights:
    """A checked adapter in host memory: per (layer, projection) its A [r, in], B [out, r] and scale."""

    request: LoRARequest
    rank: int  # the largest rank of its modules
    modules: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor, float]]

    @property
    def name(self) -> str:
        return self.request.lora_name

    @property
    def nbytes(self) -> int:
        return sum(a.numel() * a.element_size() + b.numel() * b.element_size() for a, b, _ in self.modules.values())


def _fail(request: LoRARequest, message: str) -> LoRAAdapterError:
    return LoRAAdapterError(f"LoRA adapter {request.lora_name!r} ({request.lora_path}): {message}")


def _pattern_value(patterns: dict[str, Any], module: str, default: Any) -> Any:
    """PEFT's per-module override: the first key that matches the module's full name as a suffix."""
    for key, value in (patterns or {}).items():
        if re.match(rf"(.*\.)?{key}$", module):
            return value
    return default


def read_config(request: LoRARequest) -> dict[str, Any]:
    """The adapter's config, checked for what this engine does not apply (LoRAAdapterError)."""
    folder = Path(request.lora_path)
    if not folder.is_dir():
        raise _fail(request, "no such folder")
    path = folder / CONFIG_FILE
    if not path.is_file():
        raise _fail(request, f"no {CONFIG_FILE} in the folder (not a PEFT adapter)")
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise _fail(request, f"{CONFIG_FILE} is not readable JSON: {exc}") from None
    if not isinstance(config, dict):
        raise _fail(request, f"{CONFIG_FILE} is not a JSON object")
    kind = config.get("peft_type", "LORA")
    if str(kind).upper() != "LORA":
        raise _fail(request, f"peft_type {kind!r}: only LORA adapters are served")
    if config.get("use_dora"):
        raise _fail(request, "DoRA adapters (use_dora) are not supported")
    if config.get("bias", "none") not in ("none", None):
        raise _fail(request, f"bias={config['bias']!r}: only adapters without trained biases (bias='none') are served")
    if config.get("modules_to_save"):
        raise _fail(request, f"modules_to_save {config['modules_to_save']!r}: only LoRA weights are served, not "
                             "fully trained modules")
    if config.get("fan_in_fan_out"):
        raise _fail(request, "fan_in_fan_out adapters (Conv1D models) are not supported")
    if not isinstance(config.get("r", 8), int) or not isinstance(config.get("lora_alpha", 8), (int, float)):
        raise _fail(request, "r must be an integer and lora_alpha a number")
    return config


def _read_tensors(request: LoRARequest) -> dict[str, torch.Tensor]:
    folder = Path(request.lora_path)
    for name in WEIGHT_FILES:
        path = folder / name
        if path.is_file():
            try:
                if name.endswith(".safetensors"):
                    from safetensors.torch import load_file

                    return load_file(str(path))
                return torch.load(str(path), map_location="cpu", weights_only=True)
            except Exception as exc:
                raise _fail(request, f"{name} is not readable: {type(exc).__name__}: {exc}") from None
    raise _fail(request, f"no weights in the folder ({' or '.join(WEIGHT_FILES)})")


def load_adapter(request: LoRARequest, shapes: ModelShapes, max_rank: int,
                 dtype: torch.dtype = torch.float32) -> AdapterWeights:
    """Read and check the adapter at `request.lora_path` against the model (`shapes`) and `max_rank`
    (LoRAAdapterError naming what is wrong); its weights in `dtype` on the CPU."""
    config = read_config(request)
    targets = config.get("target_modules")
    known = set(shapes.projections) | set(shapes.refused)
    if isinstance(targets, (list, tuple)):
        for target in targets:
            name = str(target).rsplit(".", 1)[-1]
            if name in shapes.refused:
                raise _fail(request, f"target module {name}: {shapes.model_type} {shapes.refused[name]}")
            if name not in known:
                raise _fail(request, f"target module {target!r} is not in the model ({shapes.model_type} has "
                                     f"{', '.join(sorted(known))})")
    params = config.get("target_parameters")
    if params:  # peft's LoRA on raw parameters: what it makes of MoE experts' stacked weights
        why = next((shapes.refused[str(p)] for p in params if str(p) in shapes.refused), None) or (
            "LoRA on raw parameters is not supported")
        raise _fail(request, f"target_parameters {list(params)!r}: {shapes.model_type} {why}")
    tensors = _read_tensors(request)
    pairs: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        m = _KEY.search(key)
        if m is None:
            raise _fail(request, f"weight {key!r} is not a LoRA weight of an attention or MLP projection "
                                 f"(layers.N.self_attn|mlp.<q|k|v|o|gate|up|down>_proj.lora_A|lora_B.weight)")
        layer, _, proj, ab = int(m.group(1)), m.group(2), m.group(3), m.group(4)
        if proj in shapes.refused:
            raise _fail(request, f"target module {proj}: {shapes.model_type} {shapes.refused[proj]}")
        if proj not in shapes.projections:
            raise _fail(request, f"target module {proj!r} is not in the model ({shapes.model_type} has "
                                 f"{', '.join(sorted(known))})")
        if shapes.num_layers is not None and layer >= shapes.num_layers:
            raise _fail(request, f"it has weights for layer {layer}; the model has {shapes.num_layers} layers "
                                 "(an adapter for another base model?)")
        if tensor.dim() != 2:
            raise _fail(request, f"weight {key!r} has shape {tuple(tensor.shape)}, not a matrix")
        pairs.setdefault((layer, proj), {})[ab] = tensor
    if not pairs:
        raise _fail(request, "its weights hold no LoRA matrices")
    default_r, default_alpha = config.get("r", 8), config.get("lora_alpha", 8)
    rslora = bool(config.get("use_rslora"))
    modules: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor, float]] = {}
    top = 0
    for (layer, proj), ab in sorted(pairs.items()):
        if set(ab) != {"A", "B"}:
            raise _fail(request, f"layers.{layer}.{proj} has lora_{next(iter(ab))} without lora_"
                                 f"{'B' if 'A' in ab else 'A'}")
        a, b = ab["A"], ab["B"]
        r = a.shape[0]
        if b.shape[1] != r:
            raise _fail(request, f"layers.{layer}.{proj}: lora_A has rank {r}, lora_B {b.shape[1]}")
        if r > max_rank:
            raise _fail(request, f"rank {r} (layers.{layer}.{proj}) > max_lora_rank {max_rank}: start the engine "
                                 f"with max_lora_rank >= {r}")
        want_in, want_out = shapes.projections[proj]
        for what, got, want in (("input", a.shape[1], want_in), ("output", b.shape[0], want_out)):
            if want is not None and got != want:
                raise _fail(request, f"{proj} {what} size {got} != the model's {want} (an adapter for another "
                                     f"base model, not {shapes.model_type} of these sizes)")
        full = f"model.layers.{layer}.{'mlp' if proj in MLP_PROJECTIONS else 'self_attn'}.{proj}"
        alpha = _pattern_value(config.get("alpha_pattern"), full, default_alpha)
        expected_r = _pattern_value(config.get("rank_pattern"), full, default_r)
        if expected_r != r:
            raise _fail(request, f"layers.{layer}.{proj} has rank {r}, its config says {expected_r}")
        scale = alpha / math.sqrt(r) if rslora else alpha / r
        modules[(layer, proj)] = (a.to(dtype).contiguous(), b.to(dtype).contiguous(), float(scale))
        top = max(top, r)
    return AdapterWeights(request, top, modules)
