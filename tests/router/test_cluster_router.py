"""The cluster router (`--discover-inference-deployments`): one router fronting every InferenceDeployment of its
namespace, found through the API (the KMock emulator), each one's workers from its worker Service's
EndpointSlices (workers: small HTTP servers on loopback addresses, one port, as pods share the container port)."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from hetero_infer.contracts import kube
from hetero_infer.contracts.router_options import RouterOptions
from hetero_infer.router.app import build, make_runner
from hetero_infer.router.cli import add_cluster
from hetero_infer.router.cluster import fronted, selects

OPERATOR_TESTS = Path(__file__).resolve().parents[1] / "operator"
if str(OPERATOR_TESTS) not in sys.path:
    sys.path.insert(0, str(OPERATOR_TESTS))

from borrowed_fixtures import operator_fixtures  # noqa: E402
from test_discovery import endpoint, endpoint_slice, free_port, until  # noqa: E402

_operator_fixtures = operator_fixtures()
crd = _operator_fixtures.crd
kmock_options = _operator_fixtures.kmock_options
kubeconfig = _operator_fixtures.kubeconfig

NS = "models"  # test_discovery's slices are in it
IDS = f"/apis/{kube.API_VERSION}/namespaces/{NS}/{kube.PLURAL}"
SLICES = f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices"
HOSTS = {"alpha": "127.0.0.2", "beta": "127.0.0.3", "gamma": "127.0.0.4"}


def inference_deployment(name: str, model: str, router: bool = False, to_zero: bool = False,
                         labels: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"model": {"name": model}, "executor": "mock", "router": {"enabled": router}}
    if to_zero:
        spec["autoscaling"] = {"enabled": True, "minReplicas": 0, "maxReplicas": 2}
    return {"apiVersion": kube.API_VERSION, "kind": kube.KIND,
            "metadata": {"name": name, "namespace": NS, "labels": labels or {}}, "spec": spec}


@pytest.fixture
async def model_workers() -> AsyncIterator[int]:
    """One worker per model on its own loopback address, all on one port: /readyz, /metrics, /v1/models and
    completions that say which host answered."""
    port = free_port(list(HOSTS.values()))
    runners = []
    for model, host in HOSTS.items():
        async def readyz(_: web.Request) -> web.Response:
            return web.Response(text="ok")

        async def metrics(_: web.Request) -> web.Response:
            return web.Response(text="hetero_infer_num_requests_running 0\n")

        async def models(_: web.Request, model: str = model) -> web.Response:
            return web.json_response({"object": "list", "data": [{"id": model, "object": "model"}]})

        async def completions(request: web.Request, model: str = model, host: str = host) -> web.Response:
            asked = (await request.json()).get("model")
            if asked != model:
                return web.json_response({"error": {"code": "model_not_found"}}, status=404)
            return web.json_response({"model": model, "host": host})

        app = web.Application()
        app.router.add_get("/readyz", readyz)
        app.router.add_get("/metrics", metrics)
        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/completions", completions)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, host, port).start()
        runners.append(runner)
    yield port
    for runner in runners:
        await runner.cleanup()


def test_what_the_router_fronts_of_an_inference_deployment() -> None:
    assert fronted(inference_deployment("a", "alpha", router=True)) == fronted(
        inference_deployment("a", "alpha", router=True)) and fronted(
        inference_deployment("a", "alpha", router=True)).service == "a-workers"
    plain = fronted(inference_deployment("b", "beta", to_zero=True))
    assert (plain.model, plain.service, plain.scale_from_zero) == ("beta", "b", True)
    assert fronted({"metadata": {"name": "x"}, "spec": {}}) is None
    assert selects("team=search,tier!=dev", {"team": "search"}) and not selects("team=search", {"team": "ads"})
    assert selects("gpu,!canary", {"gpu": ""}) and not selects("!canary", {"canary": "1"})
    assert selects(None, {}) and selects("team==a", {"team": "a"})


async def test_one_router_fronts_the_namespaces_inference_deployments(kmock: Any, kubeconfig: Path,
                                                                      model_workers: int) -> None:
    port = model_workers
    options = RouterOptions(discover_inference_deployments=True, namespace=NS, selector="tier=prod",
                            health_interval_s=0.05, tokenizer="none", hold_timeout_s=30)
    router, app = build(options)
    add_cluster(app, router, options)
    runner = make_runner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"

    async def post(path: str, body: dict[str, Any]) -> None:
        rsp = await kmock.post(path, json=body)
        assert rsp.status == 200, await rsp.text()

    async def ask(s: aiohttp.ClientSession, model: str) -> tuple[int, dict]:
        async with s.post(url + "/v1/completions", json={"model": model, "prompt": "x"}) as r:
            return r.status, await r.json()

    async def listed(s: aiohttp.ClientSession) -> list[str]:
        async with s.get(url + "/v1/models") as r:
            return [c["id"] for c in (await r.json())["data"]]

    prod = {"tier": "prod"}
    try:
        async with aiohttp.ClientSession() as s:
            await post(IDS, inference_deployment("a", "alpha", router=True, labels=prod))
            await post(IDS, inference_deployment("b", "beta", to_zero=True, labels=prod))
            await post(IDS, inference_deployment("g", "gamma", labels={"tier": "dev"}))  # not selected
            await until(lambda: set(router.declared) == {"alpha", "beta"}, "the two fronted models")
            assert await listed(s) == ["alpha", "beta"]  # served before any worker is seen
            assert "beta" in router.scalers and "alpha" not in router.scalers  # beta scales from zero
            # Their workers: alpha's behind its own router (Service a-workers), beta's Service is b.
            await post(SLICES, endpoint_slice("a-workers-1", "a-workers", [endpoint(HOSTS["alpha"])], port=port))
            await post(SLICES, endpoint_slice("b-1", "b", [endpoint(HOSTS["beta"])], port=port))
            await post(SLICES, endpoint_slice("g-1", "g", [endpoint(HOSTS["gamma"])], port=port))
            await until(lambda: len(router.pool.ready()) == 2, "both workers ready")
            for model in ("alpha", "beta", "alpha", "beta"):
                assert await ask(s, model) == (200, {"model": model, "host": HOSTS[model]})
            status, body = await ask(s, "gamma")  # its InferenceDeployment is not selected
            assert status == 404 and body["error"]["code"] == "model_not_found"
            # beta deleted: its worker leaves, its model is no longer served.
            rsp = await kmock.delete(f"{IDS}/b")
            assert rsp.status == 200, await rsp.text()
            await until(lambda: set(router.declared) == {"alpha"} and len(router.pool.workers) == 1,
                        "beta no longer fronted")
            status, body = await ask(s, "beta")
            assert status == 404 and "`alpha`" in body["error"]["message"]
            assert await listed(s) == ["alpha"] and "beta" not in router.scalers
            assert await ask(s, "alpha") == (200, {"model": "alpha", "host": HOSTS["alpha"]})
            # Created again: fronted again, its workers found again.
            await post(IDS, inference_deployment("b", "beta", labels=prod))
            await until(lambda: len(router.pool.ready()) == 2, "beta's worker back")
            assert await ask(s, "beta") == (200, {"model": "beta", "host": HOSTS["beta"]})
    finally:
        await runner.cleanup()
