"""Scale from zero through the operator, in one event loop (fast, default suite): the real operator (kopf
handlers of `hetero-infer operator`) against the KMock API emulator, the router app with EndpointSlice
discovery as `hetero-infer router --discover-service` builds it, and the test playing the Deployment controller
and kubelet with an in-process worker (the process version: test_scale_from_zero.py, marked slow).

The router here has no `--scale-target`: the operator's pass on its held-requests gauge is what scales from
zero (the fallback when a router cannot write the scale; the router's own write: test_scale_from_zero_kmock.py
in tests/operator).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from hetero_infer.contracts.router_options import RouterOptions
from hetero_infer.operator import constants as c
from hetero_infer.operator.manifests import workers_service_name
from hetero_infer.router.app import build, make_runner
from hetero_infer.router.cli import add_discovery

for folder in (Path(__file__).resolve().parent, Path(__file__).resolve().parents[1] / "operator"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
from kmock_cluster import DEPLOYMENTS, EVENTS, INFD, wait_for  # noqa: E402
from test_scale_from_zero import (  # noqa: E402
    NAME,
    NS,
    PODS,
    SLICES,
    crd,  # noqa: F401 (fixtures)
    kmock_options,  # noqa: F401
    kubeconfig,  # noqa: F401
    live,
    operator,  # noqa: F401
    pod,
    spec_replicas,
    worker_slice,
)

MODEL = "m"


class InProcessKubelet:
    """One in-process worker while the worker Deployment asks for a replica: /readyz, idle /metrics, and a
    completion that names the worker."""

    def __init__(self, kmock: Any) -> None:
        self.kmock = kmock
        self.runner: web.AppRunner | None = None
        self.started = 0
        self.completions = 0

    async def _completion(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.completions += 1
        return web.json_response({"id": "cmpl-1", "object": "text_completion", "created": 0, "model": body["model"],
                                  "choices": [{"index": 0, "text": " from the first worker", "finish_reason": "length",
                                               "logprobs": None}],
                                  "usage": {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4}})

    async def _start(self) -> int:
        app = web.Application()
        async def readyz(_: web.Request) -> web.Response:
            return web.Response(text="ok")

        async def metrics(_: web.Request) -> web.Response:  # an idle worker
            return web.Response(text="hetero_infer_num_requests_running 0\nhetero_infer_num_requests_waiting 0\n"
                                     "hetero_infer_kv_cache_usage_ratio 0\n")

        app.router.add_get("/readyz", readyz)
        app.router.add_get("/metrics", metrics)
        app.router.add_post("/v1/completions", self._completion)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.started += 1
        return self.runner.addresses[0][1]

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            dep = live(self.kmock, DEPLOYMENTS, NAME)
            want = int((dep or {}).get("spec", {}).get("replicas") or 0)
            if want >= 1 and self.runner is None:
                port = await self._start()
                rsp = await self.kmock.post(f"/api/v1/namespaces/{NS}/pods",
                                            json=pod(f"{NAME}-worker-0", c.COMPONENT_WORKER, port))
                assert rsp.status == 200, await rsp.text()
                await self._slice(port)
            elif want == 0 and self.runner is not None:
                await self._slice(None)
                await self.kmock.delete(f"/api/v1/namespaces/{NS}/pods/{NAME}-worker-0")
                await self.runner.cleanup()
                self.runner = None
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.05)

    async def _slice(self, port: int | None) -> None:
        rsp = await self.kmock.patch(f"{SLICES}/{workers_service_name(NAME)}-abcde", json=worker_slice(port),
                                     headers={"Content-Type": "application/merge-patch+json"})
        assert rsp.status == 200, await rsp.text()


@pytest.fixture
async def cluster(kmock: Any, kubeconfig: Path) -> AsyncIterator[tuple[Any, InProcessKubelet, str]]:  # noqa: F811
    import kmock as kmock_lib

    kmock.resources[PODS] = kmock_lib.ResourceInfo(kind="Pod", singular="pod", namespaced=True,
                                                   verbs={"get", "list", "watch", "create", "patch", "delete"},
                                                   subresources={"status"})
    rsp = await kmock.post(SLICES, json=worker_slice(None))
    assert rsp.status == 200, await rsp.text()
    options = RouterOptions(port=0, discover_service=workers_service_name(NAME), namespace=NS,
                            health_interval_s=0.05, hold_timeout_s=60)
    router, app = build(options)
    assert add_discovery(app, router.pool, options) is not None
    runner = make_runner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    rsp = await kmock.post(f"/api/v1/namespaces/{NS}/pods", json=pod(f"{NAME}-router-0", c.COMPONENT_ROUTER, port))
    assert rsp.status == 200, await rsp.text()
    kubelet = InProcessKubelet(kmock)
    stop = asyncio.Event()
    task = asyncio.create_task(kubelet.run(stop))
    try:
        yield kmock, kubelet, f"http://127.0.0.1:{port}"
    finally:
        stop.set()
        await task
        if kubelet.runner is not None:
            await kubelet.runner.cleanup()
        await runner.cleanup()


async def test_held_request_scales_from_zero_and_is_answered_then_idle_scales_to_zero(
        cluster: Any, operator: Any) -> None:  # noqa: F811
    kmock, kubelet, router_url = cluster
    await operator()
    body = {"apiVersion": c.API_VERSION, "kind": c.KIND, "metadata": {"name": NAME, "namespace": NS},
            "spec": {"model": {"name": MODEL}, "executor": "mock", "replicas": 0, "router": {"enabled": True},
                     "autoscaling": {"enabled": True, "minReplicas": 0, "maxReplicas": 1, "intervalSeconds": 1,
                                     "scaleToZeroAfterSeconds": 2}}}
    rsp = await kmock.post(f"/apis/{c.API_VERSION}/namespaces/{NS}/{c.PLURAL}", json=body)
    assert rsp.status == 200, await rsp.text()
    await wait_for(lambda: any(cd["type"] == c.COND_SCALING_ACTIVE and cd["reason"] == "Idle"
                               for cd in (live(kmock, INFD, NAME) or {}).get("status", {}).get("conditions")
                               or []), timeout=30, what="the autoscaler's first pass at zero")
    assert spec_replicas(kmock) == 0 and kubelet.started == 0

    async with aiohttp.ClientSession() as session:
        async with session.post(router_url + "/v1/completions", json={"model": MODEL, "prompt": "hi",
                                                                      "max_tokens": 3},
                                timeout=aiohttp.ClientTimeout(total=60)) as r:
            assert r.status == 200, await r.text()
            answer = await r.json()
    assert answer["choices"][0]["text"] == " from the first worker"
    assert spec_replicas(kmock) == 1 and kubelet.started == 1 and kubelet.completions == 1
    reasons = [obj.raw.get("reason") for (res, _, _), obj in kmock.objects.items() if res == EVENTS]
    assert "ScaledUp" in reasons

    await wait_for(lambda: spec_replicas(kmock) == 0, timeout=30, what="the operator scaling 1 -> 0 when idle")
    await wait_for(lambda: kubelet.runner is None, timeout=30, what="the worker withdrawn")
