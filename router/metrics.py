"""The router's Prometheus metrics (its own registry, served on /metrics)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from hetero_infer.contracts import metric_names

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class RouterMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.routed = Counter(metric_names.ROUTER_ROUTED, "requests sent to a worker (every attempt)",
                              ["worker", "policy"], registry=r)
        self.responses = Counter("hetero_infer_router_responses", "responses returned to clients", ["code"],
                                 registry=r)
        self.prefix_query_tokens = Counter("hetero_infer_router_prefix_query_tokens",
                                           "prompt tokens in full blocks looked up in the index", registry=r)
        self.prefix_matched_tokens = Counter("hetero_infer_router_prefix_matched_tokens",
                                             "of those, tokens the chosen worker holds per the index", ["worker"],
                                             registry=r)
        self.retries = Counter("hetero_infer_router_retries", "attempts given up before the first byte",
                               ["worker", "reason"], registry=r)
        self.held = Gauge(metric_names.ROUTER_REQUESTS_HELD, "requests waiting for a ready worker", registry=r)
        self.held_total = Counter("hetero_infer_router_held_requests", "requests that had to wait for a worker",
                                  registry=r)
        self.scale_from_zero = Counter("hetero_infer_router_scale_from_zero",
                                       "--scale-target: asks for a replica while requests were held, by result: "
                                       "scaled (0 -> 1), already (it had replicas), error (retried later)",
                                       ["result"], registry=r)
        self.shed = Counter("hetero_infer_router_requests_shed", "--flow-control: requests answered 429 by the "
                            "router, by priority and reason: queue_full (refused on arrival), displaced (by a better "
                            "priority or a shorter tenant queue), queue_timeout", ["priority", "reason"], registry=r)
        self.queued = Gauge("hetero_infer_router_requests_queued", "--flow-control: requests waiting in the router's "
                            "queue for a worker slot, by priority (at scrape time)", ["priority"], registry=r)
        self.hold_seconds = Histogram("hetero_infer_router_hold_seconds", "time requests waited for a ready worker",
                                      buckets=_LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("hetero_infer_router_upstream_ttft_seconds",
                              "from sending a request to a worker to its first body byte", ["worker"],
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.in_flight = Gauge(metric_names.ROUTER_IN_FLIGHT, "requests open to a worker", ["worker"],
                               registry=r)
        self.index_blocks = Gauge("hetero_infer_router_index_blocks",
                                  "blocks the prefix index holds per worker (at scrape time)", ["worker"], registry=r)
        self.pending_blocks = Gauge("hetero_infer_router_index_pending_blocks",
                                    "blocks routed to a reporting worker that no report has shown yet (at scrape "
                                    "time)", ["worker"], registry=r)
        self.reports_blocks = Gauge("hetero_infer_router_worker_reports_blocks",
                                    "1: the worker's entry is exact (it serves block reports), 0: approximate",
                                    ["worker"], registry=r)
        self.host_blocks = Gauge("hetero_infer_router_index_host_blocks",
                                 "blocks the prefix index knows in the worker's host KV tier (at scrape time)",
                                 ["worker"], registry=r)
        self.kv_events_live = Gauge("hetero_infer_router_worker_kv_events_live",
                                    "1: the worker's entry follows its KV events (the stream is in sync), 0: not",
                                    ["worker"], registry=r)
        self.lora_routed = Counter("hetero_infer_router_lora_routed", "requests for a LoRA adapter, by what the "
                                   "chosen worker had for it: active (it ran the adapter), free_slot (a free adapter "
                                   "slot), no_slot (it waits there for a slot)", ["rank"], registry=r)
        self.workers_ready = Gauge("hetero_infer_router_workers_ready", "workers passing their readiness check",
                                   registry=r)
        self.tokenizer_mode = Gauge("hetero_infer_router_tokenizer_mode",
                                    "1 for the prompt hashing in use: workers (their tokenizer, exact), folder "
                                    "(--tokenizer PATH or default, exact), text (prompt-text chunks, approximate)",
                                    ["mode"], registry=r)
