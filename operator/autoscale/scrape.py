"""Reading the workers: which pods serve an InferenceDeployment, and what their /metrics say.

- `endpoints_from_pods` (pure): pods from the API -> endpoints (URL and readiness);
- `parse_worker_metrics` (pure): Prometheus text -> the three gauges the autoscaler uses;
- `scrape` / `scrape_all` (aiohttp): GET /metrics of every ready endpoint concurrently, each with a
  timeout; a pod that does not answer is a `PodSample` without values and an error, never an
  exception.

The metric names are the worker's contract (docs/contracts.md); the vLLM-compatible names are read
when the hetero_infer_* ones are absent, so a vLLM worker can be scaled the same way.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from hetero_infer.operator import constants as c
from hetero_infer.operator.autoscale.decision import PodSample, RouterSample

DEFAULT_TIMEOUT_SECONDS = 2.0
MAX_BODY_BYTES = 4 * 1024 * 1024

# (our name, vLLM's name) per gauge.
KV_NAMES = (c.METRIC_KV_CACHE_USAGE, "vllm:kv_cache_usage_perc")
WAITING_NAMES = (c.METRIC_REQUESTS_WAITING, "vllm:num_requests_waiting")
RUNNING_NAMES = (c.METRIC_REQUESTS_RUNNING, "vllm:num_requests_running")


class ScrapeError(Exception):
    """A worker's /metrics could not be read or lacks the gauges; `kind` labels the error metric."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Endpoint:
    """One worker pod: where its HTTP port is and whether it passes its readiness probe."""

    name: str
    url: str  # http://<podIP>:<port>
    ready: bool


@dataclass(frozen=True)
class WorkerMetrics:
    kv_cache_usage: float
    requests_waiting: float
    requests_running: float


# -- pods -> endpoints (pure) ---------------------------------------------------------------------------

def _pod_ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") != "Running" or not status.get("podIP"):
        return False
    return any(cond.get("type") == "Ready" and cond.get("status") == "True" for cond in status.get("conditions") or [])


def _worker_port(pod: Mapping[str, Any]) -> int:
    """The container port named `http` (the worker's), else the contract's default."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == c.WORKER_PORT_NAME and isinstance(port.get("containerPort"), int):
                return int(port["containerPort"])
    return c.WORKER_PORT


def matches(labels: Mapping[str, str] | None, selector: Mapping[str, str]) -> bool:
    labels = labels or {}
    return all(labels.get(k) == v for k, v in selector.items())


def endpoints_from_pods(pods: Iterable[Mapping[str, Any]], selector: Mapping[str, str]) -> list[Endpoint]:
    """The worker endpoints among `pods`: matching the selector, not terminating, not finished.

    Pods being deleted are left out (the Deployment is already replacing or removing them); pods that
    are pending or not ready are kept as not ready (loading), so the autoscaler counts them cautiously.
    """
    out = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        if not matches(meta.get("labels"), selector) or meta.get("deletionTimestamp"):
            continue
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        ip = (pod.get("status") or {}).get("podIP") or ""
        host = f"[{ip}]" if ":" in ip else ip
        url = f"http://{host}:{_worker_port(pod)}" if ip else ""
        out.append(Endpoint(name=str(meta.get("name") or ""), url=url, ready=_pod_ready(pod)))
    return sorted(out, key=lambda e: e.name)


# -- /metrics text -> gauges (pure) --------------------------------------------------------------------

def parse_worker_metrics(text: str, model_name: str | None = None) -> WorkerMetrics:
    """The worker gauges from Prometheus text; `model_name` picks one model's series when given.

    Several series of one gauge (several models in one process) are combined: KV usage by the
    largest, queue and running by the sum.
    """
    found: dict[str, list[float]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if model_name is not None and sample.labels.get("model_name", model_name) != model_name:
                    continue
                found.setdefault(sample.name, []).append(float(sample.value))
    except (ValueError, TypeError, IndexError) as e:
        raise ScrapeError("parse", f"invalid Prometheus text: {e}") from e

    def pick(names: Sequence[str], combine: Any) -> float:
        for name in names:
            values = [v for v in found.get(name, []) if math.isfinite(v)]
            if values:
                return float(combine(values))
        raise ScrapeError("missing", f"no {names[0]} sample")

    kv = pick(KV_NAMES, max)
    waiting = pick(WAITING_NAMES, sum)
    running = pick(RUNNING_NAMES, sum)
    return WorkerMetrics(kv_cache_usage=min(max(kv, 0.0), 1.0), requests_waiting=max(waiting, 0.0),
                         requests_running=max(running, 0.0))


def parse_router_metrics(text: str) -> RouterSample:
    """The router's gauges from its /metrics (router/metrics.py): held, in flight (summed over workers) and the
    routed-requests count (summed over workers and policies)."""
    wanted = {c.METRIC_ROUTER_REQUESTS_HELD: "held", c.METRIC_ROUTER_IN_FLIGHT: "in_flight",
              c.METRIC_ROUTER_ROUTED: "routed"}
    found: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                key = wanted.get(sample.name)
                if key is not None and math.isfinite(sample.value):
                    found[key] = found.get(key, 0.0) + float(sample.value)
    except (ValueError, TypeError, IndexError) as e:
        raise ScrapeError("parse", f"invalid Prometheus text: {e}") from e
    if "held" not in found:
        raise ScrapeError("missing", f"no {c.METRIC_ROUTER_REQUESTS_HELD} sample")
    return RouterSample(held=max(found["held"], 0.0), in_flight=max(found.get("in_flight", 0.0), 0.0),
                        routed=found.get("routed", 0.0))


# -- HTTP ------------------------------------------------------------------------------------------------

async def get_metrics_text(session: aiohttp.ClientSession, url: str, timeout: float) -> str:
    """The text of GET <url>/metrics (at most MAX_BODY_BYTES); ScrapeError on any failure."""
    try:
        async with session.get(f"{url}/metrics", timeout=aiohttp.ClientTimeout(total=timeout),
                               allow_redirects=False) as rsp:
            if rsp.status != 200:
                raise ScrapeError("http", f"GET /metrics answered {rsp.status}")
            body = await rsp.content.read(MAX_BODY_BYTES + 1)
    except asyncio.TimeoutError as e:
        raise ScrapeError("timeout", f"no answer within {timeout:g}s") from e
    except aiohttp.ClientError as e:
        raise ScrapeError("connect", f"{type(e).__name__}: {e}") from e
    if len(body) > MAX_BODY_BYTES:
        raise ScrapeError("parse", "response too large")
    return body.decode("utf-8", "replace")


async def fetch_metrics(session: aiohttp.ClientSession, url: str, timeout: float = DEFAULT_TIMEOUT_SECONDS,
                        model_name: str | None = None) -> WorkerMetrics:
    """GET <url>/metrics and parse it; ScrapeError on any failure."""
    return parse_worker_metrics(await get_metrics_text(session, url, timeout), model_name)


async def scrape_routers(session: aiohttp.ClientSession, routers: Sequence[Endpoint],
                         timeout: float = DEFAULT_TIMEOUT_SECONDS) -> RouterSample | None:
    """The ready router pods' gauges summed; None unless every ready router answered (a router that does not
    answer may be holding requests: its count is unknown, and unknown is never "idle")."""
    ready = [r for r in routers if r.ready and r.url]

    async def one(r: Endpoint) -> RouterSample | None:
        try:
            return parse_router_metrics(await get_metrics_text(session, r.url, timeout))
        except ScrapeError:
            return None

    samples = await asyncio.gather(*(one(r) for r in ready))
    if not samples or any(s is None for s in samples):
        return None
    return RouterSample(held=sum(s.held for s in samples if s), in_flight=sum(s.in_flight for s in samples if s),
                        routed=sum(s.routed for s in samples if s))


@dataclass(frozen=True)
class ScrapeResult:
    sample: PodSample
    error_kind: str | None = None  # set when a ready pod did not answer properly


async def scrape(session: aiohttp.ClientSession, endpoint: Endpoint, timeout: float = DEFAULT_TIMEOUT_SECONDS,
                 model_name: str | None = None) -> ScrapeResult:
    """One pod's sample. Pods that are not ready are not asked: a loading worker's gauges mean nothing."""
    if not endpoint.ready or not endpoint.url:
        return ScrapeResult(PodSample(endpoint.name, ready=False))
    try:
        m = await fetch_metrics(session, endpoint.url, timeout, model_name)
    except ScrapeError as e:
        return ScrapeResult(PodSample(endpoint.name, ready=True, error=f"{e.kind}: {e}"), e.kind)
    return ScrapeResult(PodSample(endpoint.name, ready=True, kv_cache_usage=m.kv_cache_usage,
                                  queue_depth=m.requests_waiting, running=m.requests_running))


async def scrape_all(endpoints: Sequence[Endpoint], timeout: float = DEFAULT_TIMEOUT_SECONDS,
                     session: aiohttp.ClientSession | None = None,
                     model_name: str | None = None) -> list[ScrapeResult]:
    """Every endpoint at once; the whole pass takes at most about `timeout`."""
    if session is None:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=32)) as own:
            return await scrape_all(endpoints, timeout, own, model_name)
    return list(await asyncio.gather(*(scrape(session, e, timeout, model_name) for e in endpoints)))
