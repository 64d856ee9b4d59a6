"""`EngineStats`: the engine's counters as one snapshot, read by the server's metrics (in the engine process's
parent too, where it arrives pickled: this module imports nothing heavy)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hetero_infer.contracts.lora import LoRARequest


@dataclass
class EngineStats:
    num_running: int
    num_waiting: int
    kv_cache_usage: float
    num_preemptions_total: int
    prefix_cache_queries_total: int
    prefix_cache_hits_total: int
    prompt_tokens_total: int
    generation_tokens_total: int
    # tokens per engine step, as a histogram over ITERATION_TOKENS_BUCKETS (counts per bucket, +Inf last) and sum
    iteration_tokens: tuple[int, ...] = ()
    iteration_tokens_sum: int = 0
    # the host KV tier (--kv-offloading-size; zeros without one)
    host_kv_cache_usage: float = 0.0
    host_prefix_cache_queries_total: int = 0  # prompt tokens looked up there after a miss in the device pool
    host_prefix_cache_hits_total: int = 0  # prompt tokens restored from it
    host_kv_bytes_saved_total: int = 0
    host_kv_bytes_restored_total: int = 0
    # LoRA adapters (enable_lora; what `vllm:lora_requests_info` reports): the device slots, the adapters of running
    # and of waiting sequences, unfinished requests per adapter, requests added per adapter, adapters loaded
    max_lora: int = 0
    running_lora_adapters: tuple[str, ...] = ()
    waiting_lora_adapters: tuple[str, ...] = ()
    lora_requests: dict[str, int] = field(default_factory=dict)
    lora_requests_total: dict[str, int] = field(default_factory=dict)
    loras: tuple[LoRARequest, ...] = ()


# vLLM's `vllm:iteration_tokens_total` buckets
ITERATION_TOKENS_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
