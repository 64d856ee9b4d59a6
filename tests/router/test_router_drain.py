"""The router stopping (SIGTERM, as the kubelet sends it after the pod's preStop): a real `hetero-infer router`
process in front of an in-process worker that streams slowly. It stops listening at once, but the streams in
flight finish and a request it holds is still routed once a worker is ready, for up to --shutdown-grace-s;
what runs longer is cut at that bound (the pod's grace period, rendered from the same hold time-out, covers
it: operator/manifests/router.py)."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest
from aiohttp import web
from cli_process import CliProcess

CHUNKS = 12
CHUNK_S = 0.15  # a stream of about 1.8 s


class SlowWorker:
    def __init__(self) -> None:
        self.ready = True
        self.url = ""
        self.runner: web.AppRunner | None = None

    async def readyz(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.ready else 503)

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text="hetero_infer_num_requests_running 0\nhetero_infer_num_requests_waiting 0\n")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(CHUNKS):
            await resp.write(f"data: {json.dumps({'i': i})}\n\n".encode())
            await asyncio.sleep(CHUNK_S)
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def __aenter__(self) -> SlowWorker:
        app = web.Application()
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/v1/completions", self.completions)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.runner is not None
        await self.runner.cleanup()


async def start_router(worker: SlowWorker, grace_s: float) -> CliProcess:
    router = await asyncio.to_thread(
        CliProcess, "router", "--port", "0", "--worker", worker.url, "--tokenizer", "none",
        "--health-interval-s", "0.05", "--hold-timeout-s", "30", "--shutdown-grace-s", str(grace_s))
    await asyncio.to_thread(router.wait_ready)
    return router


async def stream(session: aiohttp.ClientSession, url: str, first: asyncio.Event) -> list[str]:
    """The events of one streamed completion; `first` is set at the first one."""
    events = []
    async with session.post(f"{url}/v1/completions", json={"prompt": "hi", "stream": True}) as r:
        assert r.status == 200
        async for line in r.content:
            if line.startswith(b"data: "):
                events.append(line[6:].strip().decode())
                first.set()
    return events


async def exit_code(router: CliProcess, timeout: float) -> int:
    return await asyncio.wait_for(asyncio.to_thread(router.proc.wait), timeout)


async def test_sigterm_finishes_the_streams_in_flight_and_stops_listening() -> None:
    async with SlowWorker() as worker, aiohttp.ClientSession() as session:
        router = await start_router(worker, grace_s=30)
        try:
            first = asyncio.Event()
            task = asyncio.create_task(stream(session, router.url, first))
            await asyncio.wait_for(first.wait(), 30)
            router.terminate()
            await asyncio.sleep(0.3)
            with pytest.raises(aiohttp.ClientConnectionError):  # no new connection is taken
                async with session.get(router.url + "/healthz") as r:
                    await r.read()
            events = await asyncio.wait_for(task, 30)
            assert events == [json.dumps({"i": i}) for i in range(CHUNKS)] + ["[DONE]"]
            assert await exit_code(router, 30) == 0
        finally:
            router.stop()


async def test_a_request_held_at_sigterm_is_still_routed_when_a_worker_is_ready() -> None:
    async with SlowWorker() as worker, aiohttp.ClientSession() as session:
        router = await start_router(worker, grace_s=30)
        try:
            worker.ready = False
            await asyncio.sleep(0.5)  # the router's health checks see it
            first = asyncio.Event()
            task = asyncio.create_task(stream(session, router.url, first))
            await asyncio.sleep(0.5)  # held: no ready worker
            assert not first.is_set()
            router.terminate()
            await asyncio.sleep(0.3)
            worker.ready = True
            events = await asyncio.wait_for(task, 30)
            assert events[-1] == "[DONE]" and len(events) == CHUNKS + 1
            assert await exit_code(router, 30) == 0
        finally:
            router.stop()


async def test_the_drain_is_bounded_by_shutdown_grace() -> None:
    async with SlowWorker() as worker, aiohttp.ClientSession() as session:
        router = await start_router(worker, grace_s=0.3)
        try:
            first = asyncio.Event()
            task = asyncio.create_task(stream(session, router.url, first))
            await asyncio.wait_for(first.wait(), 30)
            start = time.monotonic()
            router.terminate()
            assert await exit_code(router, 30) == 0
            assert time.monotonic() - start < CHUNKS * CHUNK_S  # it did not wait for the whole stream
            try:
                events = await asyncio.wait_for(task, 30)
            except aiohttp.ClientError:
                events = []
            assert "[DONE]" not in events
        finally:
            router.stop()
