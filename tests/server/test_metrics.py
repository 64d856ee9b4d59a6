"""Metric names (a contract: the operator and vLLM dashboards read them), labels, buckets and values."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families
from server_proc import ServerProcess, http

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
