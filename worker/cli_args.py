"""Engine options shared by every command: flags, a `--config FILE` and HETERO_INFER_* variables.

Precedence: command-line flag > environment variable > config file > built-in default.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import MISSING, fields
from typing import Any

from hetero_infer.worker.config import DEVICES, DTYPES, EXECUTORS, EngineConfig, load_config_file

ENV_PREFIX = "HETERO_INFER_"


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


_HELP = {
    "model": "HF folder (config.json + safetensors) or .gguf file; default: SmolLM2-135M-Instruct",
    "served_model_name": "name reported by /v1/models (default: the model's folder name)",
    "device": f"one of {', '.join(DEVICES)} or cuda:N",
    "dtype": f"one of {', '.join(DTYPES)} (auto: float32 on the CPU, bfloat16 there with --quantization where the "
    "CPU has AVX512_BF16; the checkpoint's 16-bit dtype on GPUs)",
    "executor": f"one of {', '.join(EXECUTORS)} (mock: no model, deterministic tokens)",
    "block_size": "tokens per KV-cache block",
    "max_num_blocks": "KV-cache blocks in the pool (default: sized from memory)",
    "max_num_seqs": "most sequences running in one step",
    "max_model_len": "longest prompt + output (default: the model's context length)",
    "max_num_batched_tokens": "token budget of one step (prefill chunks + decodes)",
    "memory_threshold": "KV usage above which no new request is admitted",
    "gpu_memory_utilization": "fraction of GPU memory for weights, activations and KV cache",
    "enable_prefix_caching": "reuse KV blocks of identical prompt prefixes",
    "quantization": "weight-only quantization: int8 or int4",
    "seed": "seed for requests that give none",
    "enforce_eager": "disable CUDA graphs",
    "mock_step_latency_s": "mock executor: seconds per step",
    "mock_vocab_size": "mock executor: vocabulary size (default: the tokenizer's)",
    "mock_logits": "mock executor: return fixed, context-dependent logits so the real sampler picks the tokens",
}


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """Add one flag per EngineConfig field (defaults left as None so files and env can fill them)."""
    group = parser.add_argument_group("engine")
    group.add_argument("--config", help="JSON or YAML file with engine options in snake_case")
    for f in fields(EngineConfig):
        kwargs: dict[str, Any] = {"default": None, "help": _HELP.get(f.name, "")}
        if f.type in ("bool",):
            kwargs["action"] = argparse.BooleanOptionalAction
        elif f.type in ("int", "int | None"):
            kwargs["type"] = int
        elif f.type in ("float",):
            kwargs["type"] = float
        group.add_argument(_flag(f.name), dest=f.name, **kwargs)


def _coerce(name: str, raw: str) -> Any:
    default_field = next(f for f in fields(EngineConfig) if f.name == name)
    t = default_field.type
    try:
        if t == "bool":
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if t in ("int", "int | None"):
            return int(raw)
        if t == "float":
            return float(raw)
    except ValueError:
        raise ValueError(f"environment variable {ENV_PREFIX}{name.upper()}={raw!r} is not a valid {t}") from None
    return raw


def env_overrides(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    environ = os.environ if environ is None else environ
    out: dict[str, Any] = {}
    for f in fields(EngineConfig):
        key = ENV_PREFIX + f.name.upper()
        if key in environ and environ[key] != "":
            out[f.name] = _coerce(f.name, environ[key])
    return out


def engine_config_from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> EngineConfig:
    """Merge config file, environment and flags into a validated EngineConfig (ValueError on bad input)."""
    values: dict[str, Any] = {}
    config_file = getattr(args, "config", None) or (environ or os.environ).get(ENV_PREFIX + "CONFIG")
    if config_file:
        values.update(load_config_file(config_file))
    values.update(env_overrides(environ))
    for f in fields(EngineConfig):
        v = getattr(args, f.name, None)
        if v is not None:
            values[f.name] = v
    return EngineConfig.from_dict(values)


def engine_defaults() -> dict[str, Any]:
    return {f.name: f.default for f in fields(EngineConfig) if f.default is not MISSING}
