"""Prometheus metrics of one worker (names are a contract: the operator and vLLM dashboards read them).

Each measurement is computed once and exported under our `hetero_infer_*` name and, where vLLM has one, under
vLLM's current name (`vllm:*`, docs/metrics.md lists both) from the same value.

Engine state (KV usage, running/waiting, token and cache counters) is read from the engine thread's latest
stats snapshot at scrape time; request latencies are histograms observed by the async layer when a
request ends. Everything is labelled with `model_name`, as vLLM does, and lives in the app's own
registry (several servers can share a process in tests).
"""

from __future__ import annotations

import math
import threading
import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from hetero_infer.contracts import metric_names as names
from hetero_infer.worker.core.stats import ITERATION_TOKENS_BUCKETS
from hetero_infer.worker.frontend.timing import RequestTiming

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0, 160.0, 640.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
               2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
LATENCY_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                   50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)
# vLLM's own buckets (vllm/v1/metrics/loggers.py) for the series added for benchmark tools that read them
# (inference-perf): its request latencies, its n parameter, and its 1-2-5 token buckets up to the context length.
VLLM_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                        240.0, 480.0, 960.0, 1920.0, 7680.0)
N_BUCKETS = (1, 2, 5, 10, 20)


def buckets_1_2_5(max_value: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to `max_value` (vLLM's `build_1_2_5_buckets`)."""
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return tuple(out)
            out.append(m * scale)
        scale *= 10

LABEL = "model_name"


@dataclass(frozen=True)
class Series:
    """One measurement exported under our name and, where vLLM has one, under vLLM's current name too (the
    same value: dashboards, autoscalers and the Gateway API Inference Extension's endpoint picker built for
    vLLM read it unchanged). `attr` is the field of the engine's stats snapshot it comes from."""

    name: str
    vllm_name: str | None
    kind: str  # "gauge" or "counter"
    documentation: str
    attr: str

    def names(self) -> tuple[str, ...]:
        return (self.name,) if self.vllm_name is None else (self.name, self.vllm_name)


ENGINE_SERIES = (
    Series(names.KV_CACHE_USAGE, names.VLLM_KV_CACHE_USAGE, "gauge",
           "Fraction of KV-cache blocks in use (0..1; 1 means 100%).", "kv_cache_usage"),
    Series(names.REQUESTS_RUNNING, names.VLLM_REQUESTS_RUNNING, "gauge",
           "Requests in the running batch.", "num_running"),
    Series(names.REQUESTS_WAITING, names.VLLM_REQUESTS_WAITING, "gauge",
           "Requests waiting to be scheduled.", "num_waiting"),
    Series("hetero_infer_prompt_tokens", "vllm:prompt_tokens", "counter", "Prompt tokens processed.",
           "prompt_tokens_total"),
    Series("hetero_infer_generation_tokens", "vllm:generation_tokens", "counter", "Tokens generated.",
           "generation_tokens_total"),
    Series("hetero_infer_num_preemptions", "vllm:num_preemptions", "counter",
           "Sequences preempted (recomputed later).", "num_preemptions_total"),
    Series("hetero_infer_prefix_cache_queries", "vllm:prefix_cache_queries", "counter",
           "Prompt tokens looked up in the prefix cache.", "prefix_cache_queries_total"),
    Series("hetero_infer_prefix_cache_hits", "vllm:prefix_cache_hits", "counter",
           "Prompt tokens found in the prefix cache.", "prefix_cache_hits_total"),
    # the host KV tier (--kv-offloading-size): vLLM counts its offloaded tier's lookups as "external"
    Series("hetero_infer_host_kv_cache_usage", None, "gauge",
           "Fraction of the host KV tier's blocks in use (0..1; 0 without a tier).", "host_kv_cache_usage"),
    Series("hetero_infer_host_prefix_cache_queries", "vllm:external_prefix_cache_queries", "counter",
           "Prompt tokens looked up in the host KV tier after a miss in the device pool.",
           "host_prefix_cache_queries_total"),
    Series("hetero_infer_host_prefix_cache_hits", "vllm:external_prefix_cache_hits", "counter",
           "Prompt tokens restored from the host KV tier instead of computed.", "host_prefix_cache_hits_total"),
    Series("hetero_infer_host_kv_bytes_saved", None, "counter",
           "Bytes of KV blocks copied from the device pool to the host tier.", "host_kv_bytes_saved_total"),
    Series("hetero_infer_host_kv_bytes_restored", None, "counter",
           "Bytes of KV blocks copied from the host tier back to the device pool.", "host_kv_bytes_restored_total"),
)


class EngineStatsCollector(Collector):
    """Gauges and counters taken from the engine's stats snapshot when Prometheus scrapes, plus vLLM's
    `vllm:cache_config_info` (value 1; its labels carry the KV cache's `block_size` and `num_gpu_blocks`, which
    the inference gateway's prefix-cache scorer reads)."""

    def __init__(self, model_name: Callable[[], str], stats: Callable[[], Any], healthy: Callable[[], bool],
                 cache_info: dict[str, str] | None = None, served_adapters: Callable[[], list[str]] = list) -> None:
        self._model_name = model_name
        self._stats = stats
        self._healthy = healthy
        self._cache_info = dict(cache_info or {})
        self._served_adapters = served_adapters

    def describe(self) -> Iterator[Metric]:  # names without sampling the engine
        return iter(self._families(None, ""))

    def collect(self) -> Iterator[Metric]:
        return iter(self._families(self._stats(), self._model_name(), self._served_adapters()))

    def _families(self, s: Any, model: str, served: Sequence[str] = ()) -> list[Metric]:
        out: list[Metric] = []
        for series in ENGINE_SERIES:
            value = float(getattr(s, series.attr)) if s is not None else 0.0
            for name in series.names():
                family_cls = GaugeMetricFamily if series.kind == "gauge" else CounterMetricFamily
                family = family_cls(name, series.documentation, labels=[LABEL])
                if s is not None:
                    family.add_metric([model], value)
                out.append(family)
        out += _iteration_tokens(s, model)
        healthy = GaugeMetricFamily("hetero_infer_engine_healthy", "1 while the engine loop is healthy.",
                                    labels=[LABEL])
        info_labels = [LABEL, *self._cache_info]
        info = GaugeMetricFamily(names.VLLM_CACHE_CONFIG_INFO, "Information of the KV cache's configuration "
                                 "(vLLM-compatible; the value is always 1).", labels=info_labels)
        if s is not None:
            healthy.add_metric([model], 1.0 if self._healthy() else 0.0)
            info.add_metric([model, *self._cache_info.values()], 1.0)
        return [*out, healthy, info, *_lora_families(s, model, served)]


LORA_INFO_LABELS = ("max_lora", "running_lora_adapters", "waiting_lora_adapters")


def _lora_families(s: Any, model: str, served: Sequence[str]) -> list[Metric]:
    """The LoRA adapters' series, only on a worker serving adapters (--enable-lora), as vLLM does:

    - `vllm:lora_requests_info`, as the Gateway API Inference Extension's model-server protocol reads it: a gauge
      whose value is the time of the state it describes and whose labels are `max_lora` (device slots) and the
      comma-separated names of the adapters of running and of waiting requests (one label set: the current one);
    - per adapter (`lora_name`): `hetero_infer_lora_requests_in_flight` (its requests running or waiting) and
      `hetero_infer_lora_requests_total` (its requests so far); `hetero_infer_lora_adapters_loaded`;
    - `hetero_infer_lora_adapter_served` (1 per adapter the server serves: what /v1/models lists; the operator
      counts the workers serving each adapter from it, /metrics needing no API key)."""
    if s is not None and not getattr(s, "max_lora", 0):
        return []
    info = GaugeMetricFamily(names.VLLM_LORA_REQUESTS_INFO, "Running stats on LoRA requests (vLLM-compatible; the "
                             "value is the time of the state the labels describe).", labels=list(LORA_INFO_LABELS))
    active = GaugeMetricFamily("hetero_infer_lora_requests_in_flight", "Requests running or waiting, per LoRA adapter.",
                               labels=[LABEL, "lora_name"])
    total = CounterMetricFamily("hetero_infer_lora_requests", "Requests received, per LoRA adapter.",
                                labels=[LABEL, "lora_name"])
    loaded = GaugeMetricFamily("hetero_infer_lora_adapters_loaded", "LoRA adapters the engine holds (read and "
                               "checked, in host memory).", labels=[LABEL])
    serving = GaugeMetricFamily(names.LORA_ADAPTER_SERVED, "LoRA adapters this worker serves (GET /v1/models lists "
                                "them), 1 each.", labels=[LABEL, "lora_name"])
    if s is not None:
        info.add_metric([str(s.max_lora), ",".join(s.running_lora_adapters), ",".join(s.waiting_lora_adapters)],
                        time.time())
        for name, n in sorted(s.lora_requests.items()):
            active.add_metric([model, name], float(n))
        for name, n in sorted(s.lora_requests_total.items()):
            total.add_metric([model, name], float(n))
        loaded.add_metric([model], float(len(s.loras)))
        for name in served:
            serving.add_metric([model, name], 1.0)
    return [info, active, total, loaded, serving]


def _buckets(bounds: tuple[float, ...], counts: list[int]) -> list[tuple[str, int]]:
    """Prometheus's cumulative (le, count) pairs from per-bucket counts (the last one +Inf)."""
    cumulative, out = 0, []
    for bound, count in zip((*bounds, math.inf), counts, strict=True):
        cumulative += count
        out.append((floatToGoString(bound), cumulative))
    return out


def _iteration_tokens(s: Any, model: str) -> list[Metric]:
    """The engine's tokens-per-step histogram (vLLM's `vllm:iteration_tokens_total`), from its stats."""
    out = []
    for name in ("hetero_infer_iteration_tokens", "vllm:iteration_tokens_total"):
        family = HistogramMetricFamily(name, "Tokens computed per engine step.", labels=[LABEL])
        if s is not None:
            counts = list(s.iteration_tokens) or [0] * (len(ITERATION_TOKENS_BUCKETS) + 1)
            family.add_metric([model], _buckets(ITERATION_TOKENS_BUCKETS, counts), float(s.iteration_tokens_sum))
        out.append(family)
    return out


class RequestHistogram:
    """A histogram for hot paths: `observe_many` files a whole batch under one lock with a C bisect, where
    `prometheus_client.Histogram.observe` costs a lock and a Python bucket scan per value (these are fed
    from the engine thread, once per request, with one inter-token gap per output step)."""

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...], vllm_name: str | None = None) -> None:
        self.name = name
        self.names = (name,) if vllm_name is None else (name, vllm_name)  # one measurement, both names
        self.documentation = documentation
        self.bounds = tuple(float(b) for b in buckets)
        self._counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        with self._lock:
            self._counts[bisect_left(self.bounds, value)] += 1
            self._sum += value

    def observe_many(self, values: list[float]) -> None:
        if not values:
            return
        bounds, counts = self.bounds, self._counts
        if len(values) <= 8:
            with self._lock:
                for v in values:
                    counts[bisect_left(bounds, v)] += 1
                self._sum += sum(values)
            return
        # Many values (a request's inter-token gaps): sort them once and cut at each bound, one C bisect per
        # bucket instead of one per value. A value equal to a bound counts in that bound's bucket ("le").
        ordered = sorted(values)
        with self._lock:
            below = 0
            for i, bound in enumerate(bounds):
                upto = bisect_right(ordered, bound, below)
                counts[i] += upto - below
                below = upto
                if below == len(ordered):
                    break
            counts[-1] += len(ordered) - below
            self._sum += sum(values)

    def families(self, model: str) -> list[HistogramMetricFamily]:
        with self._lock:
            counts, total = list(self._counts), self._sum
        buckets = _buckets(self.bounds, counts)
        out = []
        for name in self.names:
            family = HistogramMetricFamily(name, self.documentation, labels=[LABEL])
            family.add_metric([model], buckets, total)
            out.append(family)
        return out


class ServerMetrics(Collector):
    """The worker's metrics registry; also the `TimingSink` of the async engine."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.model_name = ""
        r = self.registry
        self.ttft = RequestHistogram("hetero_infer_time_to_first_token_seconds", "Time to first token.",
                                     TTFT_BUCKETS, "vllm:time_to_first_token_seconds")
        self.itl = RequestHistogram("hetero_infer_inter_token_latency_seconds",
                                    "Time between two output steps of a request.", ITL_BUCKETS,
                                    "vllm:inter_token_latency_seconds")
        self.tpot = RequestHistogram("hetero_infer_request_time_per_output_token_seconds",
                                     "Per request: first token to last token over the tokens after the first.",
                                     ITL_BUCKETS, "vllm:request_time_per_output_token_seconds")
        self.e2e = RequestHistogram("hetero_infer_e2e_request_latency_seconds", "Arrival to last token.",
                                    LATENCY_BUCKETS, "vllm:e2e_request_latency_seconds")
        self.queue = RequestHistogram("hetero_infer_request_queue_time_seconds", "Arrival to first scheduled.",
                                      LATENCY_BUCKETS, "vllm:request_queue_time_seconds")
        self.prompt_len = RequestHistogram("hetero_infer_request_prompt_tokens", "Prompt length of each request.",
                                           TOKEN_BUCKETS, "vllm:request_prompt_tokens")
        self.gen_len = RequestHistogram("hetero_infer_request_generation_tokens", "Tokens generated per request.",
                                        TOKEN_BUCKETS, "vllm:request_generation_tokens")
        self.prefill = RequestHistogram("hetero_infer_request_prefill_time_seconds", "First scheduled to first "
                                        "token.", VLLM_LATENCY_BUCKETS, "vllm:request_prefill_time_seconds")
        self.decode = RequestHistogram("hetero_infer_request_decode_time_seconds", "First token to last token.",
                                       VLLM_LATENCY_BUCKETS, "vllm:request_decode_time_seconds")
        self.inference = RequestHistogram("hetero_infer_request_inference_time_seconds", "First scheduled to last "
                                          "token (prefill and decode).", VLLM_LATENCY_BUCKETS,
                                          "vllm:request_inference_time_seconds")
        self.params_n = RequestHistogram("hetero_infer_request_params_n", "The n parameter of each request.",
                                         N_BUCKETS, "vllm:request_params_n")
        self._histograms: tuple[RequestHistogram, ...] = (
            self.ttft, self.itl, self.tpot, self.e2e, self.queue, self.prompt_len, self.gen_len, self.prefill,
            self.decode, self.inference, self.params_n)
        self._cached_tokens = 0  # prompt tokens served by the prefix cache, summed over ended requests
        self._lock = threading.Lock()
        self._finished = Counter("hetero_infer_requests_finished", "Engine requests ended, by finish reason.",
                                 [LABEL, "finish_reason"], registry=r)
        self._rejected = Counter("hetero_infer_requests_rejected", "Requests refused before the engine "
                                 "(queue_full, draining, not_ready, engine_failed, timeout).",
                                 [LABEL, "reason"], registry=r)
        self._http = Counter("hetero_infer_http_requests", "HTTP requests by route and status.",
                             [LABEL, "route", "status"], registry=r)
        self._bound = False
        self._children: dict[tuple, Any] = {}  # (counter, label values) -> its labelled child (hot paths)

    def _child(self, counter: Counter, *labels: str) -> Any:
        key = (id(counter), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = counter.labels(*labels)
        return child

    def bind(self, model_name: str, stats: Callable[[], Any], healthy: Callable[[], bool],
             cache_info: dict[str, str] | None = None, max_model_len: int = 100000,
             served_adapters: Callable[[], list[str]] = list) -> None:
        """Attach the engine once it is loaded (before that, engine metrics export no samples); the token
        histograms that vLLM buckets up to the context length are made here. `served_adapters`: the names of the
        LoRA adapters the server serves."""
        tokens = buckets_1_2_5(max_model_len)
        self.max_gen = RequestHistogram("hetero_infer_request_max_num_generation_tokens", "Per request: the most "
                                        "tokens one of its samples generated.", tokens,
                                        "vllm:request_max_num_generation_tokens")
        self.params_max_tokens = RequestHistogram("hetero_infer_request_params_max_tokens", "The max_tokens "
                                                  "parameter of each request (resolved).", tokens,
                                                  "vllm:request_params_max_tokens")
        self.prefill_computed = RequestHistogram("hetero_infer_request_prefill_kv_computed_tokens", "Per request: "
                                                 "prompt tokens computed (not served by the prefix cache).", tokens,
                                                 "vllm:request_prefill_kv_computed_tokens")
        self._histograms += (self.max_gen, self.params_max_tokens, self.prefill_computed)
        self.model_name = model_name
        self.registry.register(EngineStatsCollector(lambda: self.model_name, stats, healthy, cache_info,
                                                    served_adapters))
        self.registry.register(self)
        self._bound = True

    def describe(self) -> Iterator[Metric]:
        return iter([*(f for h in self._histograms for f in h.families("")), self._request_success(),
                     *self._prompt_tokens_cached()])

    def collect(self) -> Iterator[Metric]:
        return iter([*(f for h in self._histograms for f in h.families(self.model_name)), self._request_success(),
                     *self._prompt_tokens_cached()])

    def _prompt_tokens_cached(self) -> list[CounterMetricFamily]:
        out = []
        for name in ("hetero_infer_prompt_tokens_cached", "vllm:prompt_tokens_cached"):
            family = CounterMetricFamily(name, "Prompt tokens served by the prefix cache (per request, at its "
                                         "first admission).", labels=[LABEL])
            if self._bound:
                family.add_metric([self.model_name], float(self._cached_tokens))
            out.append(family)
        return out

    def _request_success(self) -> CounterMetricFamily:
        """vLLM's `vllm:request_success_total{finished_reason}`: the finish-reason counter under vLLM's names."""
        family = CounterMetricFamily("vllm:request_success", "Requests ended, by finish reason (vLLM-compatible "
                                     "name of hetero_infer_requests_finished).", labels=[LABEL, "finished_reason"])
        for metric in self._finished.collect():
            for sample in metric.samples:
                if sample.name.endswith("_total"):
                    family.add_metric([sample.labels[LABEL], sample.labels["finish_reason"]], sample.value)
        return family

    def observe_request(self, timing: RequestTiming, finished_at: float, finish_reason: str) -> None:
        if not self._bound:
            return
        if timing.first_token is not None:
            self.ttft.observe(timing.first_token - timing.arrival)
            self.e2e.observe(finished_at - timing.arrival)
            if timing.num_tokens > 1 and timing.last_token is not None:
                self.tpot.observe((timing.last_token - timing.first_token) / (timing.num_tokens - 1))
        if timing.first_scheduled is not None:
            self.queue.observe(max(0.0, timing.first_scheduled - timing.arrival))
            if timing.first_token is not None and timing.last_token is not None:
                self.prefill.observe(timing.first_token - timing.first_scheduled)
                self.decode.observe(timing.last_token - timing.first_token)
                self.inference.observe(timing.last_token - timing.first_scheduled)
        self.params_n.observe(timing.n)
        self.max_gen.observe(max(timing.sample_tokens, default=0))
        if timing.max_tokens:
            self.params_max_tokens.observe(timing.max_tokens)
        if timing.cached_tokens is not None:
            self.prefill_computed.observe(timing.prompt_tokens - timing.cached_tokens)
            with self._lock:
                self._cached_tokens += timing.cached_tokens
        self.itl.observe_many(timing.inter_token)
        self.prompt_len.observe(timing.prompt_tokens)
        if finish_reason in ("stop", "length"):
            self.gen_len.observe(timing.num_tokens)
        self._child(self._finished, self.model_name, finish_reason).inc()

    def rejected(self, reason: str) -> None:
        self._child(self._rejected, self.model_name, reason).inc()

    def http_request(self, route: str, status: int) -> None:
        self._child(self._http, self.model_name, route, str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
