"""Scale from zero when the request arrives, end to end against the API emulator: the real operator (kopf handlers
of `hetero-infer operator`) against KMock, the router app started with the command line the operator rendered
into the router Deployment (`--scale-target` included, credentials from the kubeconfig as outside a pod), and the
test playing the Deployment controller and kubelet with an in-process worker.

Measured: from the client sending its first request to the worker Deployment's spec.replicas = 1, with the
operator's autoscaler polling only once an hour, so the router's scale subresource write is the only way there.
The autoscaler then agrees with that write: a replica the router asked for is not taken away before
scaleToZeroAfterSeconds, however long the model sat at zero before.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from hetero_infer.operator import constants as c
from hetero_infer.operator.manifests import router_name
from hetero_infer.router.app import Router, build, make_runner
from hetero_infer.router.cli import add_discovery, add_scale_from_zero, resolve_options

ROUTER_TESTS = Path(__file__).resolve().parents[1] / "router"
if str(ROUTER_TESTS) not in sys.path:
    sys.path.insert(0, str(ROUTER_TESTS))
from kmock_cluster import DEPLOYMENTS, INFD, wait_for  # noqa: E402
from test_scale_from_zero import NAME, NS, PODS, SLICES, live, pod, spec_replicas, worker_slice  # noqa: E402
from test_scale_from_zero_fast import MODEL, InProcessKubelet  # noqa: E402

EPISODES = 5
BOUND_S = 1.0


def body(autoscaling: dict[str, Any], hold_timeout: int = 60) -> dict[str, Any]:
    return {"apiVersion": c.API_VERSION, "kind": c.KIND, "metadata": {"name": NAME, "namespace": NS},
            "spec": {"model": {"name": MODEL}, "executor": "mock", "replicas": 0,
                     "router": {"enabled": True, "holdTimeoutSeconds": hold_timeout},
                     "autoscaling": {"enabled": True, "minReplicas": 0, "maxReplicas": 1, **autoscaling}}}


async def start_router_as_rendered(kmock: Any, scale_target: bool = True) -> tuple[Router, web.AppRunner, str]:
    """The router pod: `hetero-infer router` with the arguments of the router Deployment the operator wrote
    (served on a free loopback port; without --scale-target for the baseline), its pod published for the
    autoscaler."""
    dep = await wait_for(lambda: live(kmock, DEPLOYMENTS, router_name(NAME)), what="the router Deployment")
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    at = args.index("--scale-target")
    assert args[0] == "router" and args[at + 1] == NAME
    if not scale_target:
        args = args[:at] + args[at + 2:]
    options = resolve_options([*args[1:], "--host", "127.0.0.1", "--port", "0"], {})
    router, app = build(options)
    discovery = add_discovery(app, router.pool, options)
    add_scale_from_zero(app, router, options)
    runner = make_runner(app, shutdown_grace_s=1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    rsp = await kmock.post(f"/api/v1/namespaces/{NS}/pods", json=pod(f"{NAME}-router-0", c.COMPONENT_ROUTER, port))
    assert rsp.status == 200, await rsp.text()
    assert discovery is not None
    await wait_for(lambda: discovery.watcher is not None and discovery.watcher.synced.is_set(),
                   what="the router watching the worker EndpointSlices")
    return router, runner, f"http://127.0.0.1:{port}"


async def settled(kmock: Any) -> None:
    """The operator done with the new object: children written, the autoscaler's first pass (at zero) made."""
    await wait_for(lambda: any(cd["type"] == c.COND_SCALING_ACTIVE and cd["reason"] == "Idle"
                               for cd in (live(kmock, INFD, NAME) or {}).get("status", {}).get("conditions")
                               or []), what="the autoscaler's first pass at zero")
    await wait_for(lambda: (live(kmock, DEPLOYMENTS, NAME) or {}).get("spec", {}).get("replicas") == 0,
                   what="the worker Deployment at zero")


@pytest.fixture
async def cluster(kmock: Any, kubeconfig: Path, operator: Any) -> AsyncIterator[Any]:
    import kmock as kmock_lib

    kmock.resources[PODS] = kmock_lib.ResourceInfo(kind="Pod", singular="pod", namespaced=True,
                                                   verbs={"get", "list", "watch", "create", "patch", "delete"},
                                                   subresources={"status"})
    rsp = await kmock.post(SLICES, json=worker_slice(None))  # the worker Service, no endpoint yet
    assert rsp.status == 200, await rsp.text()
    await operator()
    yield kmock


async def worker_replicas_one(kmock: Any) -> float:
    """The loop's clock when the worker Deployment first asks for a replica (polled every 2 ms)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while loop.time() < deadline:
        if int(((live(kmock, DEPLOYMENTS, NAME) or {}).get("spec") or {}).get("replicas") or 0) >= 1:
            return loop.time()
        await asyncio.sleep(0.002)
    raise AssertionError("the worker Deployment never asked for a replica")


async def first_request_to_replicas(kmock: Any, scale_target: bool, interval: int,
                                    spread: float = 0) -> tuple[list[float], Router]:
    """Seconds from a first request to the worker Deployment's replicas 1, per episode: at zero, a request,
    the worker started and the request answered, then back to zero (as the operator does when idle). Each
    request after a random pause of up to `spread` seconds (so requests fall anywhere between two passes)."""
    rsp = await kmock.post(f"/apis/{c.API_VERSION}/namespaces/{NS}/{c.PLURAL}",
                           json=body({"intervalSeconds": interval, "scaleToZeroAfterSeconds": 3600}))
    assert rsp.status == 200, await rsp.text()
    router, runner, url = await start_router_as_rendered(kmock, scale_target)
    kubelet = InProcessKubelet(kmock)
    stop = asyncio.Event()
    kubelet_task = asyncio.create_task(kubelet.run(stop))
    loop = asyncio.get_running_loop()
    took: list[float] = []
    try:
        await settled(kmock)
        async with aiohttp.ClientSession() as session:
            for episode in range(EPISODES):
                await asyncio.sleep(random.uniform(0, spread))
                sent = loop.time()
                answer = asyncio.create_task(session.post(url + "/v1/completions", json={
                    "model": MODEL, "prompt": "hi", "max_tokens": 3}, timeout=aiohttp.ClientTimeout(total=60)))
                took.append(await worker_replicas_one(kmock) - sent)
                async with await answer as r:
                    assert r.status == 200, await r.text()
                    assert (await r.json())["choices"][0]["text"] == " from the first worker"
                assert kubelet.started == episode + 1
                rsp = await kmock.patch(f"/apis/{c.API_VERSION}/namespaces/{NS}/{c.PLURAL}/{NAME}",
                                        json={"spec": {"replicas": 0}},
                                        headers={"Content-Type": "application/merge-patch+json"})
                assert rsp.status == 200, await rsp.text()
                await wait_for(lambda: kubelet.runner is None and not router.pool.ready(),
                               what="the worker withdrawn")
    finally:
        stop.set()
        await kubelet_task
        if kubelet.runner is not None:
            await kubelet.runner.cleanup()
        await runner.cleanup()
    label = "router --scale-target" if scale_target else f"operator pass only (intervalSeconds {interval})"
    print(f"\nscale from zero, first request -> worker Deployment replicas 1, {label}, {EPISODES} episodes: "
          f"median {statistics.median(took) * 1000:.0f} ms, max {max(took) * 1000:.0f} ms, "
          f"all {[round(t * 1000) for t in took]} ms")
    return took, router


async def test_the_first_request_brings_the_worker_deployment_to_one_replica_within_a_second(cluster: Any) -> None:
    took, router = await first_request_to_replicas(cluster, scale_target=True, interval=3600)
    scaled = router.metrics.registry.get_sample_value("hetero_infer_router_scale_from_zero_total",
                                                      {"result": "scaled"})
    assert scaled == EPISODES, "each first request of an episode wrote the scale itself"
    assert statistics.median(took) < BOUND_S, took


@pytest.mark.slow  # about two minutes: each episode waits for the operator's next pass
async def test_baseline_the_first_request_waits_for_the_operators_pass(cluster: Any) -> None:
    """The same without --scale-target, at the default intervalSeconds: the pass-based ScaledFromZero."""
    took, router = await first_request_to_replicas(cluster, scale_target=False, interval=15, spread=15)
    assert router.scaler is None
    assert max(took) < 15 + 10, took  # one pass, plus the reconcile


async def test_the_autoscaler_keeps_the_replica_the_router_asked_for(cluster: Any) -> None:
    """At zero for longer than scaleToZeroAfterSeconds, a request is held and its client gives up as soon as the
    router has written replicas 1, before any worker is ready (none is started here): the next passes see
    nothing held or routed. The replica still gets the whole window (decision.py counts coming up from zero as
    activity); without that, the first pass after the write took it away."""
    kmock = cluster
    window = 3
    rsp = await kmock.post(f"/apis/{c.API_VERSION}/namespaces/{NS}/{c.PLURAL}",
                           json=body({"intervalSeconds": 1, "scaleToZeroAfterSeconds": window}))
    assert rsp.status == 200, await rsp.text()
    router, runner, url = await start_router_as_rendered(kmock)
    loop = asyncio.get_running_loop()
    try:
        created = loop.time()
        await settled(kmock)
        await asyncio.sleep(max(0.0, window + 1 - (loop.time() - created)))  # idle longer than the window
        async with aiohttp.ClientSession() as session:
            held = asyncio.create_task(session.post(url + "/v1/completions", json={"model": MODEL, "prompt": "hi"}))
            up = await until_replicas(kmock, 1)
            held.cancel()  # the client gives up: nothing is held any more
            await asyncio.gather(held, return_exceptions=True)
        await wait_for(lambda: router.metrics.held._value.get() == 0, what="the hold to end")
        down = await until_replicas(kmock, 0, timeout=30)
    finally:
        await runner.cleanup()
    assert down - up >= window - 0.05, f"scaled back to zero {down - up:.2f}s after the router's scale-up"


async def until_replicas(kmock: Any, replicas: int, timeout: float = 10) -> float:
    """The loop's clock when the InferenceDeployment's spec.replicas is `replicas` (polled every 2 ms)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if spec_replicas(kmock) == replicas:
            return loop.time()
        await asyncio.sleep(0.002)
    raise AssertionError(f"spec.replicas never became {replicas}")
