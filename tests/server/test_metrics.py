"""Metric names (a contract: the operator and vLLM dashboards read them), labels, buckets and values."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from inproc_server import inproc_server
from prometheus_client.parser import text_string_to_metric_families
from server_proc import ServerProcess, http, parse_metrics

from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.worker.core.engine import LLMEngine

GAUGES = [
    "hetero_infer_kv_cache_usage_ratio", "hetero_infer_num_requests_waiting", "hetero_infer_num_requests_running",
    "vllm:kv_cache_usage_perc", "vllm:num_requests_waiting", "vllm:num_requests_running",
]
COUNTERS = [
    "hetero_infer_prompt_tokens", "hetero_infer_generation_tokens", "hetero_infer_num_preemptions",
    "hetero_infer_prefix_cache_queries", "hetero_infer_prefix_cache_hits",
]
HISTOGRAMS = [
    "hetero_infer_time_to_first_token_seconds", "hetero_infer_inter_token_latency_seconds",
    "hetero_infer_e2e_request_latency_seconds", "hetero_infer_request_queue_time_seconds",
]
# vLLM's current names (vllm/v1/metrics/loggers.py; `vllm:time_per_output_token_seconds` was renamed
# `vllm:inter_token_latency_seconds` in 0.11 and removed in 0.13), each beside the series it mirrors.
VLLM_SERIES = {
    "vllm:kv_cache_usage_perc": ("gauge", "hetero_infer_kv_cache_usage_ratio"),
    "vllm:num_requests_running": ("gauge", "hetero_infer_num_requests_running"),
    "vllm:num_requests_waiting": ("gauge", "hetero_infer_num_requests_waiting"),
    "vllm:prompt_tokens": ("counter", "hetero_infer_prompt_tokens"),
    "vllm:generation_tokens": ("counter", "hetero_infer_generation_tokens"),
    "vllm:num_preemptions": ("counter", "hetero_infer_num_preemptions"),
    "vllm:prefix_cache_queries": ("counter", "hetero_infer_prefix_cache_queries"),
    "vllm:prefix_cache_hits": ("counter", "hetero_infer_prefix_cache_hits"),
    "vllm:time_to_first_token_seconds": ("histogram", "hetero_infer_time_to_first_token_seconds"),
    "vllm:inter_token_latency_seconds": ("histogram", "hetero_infer_inter_token_latency_seconds"),
    "vllm:request_time_per_output_token_seconds": ("histogram",
                                                   "hetero_infer_request_time_per_output_token_seconds"),
    "vllm:e2e_request_latency_seconds": ("histogram", "hetero_infer_e2e_request_latency_seconds"),
    "vllm:request_queue_time_seconds": ("histogram", "hetero_infer_request_queue_time_seconds"),
    "vllm:request_prompt_tokens": ("histogram", "hetero_infer_request_prompt_tokens"),
    "vllm:request_generation_tokens": ("histogram", "hetero_infer_request_generation_tokens"),
}


def _families(server: ServerProcess) -> dict:
    r = http("GET", server.url + "/metrics")
    assert r.status == 200 and r.headers["content-type"].startswith("text/plain")
    return {f.name: f for f in text_string_to_metric_families(r.text)}


def test_metric_names_types_and_labels(server: ServerProcess, model_name: str) -> None:
    http("POST", server.url + "/v1/completions", {"prompt": "metrics " * 40, "max_tokens": 5})
    families = _families(server)
    for name in GAUGES:
        assert families[name].type == "gauge", name
    for name in COUNTERS:
        assert families[name].type == "counter", name
    for name in HISTOGRAMS:
        assert families[name].type == "histogram", name
    for name in GAUGES + COUNTERS + HISTOGRAMS:
        assert families[name].samples, name
        assert all(s.labels.get("model_name") == model_name for s in families[name].samples), name
    usage = families["hetero_infer_kv_cache_usage_ratio"].samples[0].value
    assert 0.0 <= usage <= 1.0


def test_values_follow_requests(server: ServerProcess) -> None:
    before = server.metrics()
    for _ in range(3):
        r = http("POST", server.url + "/v1/completions", {"prompt": "counting tokens", "max_tokens": 9})
        assert r.status == 200
    prompt_len = r.json()["usage"]["prompt_tokens"]
    after = server.metrics()

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    assert delta("hetero_infer_generation_tokens_total") == 27
    assert delta("hetero_infer_prompt_tokens_total") == 3 * prompt_len
    assert delta("hetero_infer_time_to_first_token_seconds_count") == 3
    assert delta("hetero_infer_e2e_request_latency_seconds_count") == 3
    assert delta("hetero_infer_request_queue_time_seconds_count") == 3
    assert delta("hetero_infer_inter_token_latency_seconds_count") >= 3  # >= 1 gap per request (coalesced steps)
    assert delta("hetero_infer_requests_finished_total{finish_reason=length}") == 3
    assert delta("hetero_infer_http_requests_total{route=/v1/completions,status=200}") == 3
    # The prefix cache saw the repeated prompt.
    assert delta("hetero_infer_prefix_cache_queries_total") > 0


def test_histogram_buckets(server: ServerProcess) -> None:
    families = _families(server)
    for name in HISTOGRAMS:
        bounds = [float(s.labels["le"]) for s in families[name].samples if s.name.endswith("_bucket")]
        assert bounds == sorted(bounds) and bounds[-1] == float("inf")
        assert min(bounds) <= 0.01 and 60 <= max(b for b in bounds if b != float("inf"))


def test_vllm_names_mirror_ours(server: ServerProcess, model_name: str) -> None:
    """Every vLLM-named series has vLLM's type, the `model_name` label and exactly the samples of the series
    it mirrors (one measurement, two names), after real traffic."""
    for _ in range(2):
        assert http("POST", server.url + "/v1/completions", {"prompt": "mirror " * 20, "max_tokens": 6}).status == 200
    families = _families(server)
    for vllm_name, (kind, ours) in VLLM_SERIES.items():
        family = families[vllm_name]
        assert family.type == kind, vllm_name
        assert family.samples and all(s.labels["model_name"] == model_name for s in family.samples), vllm_name
        theirs = {(s.name.replace(vllm_name, ""), tuple(sorted(s.labels.items())), s.value) for s in family.samples}
        mine = {(s.name.replace(ours, ""), tuple(sorted(s.labels.items())), s.value) for s in families[ours].samples}
        assert theirs == mine, vllm_name
    assert families["vllm:request_time_per_output_token_seconds"].samples
    # The gateway's endpoint picker reads the KV cache's block size and size from vllm:cache_config_info.
    (info,) = families["vllm:cache_config_info"].samples
    assert info.value == 1 and info.labels["model_name"] == model_name
    assert int(info.labels["block_size"]) == 16 and int(info.labels["num_gpu_blocks"]) > 0


def test_vllm_series_follow_requests(server: ServerProcess) -> None:
    before = server.metrics()
    for _ in range(3):
        r = http("POST", server.url + "/v1/completions", {"prompt": "vllm counting " * 20, "max_tokens": 7})
        assert r.status == 200
    usage = r.json()["usage"]
    after = server.metrics()

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    assert delta("vllm:generation_tokens_total") == 3 * usage["completion_tokens"] == 21
    assert delta("vllm:prompt_tokens_total") == 3 * usage["prompt_tokens"]
    assert delta("vllm:request_prompt_tokens_sum") == 3 * usage["prompt_tokens"]
    assert delta("vllm:request_generation_tokens_sum") == 21
    for name in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
                 "vllm:request_queue_time_seconds", "vllm:request_time_per_output_token_seconds"):
        assert delta(name + "_count") == 3, name
    assert delta("vllm:prefix_cache_queries_total") > 0
    assert delta("vllm:prefix_cache_hits_total") > 0  # the same prompt three times
    assert delta("vllm:request_success_total{finished_reason=length}") == 3
    # A request's TPOT is at most its e2e latency over its tokens after the first.
    assert delta("vllm:request_time_per_output_token_seconds_sum") <= delta("vllm:e2e_request_latency_seconds_sum") / 6


# ------------------------------------------------------------------ the real default model, in-process
@pytest.fixture(scope="module")
def real_engine() -> LLMEngine:
    return LLMEngine(EngineConfig(executor="torch", max_model_len=256, max_num_blocks=64))


@pytest.fixture
async def real_url(real_engine: LLMEngine) -> AsyncIterator[str]:
    async with inproc_server(real_engine) as url:
        yield url


async def test_real_model_token_counters_match_usage(real_url: str) -> None:
    async def scrape(session: aiohttp.ClientSession) -> dict[str, float]:
        async with session.get(real_url + "/metrics") as r:
            return parse_metrics(await r.text())

    async with aiohttp.ClientSession() as session:
        before = await scrape(session)
        usages: list[dict[str, Any]] = []
        for body in ({"prompt": "The capital of France is", "max_tokens": 5, "temperature": 0},
                     {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 4, "temperature": 0},
                     {"prompt": "Once upon a time", "max_tokens": 3, "n": 2, "temperature": 1.0, "seed": 1}):
            path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
            async with session.post(real_url + path, json=body) as r:
                assert r.status == 200, await r.text()
                usages.append((await r.json())["usage"])
        after = await scrape(session)

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    completion = sum(u["completion_tokens"] for u in usages)
    assert delta("vllm:generation_tokens_total") == delta("hetero_infer_generation_tokens_total") == completion
    # usage counts the prompt once per request; the engine processes it once per request too (n=2 forks).
    prompt = sum(u["prompt_tokens"] for u in usages)
    assert delta("vllm:prompt_tokens_total") == delta("hetero_infer_prompt_tokens_total") == prompt
