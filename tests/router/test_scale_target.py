"""`hetero-infer router --scale-target NAME`: a request held while no worker is ready asks the InferenceDeployment
for one replica at once, through its scale subresource (router/scale.py).

Against a scripted API server reached through a kubeconfig (the credentials a router outside a pod uses), with the
router app as `hetero-infer router` builds it and fake workers: what is read and written, once per hold episode,
never above one and never lower, with back-off on errors, and never in the way of the proxy path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web
from router_fakes import FakeWorker, wait_for

from hetero_infer.contracts.router_options import RouterOptions
from hetero_infer.operator import constants as c
from hetero_infer.router.app import build, make_runner
from hetero_infer.router.cli import add_scale_from_zero, resolve_options
from hetero_infer.router.scale import ScaleFromZero, scale_path, scale_up_patch

NS, NAME, TOKEN = "models", "smol", "router-sa-token"
PATH = f"/apis/{c.GROUP}/{c.VERSION}/namespaces/{NS}/{c.PLURAL}/{NAME}/scale"


@dataclass
class FakeApi:
    """The scale subresource of one InferenceDeployment, with scripted failures."""

    replicas: int = 0
    version: int = 5
    fail: list[int] = field(default_factory=list)  # statuses to answer next, one per request (GET or PATCH)
    conflicts: int = 0  # PATCHes to answer 409 (someone else wrote meanwhile)
    hang: bool = False  # do not answer until `release` (the fixture's teardown)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    seen: list[tuple[str, Any, str | None, str | None]] = field(default_factory=list)  # method, body, auth, type
    stamps: list[float] = field(default_factory=list)  # when each request arrived (the loop's clock)
    url: str = ""

    async def scale(self, request: web.Request) -> web.Response:
        body = await request.json() if request.method == "PATCH" else None
        self.seen.append((request.method, body, request.headers.get("Authorization"),
                          request.headers.get("Content-Type")))
        self.stamps.append(asyncio.get_running_loop().time())
        if self.hang:
            await self.release.wait()
        if self.fail:
            status = self.fail.pop(0)
            return web.json_response({"kind": "Status", "code": status}, status=status)
        if request.method == "PATCH":
            if self.conflicts:
                self.conflicts -= 1
                self.version += 1
                return web.json_response({"kind": "Status", "code": 409, "reason": "Conflict"}, status=409)
            if body["metadata"].get("resourceVersion") != str(self.version):
                return web.json_response({"kind": "Status", "code": 409, "reason": "Conflict"}, status=409)
            self.replicas = body["spec"]["replicas"]
            self.version += 1
        return web.json_response({"apiVersion": "autoscaling/v1", "kind": "Scale",
                                  "metadata": {"name": NAME, "namespace": NS, "resourceVersion": str(self.version)},
                                  "spec": {"replicas": self.replicas}, "status": {"replicas": self.replicas}})

    def count(self, method: str) -> int:
        return sum(m == method for m, *_ in self.seen)


@pytest.fixture
async def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeApi]:
    """The fake API server, and a kubeconfig for it exported as $KUBECONFIG (outside a pod)."""
    fake = FakeApi()
    app = web.Application()
    app.router.add_route("*", PATH, fake.scale)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    fake.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "test",
        "clusters": [{"name": "test", "cluster": {"server": fake.url}}],
        "users": [{"name": "test", "user": {"token": TOKEN}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test"}}]}))
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    yield fake
    fake.release.set()
    await runner.cleanup()


@contextlib.asynccontextmanager
async def router_with(argv: list[str], scaler: ScaleFromZero | None = None) -> AsyncIterator[tuple[Any, str]]:
    """The router app as `hetero-infer router ARGV` builds it (or with `scaler` in place of the flag's)."""
    options = resolve_options(["--health-interval-s", "0.05", "--tokenizer", "none", *argv], {})
    router, app = build(options)
    if scaler is None:
        assert add_scale_from_zero(app, router, options) is not None
    else:
        router.scaler = scaler
        app.on_startup.append(lambda _: scaler.start())
        app.on_cleanup.insert(0, lambda _: scaler.stop())
    runner = make_runner(app, shutdown_grace_s=1)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield router, f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def complete(session: aiohttp.ClientSession, url: str, timeout: float = 30) -> int:
    async with session.post(url + "/v1/completions", json={"model": "m", "prompt": "hi"},
                            timeout=aiohttp.ClientTimeout(total=timeout)) as r:
        await r.read()
        return r.status


def counter(router: Any, result: str) -> float:
    return router.metrics.registry.get_sample_value("hetero_infer_router_scale_from_zero_total", {"result": result}) or 0


# -- pure --------------------------------------------------------------------------------------------------

def test_only_zero_becomes_one_at_the_version_read() -> None:
    assert scale_up_patch({"metadata": {"resourceVersion": "7"}, "spec": {"replicas": 0}}) == {
        "metadata": {"resourceVersion": "7"}, "spec": {"replicas": 1}}
    assert scale_up_patch({"metadata": {"resourceVersion": "7"}, "spec": {}}) == {  # unset replicas read as 0
        "metadata": {"resourceVersion": "7"}, "spec": {"replicas": 1}}
    for replicas in (1, 3):
        assert scale_up_patch({"metadata": {"resourceVersion": "7"}, "spec": {"replicas": replicas}}) is None
    assert scale_path("ns", "a.b") == f"/apis/{c.GROUP}/{c.VERSION}/namespaces/ns/{c.PLURAL}/a.b/scale"


def test_the_flag_and_its_validation() -> None:
    o = resolve_options(["--scale-target", NAME, "--namespace", NS], {})
    assert (o.scale_target, o.namespace) == (NAME, NS)
    assert resolve_options([], {"HETERO_INFER_ROUTER_SCALE_TARGET": "x-1"}).scale_target == "x-1"
    assert RouterOptions().scale_target is None
    for bad in ("Smol", "ns/smol", "-x", ""):
        with pytest.raises(ValueError, match="scale_target"):
            RouterOptions(scale_target=bad)


# -- against the fake API ----------------------------------------------------------------------------------

async def test_held_requests_ask_once_for_one_replica_then_are_answered(api: FakeApi) -> None:
    worker = FakeWorker("w", ready=False)  # listed, not ready: what a loading (or absent) worker looks like
    await worker.start()
    try:
        async with router_with(["--scale-target", NAME, "--namespace", NS, "--worker", worker.url]) as (router, url), \
                aiohttp.ClientSession() as session:
            held = [asyncio.create_task(complete(session, url)) for _ in range(3)]
            await wait_for(lambda: api.count("PATCH") == 1, what="the scale-up")
            await wait_for(lambda: router.metrics.held._value.get() == 3, what="three requests held")
            await asyncio.sleep(0.3)  # more held requests, same episode: nothing more is asked
            assert [m for m, *_ in api.seen] == ["GET", "PATCH"]
            _, body, auth, ctype = api.seen[1]
            assert body == {"metadata": {"resourceVersion": "5"}, "spec": {"replicas": 1}}
            assert ctype == "application/merge-patch+json"
            assert {a for _, _, a, _ in api.seen} == {f"Bearer {TOKEN}"}
            assert api.replicas == 1 and counter(router, "scaled") == 1

            worker.ready = True  # the replica the router asked for is ready: the held requests go to it
            assert await asyncio.gather(*held) == [200, 200, 200]

            # Back at zero later (the operator scaled down when idle): the next hold is a new episode.
            worker.ready = False
            await wait_for(lambda: not router.pool.ready(), what="the worker gone")
            api.replicas = 0
            again = asyncio.create_task(complete(session, url))
            await wait_for(lambda: api.count("PATCH") == 2, what="the second episode's scale-up")
            worker.ready = True
            assert await again == 200
            assert counter(router, "scaled") == 2 and api.count("GET") == 2
    finally:
        await worker.stop()


async def test_a_size_above_zero_is_left_alone(api: FakeApi) -> None:
    api.replicas = 2  # e.g. its workers all crashed: not the router's to change
    async with router_with(["--scale-target", NAME, "--namespace", NS, "--hold-timeout-s", "0.5"]) as (router, url), \
            aiohttp.ClientSession() as session:
        assert await complete(session, url) == 503  # held until the hold time-out, as without the flag
    assert [m for m, *_ in api.seen] == ["GET"] and api.replicas == 2
    assert counter(router, "already") == 1 and counter(router, "scaled") == 0


async def test_no_ask_while_a_worker_is_ready(api: FakeApi) -> None:
    worker = FakeWorker("w")
    await worker.start()
    try:
        async with router_with(["--scale-target", NAME, "--namespace", NS, "--worker", worker.url]) as (router, url), \
                aiohttp.ClientSession() as session:
            await wait_for(lambda: router.pool.ready(), what="the worker ready")
            assert await complete(session, url) == 200
    finally:
        await worker.stop()
    assert api.seen == []


async def test_errors_back_off_and_a_conflict_reads_again(api: FakeApi, caplog: pytest.LogCaptureFixture) -> None:
    api.fail = [403, 500, 500]  # the Role not there yet, then the API server struggling
    api.conflicts = 1  # then the operator writes between our read and our write
    scaler = ScaleFromZero(NAME, NS, backoff_s=0.1, max_backoff_s=1.0)
    caplog.set_level(logging.INFO, "hetero_infer.router.scale")
    async with router_with(["--hold-timeout-s", "20"], scaler) as (router, url), aiohttp.ClientSession() as session:
        held = asyncio.create_task(complete(session, url))
        await wait_for(lambda: api.replicas == 1, what="the scale-up after the errors")
        held.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await held
    # 3 failed GETs, then GET + PATCH (409), GET + PATCH (200).
    assert [m for m, *_ in api.seen] == ["GET"] * 4 + ["PATCH", "GET", "PATCH"]
    stamps = api.stamps
    gaps = [b - a for a, b in zip(stamps, stamps[1:4], strict=False)]
    assert gaps[0] >= 0.09 and gaps[1] >= 0.19 and gaps[2] >= 0.39, gaps  # doubling back-off
    assert stamps[5] - stamps[4] < 0.09, "a conflict is read again at once, not after a back-off"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("inferencedeployments/scale" in w for w in warnings), warnings  # the 403 names the missing right
    assert len(warnings) == 2, "one warning per kind of failure, not one per attempt"


async def test_retries_stop_when_nothing_is_held(api: FakeApi) -> None:
    api.fail = [500] * 1000
    scaler = ScaleFromZero(NAME, NS, backoff_s=0.05, max_backoff_s=0.05)
    async with router_with([], scaler) as (router, url), aiohttp.ClientSession() as session:
        held = asyncio.create_task(complete(session, url))
        await wait_for(lambda: len(api.seen) >= 3, what="retries while the request is held")
        held.cancel()  # the client gives up
        with contextlib.suppress(asyncio.CancelledError):
            await held
        await wait_for(lambda: scaler.task is not None and scaler.task.done(), what="the retries to end")
        tried = len(api.seen)
        await asyncio.sleep(0.3)
        assert len(api.seen) == tried and api.replicas == 0


async def test_the_proxy_path_never_waits_for_the_api(api: FakeApi) -> None:
    api.hang = True  # an API server that takes the request and never answers
    worker = FakeWorker("w", ready=False)
    await worker.start()
    try:
        async with router_with(["--scale-target", NAME, "--namespace", NS, "--worker", worker.url]) as (router, url), \
                aiohttp.ClientSession() as session:
            held = asyncio.create_task(complete(session, url))
            await wait_for(lambda: api.seen, what="the scale read sent")
            worker.ready = True
            assert await asyncio.wait_for(held, 10) == 200
            assert (await session.get(url + "/healthz")).status == 200
    finally:
        await worker.stop()  # and the router's cleanup ended the hanging request without waiting for it


def test_metric_is_documented() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "router.md").read_text()
    assert "hetero_infer_router_scale_from_zero_total" in docs and "--scale-target" in docs
