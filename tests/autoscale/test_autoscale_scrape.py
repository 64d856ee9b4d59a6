"""scrape.py: pods -> endpoints, Prometheus text -> gauges, and scraping real HTTP servers (ok, slow, broken)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from hetero_infer.operator import constants as c
from hetero_infer.operator.autoscale.scrape import (
    Endpoint,
    ScrapeError,
    endpoints_from_pods,
    parse_worker_metrics,
    scrape,
    scrape_all,
)
from hetero_infer.operator.manifests import selector_labels

WORKER_TEXT = """# HELP hetero_infer_kv_cache_usage_ratio Fraction of KV-cache blocks in use (0..1).
# TYPE hetero_infer_kv_cache_usage_ratio gauge
hetero_infer_kv_cache_usage_ratio{model_name="m"} 0.625
# TYPE hetero_infer_num_requests_running gauge
hetero_infer_num_requests_running{model_name="m"} 12.0
# TYPE hetero_infer_num_requests_waiting gauge
hetero_infer_num_requests_waiting{model_name="m"} 7.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m"} 0.625
# TYPE hetero_infer_time_to_first_token_seconds histogram
hetero_infer_time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 3.0
hetero_infer_time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 4.0
hetero_infer_time_to_first_token_seconds_count{model_name="m"} 4.0
hetero_infer_time_to_first_token_seconds_sum{model_name="m"} 0.5
"""

VLLM_TEXT = """# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="llama"} 0.5
vllm:num_requests_waiting{model_name="llama"} 3
vllm:num_requests_running{model_name="llama"} 4
"""


def test_parse_worker_metrics() -> None:
    m = parse_worker_metrics(WORKER_TEXT)
    assert (m.kv_cache_usage, m.requests_waiting, m.requests_running) == (0.625, 7.0, 12.0)


def test_parse_falls_back_to_the_vllm_names() -> None:
    m = parse_worker_metrics(VLLM_TEXT)
    assert (m.kv_cache_usage, m.requests_waiting, m.requests_running) == (0.5, 3.0, 4.0)


def test_parse_combines_several_models_and_can_pick_one() -> None:
    text = WORKER_TEXT + ('hetero_infer_kv_cache_usage_ratio{model_name="other"} 0.9\n'
                          'hetero_infer_num_requests_waiting{model_name="other"} 2\n'
                          'hetero_infer_num_requests_running{model_name="other"} 1\n')
    both = parse_worker_metrics(text)
    assert (both.kv_cache_usage, both.requests_waiting, both.requests_running) == (0.9, 9.0, 13.0)
    one = parse_worker_metrics(text, model_name="m")
    assert (one.kv_cache_usage, one.requests_waiting) == (0.625, 7.0)


@pytest.mark.parametrize(("text", "kind"), [
    ("", "missing"),
    ("# TYPE other gauge\nother 1\n", "missing"),
    ("hetero_infer_kv_cache_usage_ratio 0.5\nhetero_infer_num_requests_waiting 1\n", "missing"),  # no running
    ("hetero_infer_kv_cache_usage_ratio{model_name=\"m\" 0.5\n", "parse"),
    ("hetero_infer_kv_cache_usage_ratio not-a-number\n", "parse"),
    ("<html>502 Bad Gateway</html>", "parse"),
])
def test_parse_rejects_what_is_not_worker_metrics(text: str, kind: str) -> None:
    with pytest.raises(ScrapeError) as info:
        parse_worker_metrics(text)
    assert info.value.kind == kind


def test_parse_clamps_and_drops_non_finite_values() -> None:
    text = ("hetero_infer_kv_cache_usage_ratio 1.5\nhetero_infer_num_requests_waiting -1\n"
            "hetero_infer_num_requests_running NaN\nvllm:num_requests_running 2\n")
    m = parse_worker_metrics(text)
    assert (m.kv_cache_usage, m.requests_waiting, m.requests_running) == (1.0, 0.0, 2.0)


def pod(name: str, ip: str | None = "10.0.0.1", ready: bool = True, phase: str = "Running",
        labels: dict[str, str] | None = None, deleting: bool = False, port: int | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": selector_labels("smol") if labels is None else labels}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    status: dict[str, Any] = {"phase": phase, "conditions": [{"type": "Ready", "status": str(ready)}]}
    if ip:
        status["podIP"] = ip
    spec = {"containers": [{"name": "worker", "ports": [{"name": "http", "containerPort": port or c.WORKER_PORT}]}]}
    return {"metadata": meta, "spec": spec, "status": status}


def test_endpoints_from_pods() -> None:
    pods = [
        pod("b", ip="10.0.0.2"),
        pod("a", ip="10.0.0.1", port=8000),
        pod("loading", ip="10.0.0.3", ready=False),
        pod("pending", ip=None, ready=False, phase="Pending"),
        pod("leaving", ip="10.0.0.4", deleting=True),
        pod("done", ip="10.0.0.5", phase="Succeeded"),
        pod("crashed", ip="10.0.0.6", phase="Failed"),
        pod("other", ip="10.0.0.7", labels={"app": "else"}),
        pod("v6", ip="fd00::1"),
    ]
    eps = endpoints_from_pods(pods, selector_labels("smol"))
    assert eps == [
        Endpoint("a", "http://10.0.0.1:8000", True),
        Endpoint("b", "http://10.0.0.2:3000", True),
        Endpoint("loading", "http://10.0.0.3:3000", False),
        Endpoint("pending", "", False),
        Endpoint("v6", "http://[fd00::1]:3000", True),
    ]


@pytest.fixture
async def workers() -> AsyncIterator[Callable[..., Any]]:
    """Start fake workers: each serves /metrics with the text (or behaviour) it was given."""
    runners: list[web.AppRunner] = []

    async def start(text: str = WORKER_TEXT, status: int = 200, delay: float = 0.0) -> str:
        async def metrics(_: web.Request) -> web.Response:
            await asyncio.sleep(delay)
            return web.Response(text=text, status=status)

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = runner.addresses[0][1]
        return f"http://127.0.0.1:{port}"

    yield start
    for runner in runners:
        await runner.cleanup()


async def test_scrape_all_reports_each_pod_and_never_raises(workers: Callable[..., Any]) -> None:
    good = await workers()
    slow = await workers(delay=5.0)
    broken = await workers(status=500)
    garbage = await workers(text="not metrics {")
    endpoints = [
        Endpoint("good", good, True), Endpoint("slow", slow, True), Endpoint("broken", broken, True),
        Endpoint("garbage", garbage, True), Endpoint("refused", "http://127.0.0.1:9", True),
        Endpoint("loading", good, False),
    ]
    loop = asyncio.get_running_loop()
    started = loop.time()
    results = await scrape_all(endpoints, timeout=0.5)
    assert loop.time() - started < 3.0  # concurrent, each bounded by the timeout
    by_name = {r.sample.name: r for r in results}
    assert by_name["good"].sample.has_data and by_name["good"].error_kind is None
    assert (by_name["good"].sample.kv_cache_usage, by_name["good"].sample.queue_depth,
            by_name["good"].sample.running) == (0.625, 7.0, 12.0)
    assert by_name["slow"].error_kind == "timeout"
    assert by_name["broken"].error_kind == "http"
    assert by_name["garbage"].error_kind in ("parse", "missing")
    assert by_name["refused"].error_kind == "connect"
    for name in ("slow", "broken", "garbage", "refused"):
        s = by_name[name].sample
        assert s.ready and not s.has_data and s.error
    # A pod that is not ready is not asked (a loading worker's numbers mean nothing).
    assert by_name["loading"].error_kind is None and not by_name["loading"].sample.ready


async def test_scrape_a_real_mock_worker_shape(workers: Callable[..., Any]) -> None:
    """The text a worker really serves (tests/server checks the worker side) parses with a shared session."""
    url = await workers()
    async with aiohttp.ClientSession() as session:
        result = await scrape(session, Endpoint("w", url, True), timeout=2)
    assert result.sample.has_data and result.sample.running == 12.0
