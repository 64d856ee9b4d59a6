"""Engine options shared by every command: one flag per `EngineConfig` field, `--config FILE` and
HETERO_INFER_* variables, layered by hetero_infer.contracts.options (flag > environment > config file > default)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from hetero_infer.contracts.engine_options import DEVICES, DTYPES, EXECUTORS, LOAD_FORMATS, EngineConfig
from hetero_infer.contracts.options import add_config_flag, add_flags, load_options

ENV_PREFIX = "HETERO_INFER_"

_HELP = {
    "model": "HF folder (config.json + safetensors), .gguf file, hf://ORG/NAME[@REVISION] (or ORG/NAME) or "
             "s3://BUCKET/PREFIX (downloaded once into a cache); default: SmolLM2-135M-Instruct",
    "served_model_name": "name reported by /v1/models (default: the model's folder name)",
    "device": f"one of {', '.join(DEVICES)} or cuda:N",
    "dtype": f"one of {', '.join(DTYPES)} (auto: float32 on the CPU, bfloat16 there with --quantization where the "
    "CPU has AVX512_BF16; the checkpoint's 16-bit dtype on GPUs)",
    "executor": f"one of {', '.join(EXECUTORS)} (mock: no model, deterministic tokens)",
    "block_size": "tokens per KV-cache block",
    "max_num_blocks": "KV-cache blocks in the pool (default: sized from memory)",
    "max_num_seqs": "most sequences running in one step",
    "scheduling_policy": "fcfs (default): arrival order; priority: by each request's `priority` (lower first, then "
    "arrival), a waiting request preempting running ones of lower priority even when max_num_seqs is full",
    "max_model_len": "longest prompt + output (default: the model's context length)",
    "max_num_batched_tokens": "token budget of one step (prefill chunks + decodes); default from the device as vLLM "
    "chooses it: 2048 on the CPU; GPUs of at least 70 GiB but not A100: 8192 serving, 16384 offline; other GPUs "
    "2048 / 8192",
    "memory_threshold": "KV usage above which no new request is admitted",
    "gpu_memory_utilization": "fraction of GPU memory for weights, activations and KV cache",
    "enable_prefix_caching": "reuse KV blocks of identical prompt prefixes",
    "quantization": "weight-only quantization: int8 or int4",
    "load_format": f"one of {', '.join(LOAD_FORMATS)}: how weights are loaded (auto: the model's safetensors or "
    "GGUF file; dummy: random weights from config.json alone, for benchmarks and tests of any model shape)",
    "skip_tokenizer_init": "load no tokenizer: prompts must be token ids, outputs carry token ids and empty text",
    "seed": "seed for requests that give none (and for dummy weights)",
    "enforce_eager": "disable CUDA graphs",
    "tensor_parallel_size": "split the model over N ranks (one process and one GPU each; CPU: gloo, the cores "
    "shared out): for models larger than one device",
    "async_scheduling": "schedule and prepare the next step while the device runs the current one (CUDA, mock)",
    "kv_offloading_size": "GiB of host memory for a second KV tier behind the device pool (0: off): cached blocks "
    "evicted from the pool are saved there and restored instead of recomputed",
    "kv_events_config": "KV cache events as vLLM publishes them (ZMQ PUB, msgpack): a JSON object or its file, e.g. "
    "'{\"enable_kv_cache_events\": true, \"endpoint\": \"tcp://*:5557\"}'",
    "enable_lora": "serve LoRA adapters (PEFT folders) beside the base model, mixed in one batch",
    "max_loras": "LoRA adapters one step can run (device slots)",
    "max_lora_rank": "largest LoRA rank an adapter may have (smaller ranks are padded to it)",
    "max_cpu_loras": "LoRA adapters kept read in host memory (default: max_loras); others are read again when used",
    "mock_block_copy_s": "mock executor: seconds per KV block saved to or restored from the host tier",
    "mock_step_latency_s": "mock executor: seconds per step",
    "mock_token_latency_s": "mock executor: seconds more per token a step computes (prefill or decode; prefix-cache "
    "hits are not computed)",
    "mock_seq_latency_s": "mock executor: seconds more per sequence a step runs",
    "mock_vocab_size": "mock executor: vocabulary size (default: the tokenizer's)",
    "mock_logits": "mock executor: return fixed, context-dependent logits so the real sampler picks the tokens",
}


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    """`--config` and one flag per EngineConfig field (defaults left as None so files and env can fill them)."""
    group = parser.add_argument_group("engine")
    add_config_flag(group, ENV_PREFIX)
    add_flags(group, EngineConfig, _HELP)


def engine_config_from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> EngineConfig:
    """Merge config file, environment and flags into a validated EngineConfig (ValueError on bad input)."""
    (config,) = load_options((EngineConfig,), args, ENV_PREFIX, environ)
    return config
