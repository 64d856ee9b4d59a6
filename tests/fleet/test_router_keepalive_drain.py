"""The router's drain and clients that keep their connection alive (router/drain.py), with a real router process.

A client's SDK sends its next request on the connection its last answer came on. After SIGTERM the router
must not close that connection under it: the stream in flight finishes, the next request on the same connection
is still answered, with `Connection: close`, and only then does the connection close (the client's next one
goes to another router). A connection left idle is closed after a second, so the router exits without waiting
for its whole grace period.
"""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
from aiohttp import web
from cli_process import CliProcess

CHUNKS = 8
CHUNK_S = 0.1


async def slow_completions(request: web.Request) -> web.StreamResponse:
    await request.read()
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for i in range(CHUNKS):
        await resp.write(f"data: {json.dumps({'i': i})}\n\n".encode())
        await asyncio.sleep(CHUNK_S)
    await resp.write(b"data: [DONE]\n\n")
    return resp


async def readyz(_: web.Request) -> web.Response:
    return web.Response(text="ok")


async def metrics(_: web.Request) -> web.Response:
    return web.Response(text="hetero_infer_num_requests_running 0\n")


async def start_worker() -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/completions", slow_completions)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


async def read_events(r: aiohttp.ClientResponse) -> list[str]:
    return [line[6:].strip().decode() async for line in r.content if line.startswith(b"data: ")]


async def test_a_kept_alive_connection_gets_its_next_request_answered_then_closed() -> None:
    worker, url = await start_worker()
    router = await asyncio.to_thread(CliProcess, "router", "--port", "0", "--worker", url, "--tokenizer", "none",
                                     "--health-interval-s", "0.05", "--shutdown-grace-s", "30")
    try:
        await asyncio.to_thread(router.wait_ready)
        # One connection, reused: what an SDK's pool does for one user.
        connector = aiohttp.TCPConnector(limit=1)
        async with aiohttp.ClientSession(connector=connector) as session:
            async with session.post(router.url + "/v1/completions", json={"stream": True}) as r:
                first_conn = r.connection and r.connection.transport
                assert r.status == 200 and "close" not in r.headers.get("Connection", "").lower()
                line = await r.content.readline()
                assert line.startswith(b"data: ")
                router.terminate()  # mid-stream
                sigterm = time.monotonic()
                events = await read_events(r)
            assert events[-1] == "[DONE]" and len(events) == CHUNKS  # the first chunk was read above
            # At once, on the same connection: answered, and told to close.
            async with session.post(router.url + "/v1/completions", json={"stream": True}) as r:
                assert r.connection is not None and r.connection.transport is first_conn
                assert r.status == 200
                assert r.headers.get("Connection", "").lower() == "close"
                events = await read_events(r)
            assert events[-1] == "[DONE]" and len(events) == CHUNKS + 1
            code = await asyncio.wait_for(asyncio.to_thread(router.proc.wait), 30)
        assert code == 0
        assert time.monotonic() - sigterm < 15  # it left once its connections were gone, not at the grace's end
    finally:
        router.stop()
        await worker.cleanup()


async def test_an_idle_kept_alive_connection_is_closed_and_the_router_exits() -> None:
    worker, url = await start_worker()
    router = await asyncio.to_thread(CliProcess, "router", "--port", "0", "--worker", url, "--tokenizer", "none",
                                     "--health-interval-s", "0.05", "--shutdown-grace-s", "30")
    try:
        await asyncio.to_thread(router.wait_ready)
        async with aiohttp.ClientSession() as session:
            async with session.get(router.url + "/healthz") as r:  # leaves an idle kept-alive connection
                assert r.status == 200
            router.terminate()
            start = time.monotonic()
            code = await asyncio.wait_for(asyncio.to_thread(router.proc.wait), 30)
            assert code == 0 and time.monotonic() - start < 10
    finally:
        router.stop()
        await worker.cleanup()
