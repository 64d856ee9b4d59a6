"""Discovery from EndpointSlices: the pure mapping, and the watch against the KMock API emulator feeding a real
WorkerPool whose workers are small HTTP servers on loopback addresses (127.0.0.x, one port, as pod IPs are)."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from hetero_infer.router.discovery import SERVICE_NAME_LABEL, Discovery, endpoint_urls, ready_urls
from hetero_infer.router.index import PrefixIndex
from hetero_infer.router.pool import WorkerPool

OPERATOR_TESTS = Path(__file__).resolve().parents[1] / "operator"
if str(OPERATOR_TESTS) not in sys.path:
    sys.path.insert(0, str(OPERATOR_TESTS))


from borrowed_fixtures import operator_fixtures  # noqa: E402

_operator_fixtures = operator_fixtures()
crd = _operator_fixtures.crd
kmock_options = _operator_fixtures.kmock_options
kubeconfig = _operator_fixtures.kubeconfig

NS = "models"
SLICES = f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices"


def endpoint(ip: str, ready: bool | None = True, terminating: bool = False) -> dict[str, Any]:
    conditions: dict[str, Any] = {"serving": ready is not False, "terminating": terminating}
    if ready is not None:
        conditions["ready"] = ready
    return {"addresses": [ip], "conditions": conditions, "nodeName": "node-1",
            "targetRef": {"kind": "Pod", "namespace": NS, "name": f"pod-{ip.replace('.', '-')}"}}


def endpoint_slice(name: str, service: str, endpoints: list[dict[str, Any]], port: int = 3000,
                   port_name: str = "http", address_type: str = "IPv4") -> dict[str, Any]:
    """An EndpointSlice as the EndpointSlice controller writes it (discovery.k8s.io/v1)."""
    return {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": NS, "generateName": f"{service}-",
                     "labels": {SERVICE_NAME_LABEL: service,
                                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"},
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": service, "uid": "svc-uid",
                                          "controller": True, "blockOwnerDeletion": True}]},
        "addressType": address_type,
        "endpoints": endpoints,
        "ports": [{"name": port_name, "port": port, "protocol": "TCP"}],
    }


# -- pure ---------------------------------------------------------------------------------------------------

def test_ready_endpoints_only_with_the_http_port() -> None:
    eps = endpoint_slice("w-1", "w", [endpoint("10.0.0.1"), endpoint("10.0.0.2", ready=False),
                                      endpoint("10.0.0.3", ready=False, terminating=True),
                                      endpoint("10.0.0.4", ready=None)], port=8000)
    # ready unset means unknown, which the API says to read as ready
    assert endpoint_urls(eps) == {"http://10.0.0.1:8000", "http://10.0.0.4:8000"}


def test_port_choice_ipv6_and_union_over_slices() -> None:
    eps = endpoint_slice("w-1", "w", [endpoint("10.0.0.1")])
    eps["ports"] = [{"name": "metrics", "port": 9090}, {"name": "http", "port": 3000}]
    assert endpoint_urls(eps) == {"http://10.0.0.1:3000"}
    assert endpoint_urls(eps, port="metrics") == {"http://10.0.0.1:9090"}
    assert endpoint_urls(eps, port="9090") == {"http://10.0.0.1:9090"}
    assert endpoint_urls(eps, port="grpc") == set()
    unnamed = endpoint_slice("w-2", "w", [endpoint("10.0.0.2")], port=7000, port_name="")
    assert endpoint_urls(unnamed) == {"http://10.0.0.2:7000"}
    v6 = endpoint_slice("w-3", "w", [endpoint("fd00::5")], address_type="IPv6")
    assert endpoint_urls(v6) == {"http://[fd00::5]:3000"}
    no_ports = {**endpoint_slice("w-4", "w", [endpoint("10.0.0.9")]), "ports": None}
    assert endpoint_urls(no_ports) == set()
    moving = endpoint_slice("w-5", "w", [endpoint("10.0.0.1")])  # one pod in two slices while it moves
    assert ready_urls([eps, unnamed, moving]) == {"http://10.0.0.1:3000", "http://10.0.0.2:7000"}


# -- against the API emulator ----------------------------------------------------------------------------------

def free_port(hosts: list[str]) -> int:
    """A port free on every one of `hosts`."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind((hosts[0], 0))
            port = s.getsockname()[1]
        try:
            for host in hosts[1:]:
                with socket.socket() as s:
                    s.bind((host, port))
            return port
        except OSError:
            continue
    raise RuntimeError("no common free port")


@pytest.fixture
async def loopback_workers() -> AsyncIterator[tuple[int, list[str]]]:
    """Workers answering /readyz and /metrics on 127.0.0.2-4, all on one port (as pods share the container port)."""
    hosts = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    port = free_port(hosts)

    async def readyz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text="hetero_infer_num_requests_running 0\n")

    runners = []
    for host in hosts:
        app = web.Application()
        app.router.add_get("/readyz", readyz)
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, host, port).start()
        runners.append(runner)
    yield port, hosts
    for runner in runners:
        await runner.cleanup()


async def until(predicate: Any, what: str, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def test_the_watch_feeds_the_pool_ready_endpoints_only(kmock: Any, kubeconfig: Path,
                                                              loopback_workers: tuple[int, list[str]]) -> None:
    port, (a, b, c) = loopback_workers
    url = {h: f"http://{h}:{port}" for h in (a, b, c)}
    pool = WorkerPool([], PrefixIndex(64), 16, 0.05)
    discovery = Discovery(pool, "smol-workers", NS)

    def ready() -> set[str]:
        return {w.url for w in pool.ready()}

    async def post(body: dict[str, Any]) -> None:
        rsp = await kmock.post(SLICES, json=body)
        assert rsp.status == 200, await rsp.text()

    async def patch(name: str, body: dict[str, Any]) -> None:
        rsp = await kmock.patch(f"{SLICES}/{name}", json=body,
                                headers={"Content-Type": "application/merge-patch+json"})
        assert rsp.status == 200, await rsp.text()

    async with aiohttp.ClientSession() as session:
        await pool.start(session)
        try:
            # A slice that exists before the router starts comes with the first list.
            await post(endpoint_slice("smol-workers-x1", "smol-workers", [endpoint(a), endpoint(b, ready=False)],
                                      port=port))
            await discovery.start()
            await until(lambda: ready() == {url[a]}, "the listed ready endpoint")
            assert url[b] not in pool.workers  # not ready: never polled
            # Another Service's slice (its worker answers /readyz too) never joins.
            await post(endpoint_slice("other-x1", "other", [endpoint(c)], port=port))
            # The second endpoint passes its readiness probe: a MODIFIED event.
            await patch("smol-workers-x1", {"endpoints": [endpoint(a), endpoint(b)]})
            await until(lambda: ready() == {url[a], url[b]}, "the endpoint that became ready")
            assert url[c] not in pool.workers
            # A pod going away: terminating, not ready. It leaves the pool at once.
            await patch("smol-workers-x1", {"endpoints": [endpoint(a, ready=False, terminating=True), endpoint(b)]})
            await until(lambda: ready() == {url[b]}, "the terminating endpoint to leave")
            # A second slice of the same Service (large Services have several).
            await post(endpoint_slice("smol-workers-x2", "smol-workers", [endpoint(c)], port=port))
            await until(lambda: ready() == {url[b], url[c]}, "the second slice's endpoint")
            # The Service deleted (its slices go): nothing left.
            for name in ("smol-workers-x1", "smol-workers-x2"):
                rsp = await kmock.delete(f"{SLICES}/{name}")
                assert rsp.status == 200, await rsp.text()
            await until(lambda: ready() == set(), "every endpoint to leave")
        finally:
            await discovery.stop()
            await pool.stop()


async def test_workers_given_with_worker_stay_the_pools_own(
        kmock: Any, kubeconfig: Path, loopback_workers: tuple[int, list[str]]) -> None:
    port, (a, b, _) = loopback_workers
    static = f"http://{a}:{port}"
    pool = WorkerPool([static], PrefixIndex(64), 16, 0.05)
    discovery = Discovery(pool, "smol-workers", NS)
    async with aiohttp.ClientSession() as session:
        await pool.start(session)
        try:
            await discovery.start()
            await until(lambda: discovery.watcher is not None and discovery.watcher.synced.is_set(), "first list")
            await until(lambda: {w.url for w in pool.ready()} == {static}, "the --worker worker")
            # The --worker URL listed as a not-ready endpoint is still the pool's own: discovery never removes it.
            rsp = await kmock.post(SLICES, json=endpoint_slice("smol-workers-x1", "smol-workers",
                                                               [endpoint(a, ready=False), endpoint(b)], port=port))
            assert rsp.status == 200
            await until(lambda: {w.url for w in pool.ready()} == {static, f"http://{b}:{port}"}, "discovered worker")
            assert discovery.membership.urls == {f"http://{b}:{port}"}
        finally:
            await discovery.stop()
            await pool.stop()


def test_the_router_runs_without_the_engines_dependencies() -> None:
    """The router pods run the operator image (the `operator` extra only: no torch, numpy or transformers):
    the router with discovery must build without them."""
    import subprocess

    code = (
        "import importlib.abc, sys\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] in ('torch', 'numpy', 'transformers', 'triton', 'safetensors', 'tokenizers'):\n"
        "            raise ImportError('not in the operator image: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "from hetero_infer.router.app import build\n"
        "from hetero_infer.router.cli import add_discovery, resolve_options\n"
        "options = resolve_options(['--discover-service', 'w', '--namespace', 'n'], {})\n"
        "router, app = build(options)\n"
        "assert add_discovery(app, router.pool, options) is not None\n"
        "print('built')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "built" in proc.stdout, proc.stderr


async def test_a_watch_resumes_where_it_ended_and_lists_again_after_410_gone(
        loopback_workers: tuple[int, list[str]], caplog: pytest.LogCaptureFixture) -> None:
    """Against a scripted API server: a watch the server ends is resumed from the last resourceVersion seen; a
    410 Gone (history compacted) makes the router list again at once, as routine (no warning, no back-off);
    every request carries the credentials."""
    from hetero_infer.router.discovery import ApiAccess

    port, (a, b, c) = loopback_workers
    url = {h: f"http://{h}:{port}" for h in (a, b, c)}
    seen: list[tuple[str, str | None, str | None]] = []  # (list|watch, resourceVersion, Authorization)
    lists = [([endpoint(a)], "10"), ([endpoint(c)], "20")]
    release = asyncio.Event()

    async def endpointslices(request: web.Request) -> web.StreamResponse:
        watch = request.query.get("watch") == "true"
        assert request.query["labelSelector"] == f"{SERVICE_NAME_LABEL}=smol-workers"
        seen.append(("watch" if watch else "list", request.query.get("resourceVersion"),
                     request.headers.get("Authorization")))
        if not watch:
            endpoints, version = lists.pop(0)
            item = endpoint_slice("smol-workers-x1", "smol-workers", endpoints, port=port)
            return web.json_response({"kind": "EndpointSliceList", "apiVersion": "discovery.k8s.io/v1",
                                      "metadata": {"resourceVersion": version}, "items": [item]})
        rsp = web.StreamResponse()
        await rsp.prepare(request)
        watches = sum(kind == "watch" for kind, _, _ in seen)
        if watches == 1:  # an event, then the server ends the watch (its timeout)
            item = endpoint_slice("smol-workers-x1", "smol-workers", [endpoint(a), endpoint(b)], port=port)
            item["metadata"]["resourceVersion"] = "15"
            await rsp.write(json.dumps({"type": "MODIFIED", "object": item}).encode() + b"\n")
        elif watches == 2:  # the history no longer reaches back
            await rsp.write(json.dumps({"type": "ERROR", "object": {"kind": "Status", "code": 410,
                                                                    "reason": "Expired"}}).encode() + b"\n")
        else:
            await release.wait()
        return rsp

    app = web.Application()
    app.router.add_get("/apis/discovery.k8s.io/v1/namespaces/models/endpointslices", endpointslices)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    api = f"http://127.0.0.1:{runner.addresses[0][1]}"
    pool = WorkerPool([], PrefixIndex(64), 16, 0.05)
    discovery = Discovery(pool, "smol-workers", NS, access=ApiAccess(api, lambda: "Bearer sa-token"))
    async with aiohttp.ClientSession() as session:
        await pool.start(session)
        try:
            await discovery.start()
            await until(lambda: [k for k, _, _ in seen] == ["list", "watch", "watch", "list", "watch"],
                        "list, watch, resumed watch, list after 410, watch")
            await until(lambda: {w.url for w in pool.ready()} == {url[c]}, "the second list's endpoint only")
        finally:
            release.set()
            await discovery.stop()
            await pool.stop()
            await runner.cleanup()
    assert [v for _, v, _ in seen] == [None, "10", "15", None, "20"]
    assert {auth for _, _, auth in seen} == {"Bearer sa-token"}
    assert not [r for r in caplog.records if r.name.startswith("hetero_infer.router.discovery")
                and r.levelname == "WARNING"]
