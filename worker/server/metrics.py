"""Prometheus metrics of one worker (names are a contract: the operator and vLLM dashboards read them).

Engine state (KV usage, running/waiting, token and cache counters) is read from the engine thread's latest
stats snapshot at scrape time; request latencies are histograms observed by the async layer when a
request ends. Everything is labelled with `model_name`, as vLLM does, and lives in the app's own
registry (several servers can share a process in tests).
"""

from __future__ import annotations

import math
import threading
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from hetero_infer.worker.frontend.timing import RequestTiming

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                10.0, 20.0, 40.0, 80.0, 160.0, 640.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
               2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
LATENCY_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                   50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)

LABEL = "model_name"


class EngineStatsCollector(Collector):
    """Gauges and counters taken from the engine's stats snapshot when Prometheus scrapes."""

    def __init__(self, model_name: Callable[[], str], stats: Callable[[], Any], healthy: Callable[[], bool]) -> None:
        self._model_name = model_name
        self._stats = stats
        self._healthy = healthy

    def describe(self) -> Iterator[Metric]:  # names without sampling the engine
        return iter(self._families(None, ""))

    def collect(self) -> Iterator[Metric]:
        return iter(self._families(self._stats(), self._model_name()))

    def _families(self, s: Any, model: str) -> list[Metric]:
        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=[LABEL])
            if s is not None:
                g.add_metric([model], value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=[LABEL])
            if s is not None:
                c.add_metric([model], value)
            return c

        get = (lambda attr: float(getattr(s, attr))) if s is not None else (lambda attr: 0.0)
        usage, running, waiting = get("kv_cache_usage"), get("num_running"), get("num_waiting")
        healthy = 1.0 if s is not None and self._healthy() else 0.0
        return [
            gauge("hetero_infer_kv_cache_usage_ratio", "Fraction of KV-cache blocks in use (0..1).", usage),
            gauge("hetero_infer_num_requests_running", "Requests in the running batch.", running),
            gauge("hetero_infer_num_requests_waiting", "Requests waiting to be scheduled.", waiting),
            gauge("vllm:kv_cache_usage_perc", "KV-cache usage, 1 = 100% (vLLM-compatible name).", usage),
            gauge("vllm:num_requests_running", "Requests running (vLLM-compatible name).", running),
            gauge("vllm:num_requests_waiting", "Requests waiting (vLLM-compatible name).", waiting),
            gauge("hetero_infer_engine_healthy", "1 while the engine loop is healthy.", healthy),
            counter("hetero_infer_prompt_tokens", "Prompt tokens processed.", get("prompt_tokens_total")),
            counter("hetero_infer_generation_tokens", "Tokens generated.", get("generation_tokens_total")),
            counter("hetero_infer_num_preemptions", "Sequences preempted (recomputed later).",
                    get("num_preemptions_total")),
            counter("hetero_infer_prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                    get("prefix_cache_queries_total")),
            counter("hetero_infer_prefix_cache_hits", "Prompt tokens found in the prefix cache.",
                    get("prefix_cache_hits_total")),
        ]


class RequestHistogram:
    """A histogram for hot paths: `observe_many` files a whole batch under one lock with a C bisect, where
    `prometheus_client.Histogram.observe` costs a lock and a Python bucket scan per value (these are fed
    from the engine thread, once per request, with one inter-token gap per output step)."""

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...]) -> None:
        self.name = name
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

    def family(self, model: str) -> HistogramMetricFamily:
        with self._lock:
            counts, total = list(self._counts), self._sum
        family = HistogramMetricFamily(self.name, self.documentation, labels=[LABEL])
        cumulative, buckets = 0, []
        for bound, count in zip((*self.bounds, math.inf), counts, strict=True):
            cumulative += count
            buckets.append((floatToGoString(bound), cumulative))
        family.add_metric([model], buckets, total)
        return family


class ServerMetrics(Collector):
    """The worker's metrics registry; also the `TimingSink` of the async engine."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.model_name = ""
        r = self.registry
        self.ttft = RequestHistogram("hetero_infer_time_to_first_token_seconds", "Time to first token.",
                                     TTFT_BUCKETS)
        self.itl = RequestHistogram("hetero_infer_inter_token_latency_seconds",
                                    "Time between two output steps of a request.", ITL_BUCKETS)
        self.e2e = RequestHistogram("hetero_infer_e2e_request_latency_seconds", "Arrival to last token.",
                                    LATENCY_BUCKETS)
        self.queue = RequestHistogram("hetero_infer_request_queue_time_seconds", "Arrival to first scheduled.",
                                      LATENCY_BUCKETS)
        self.prompt_len = RequestHistogram("hetero_infer_request_prompt_tokens", "Prompt length of each request.",
                                           TOKEN_BUCKETS)
        self.gen_len = RequestHistogram("hetero_infer_request_generation_tokens", "Tokens generated per request.",
                                        TOKEN_BUCKETS)
        self._histograms = (self.ttft, self.itl, self.e2e, self.queue, self.prompt_len, self.gen_len)
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

    def bind(self, model_name: str, stats: Callable[[], Any], healthy: Callable[[], bool]) -> None:
        """Attach the engine once it is loaded (before that, engine metrics export no samples)."""
        self.model_name = model_name
        self.registry.register(EngineStatsCollector(lambda: self.model_name, stats, healthy))
        self.registry.register(self)
        self._bound = True

    def describe(self) -> Iterator[Metric]:
        return iter([h.family("") for h in self._histograms])

    def collect(self) -> Iterator[Metric]:
        return iter([h.family(self.model_name) for h in self._histograms])

    def observe_request(self, timing: RequestTiming, finished_at: float, finish_reason: str) -> None:
        if not self._bound:
            return
        if timing.first_token is not None:
            self.ttft.observe(timing.first_token - timing.arrival)
            self.e2e.observe(finished_at - timing.arrival)
        if timing.first_scheduled is not None:
            self.queue.observe(max(0.0, timing.first_scheduled - timing.arrival))
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
