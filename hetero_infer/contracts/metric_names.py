"""Metric names that cross a program's boundary: the workers export them, the router and the operator read
them (docs/contracts.md). One definition; each program's own metrics keep their names where they are defined."""

from __future__ import annotations

# The workers' load gauges (worker/server/metrics.py exports each under both names, from one value).
KV_CACHE_USAGE = "hetero_infer_kv_cache_usage_ratio"  # 0..1
REQUESTS_RUNNING = "hetero_infer_num_requests_running"
REQUESTS_WAITING = "hetero_infer_num_requests_waiting"
# vLLM's names for the same gauges: what gateways (the Gateway API Inference Extension's endpoint picker),
# dashboards and autoscalers built for vLLM read.
VLLM_KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
VLLM_REQUESTS_RUNNING = "vllm:num_requests_running"
VLLM_REQUESTS_WAITING = "vllm:num_requests_waiting"
VLLM_CACHE_CONFIG_INFO = "vllm:cache_config_info"
VLLM_LORA_REQUESTS_INFO = "vllm:lora_requests_info"
# With --enable-lora: one series (value 1, label lora_name) per LoRA adapter the worker serves (those GET /v1/models
# lists); the operator counts the ready workers that serve each adapter of spec.adapters (status.adapters).
LORA_ADAPTER_SERVED = "hetero_infer_lora_adapter_served"

# The router's, read by the operator (scale from zero; the router's status).
ROUTER_REQUESTS_HELD = "hetero_infer_router_requests_held"  # gauge: requests waiting for a ready worker
ROUTER_IN_FLIGHT = "hetero_infer_router_requests_in_flight"  # gauge, per worker
ROUTER_ROUTED = "hetero_infer_router_requests_routed"  # counter (exposed with _total), per worker and policy
