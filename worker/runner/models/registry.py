"""The model registry: which decoder class builds which Hugging Face architecture, and what each family supports.

One module per family under this package declares a `FAMILY` (plain data: its architectures, its model class and
a `Supports`); `FAMILY_MODULES` lists them. A checkpoint is matched by its config's `architectures` (the Hub's
name, e.g. "Qwen3MoeForCausalLM"), or, for a config.json without one, by its `model_type`. As vLLM's
models/registry.py, without its plugin machinery: a new family is a module here and a line in `FAMILY_MODULES`.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass

#: The family modules, in the order the supported list is shown.
FAMILY_MODULES = ("llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "mixtral")


@dataclass(frozen=True)
class Supports:
    """What a family's implementation here can do (False: refused or not built, never silently wrong)."""

    quantization: tuple[str, ...] = ("int8", "int4")  # weight-only methods (worker/quant)
    cpu_fused_decode: bool = False  # its layers are in a layout the C decode step computes (kernels/cpu/decode_step)
    # LoRA adapters (worker/runner/lora): attention projections, and MLP projections where the MLPs are dense
    lora: bool = True
    tensor_parallel: bool = False
    moe: bool = False  # Mixture-of-Experts layers (kernels.fused_moe)
    gguf: bool = True  # its .gguf files convert through transformers (the gguf package maps the tensors)


@dataclass(frozen=True)
class SlidingWindow:
    """How the family's config class fills `sliding_window` (serving_fields reads config.json without it)."""

    default_when_absent: bool = False  # the class gives a window when config.json has no `sliding_window` (Mistral)
    switch: str | None = None  # a flag that gates the window, default off when absent (Qwen's `use_sliding_window`)


@dataclass(frozen=True)
class ModelFamily:
    name: str
    architectures: tuple[str, ...]  # HF `architectures` names it builds
    model_types: tuple[str, ...]  # HF `model_type`s (for a config.json without `architectures`)
    model_class: type  # built as model_class(hf_config, max_positions=...)
    supports: Supports
    description: str  # for the supported list: the models it serves
    sliding_window: SlidingWindow = SlidingWindow()


@functools.cache
def families() -> tuple[ModelFamily, ...]:
    return tuple(importlib.import_module(f"{__package__}.{name}").FAMILY for name in FAMILY_MODULES)


def supported_list() -> str:
    """"LlamaForCausalLM (Llama 2/3, SmolLM), ..." for error messages and docs."""
    return ", ".join(f"{arch} ({f.description})" for f in families() for arch in f.architectures)


def family_of(raw_config: dict, where: object = "") -> ModelFamily:
    """The family of a config.json's contents: by `architectures`, else by `model_type`; else a ValueError that
    names every supported architecture."""
    archs = raw_config.get("architectures") or []
    for arch in archs:
        for family in families():
            if arch in family.architectures:
                return family
    model_type = raw_config.get("model_type")
    if not archs:
        for family in families():
            if model_type in family.model_types:
                return family
    at = f" in {where}" if where else ""
    named = ", ".join(archs) if archs else "(none named)"
    raise ValueError(f"unsupported architecture {named} (model_type {model_type!r}){at}; supported: {supported_list()}")
