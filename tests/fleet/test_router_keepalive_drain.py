"""The router's drain and clients that keep their connection alive (router/drain.py), with a real router process.

A client's SDK sends its next request on the connection its last answer came on. After SIGTERM the router
must not close that connection under it: the stream in flight finishes, the next request on the same connection
is still answered, with `Connection: close`, and only then does the connection close (the client's next one
goes to another router). A connection left idle is closed after a second, so the router exits without waiting
for its whole grace period.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import aiohttp
from cli_process import CliProcess

ROUTER_TESTS = Path(__file__).resolve().parents[1] / "router"
if str(ROUTER_TESTS) not in sys.path:
    sys.path.insert(0, str(ROUTER_TESTS))

from test_router_drain import CHUNKS, SlowWorker  # noqa: E402  (a worker streaming CHUNKS events, then [DONE])


async def start_router(worker: SlowWorker) -> CliProcess:
    router = await asyncio.to_thread(CliProcess, "router", "--port", "0", "--worker", worker.url, "--tokenizer",
                                     "none", "--health-interval-s", "0.05", "--shutdown-grace-s", "30")
    await asyncio.to_thread(router.wait_ready)
    return router


async def read_events(r: aiohttp.ClientResponse) -> list[str]:
    return [line[6:].strip().decode() async for line in r.content if line.startswith(b"data: ")]


async def test_a_kept_alive_connection_gets_its_next_request_answered_then_closed() -> None:
    async with SlowWorker() as worker:
        router = await start_router(worker)
        try:
            # One connection, reused: what an SDK's pool does for one user.
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session:
                async with session.post(router.url + "/v1/completions", json={"stream": True}) as r:
                    first_conn = r.connection and r.connection.transport
                    assert r.status == 200 and "close" not in r.headers.get("Connection", "").lower()
                    assert (await r.content.readline()).startswith(b"data: ")
                    router.terminate()  # mid-stream
                    sigterm = time.monotonic()
                    events = await read_events(r)
                assert events[-1] == "[DONE]" and len(events) == CHUNKS  # the first event was read above
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


async def test_an_idle_kept_alive_connection_is_closed_and_the_router_exits() -> None:
    async with SlowWorker() as worker:
        router = await start_router(worker)
        try:
            async with aiohttp.ClientSession() as session:
                async with session.get(router.url + "/healthz") as r:  # leaves an idle kept-alive connection
                    assert r.status == 200
                router.terminate()
                start = time.monotonic()
                code = await asyncio.wait_for(asyncio.to_thread(router.proc.wait), 30)
                assert code == 0 and time.monotonic() - start < 10
        finally:
            router.stop()
