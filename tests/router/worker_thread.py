"""Real worker servers for the router's tests: `real_workers` on the test's own event loop (async tests), and
`ThreadedWorker` on its own loop in a thread, for synchronous tests (hypothesis) that talk to it over HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import urllib.error
import urllib.request
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from hetero_infer.contracts.server_options import ServerOptions
from hetero_infer.worker.core.engine import LLMEngine
from hetero_infer.worker.server.app import create_app
from hetero_infer.worker.server.state import ServerState


@contextlib.asynccontextmanager
async def real_workers(engines: list[LLMEngine], **options: Any):
    """One worker server per engine (ServerOptions `options`), on this event loop; yields their base URLs."""
    servers, clients = [], []
    try:
        for engine in engines:
            state = ServerState(ServerOptions(access_log=False, **options))
            server = TestServer(create_app(state))
            await server.start_server()
            servers.append(server)
            clients.append(state.start_engine(engine, max_num_seqs=engine.config.max_num_seqs))
        yield [str(s.make_url("")).rstrip("/") for s in servers]
    finally:
        for c in clients:
            c.shutdown()
        for s in servers:
            await s.close()


@contextlib.asynccontextmanager
async def one_routed_worker(engine: LLMEngine, **router_options: Any):
    """A worker (default options) behind a router with these options, on this event loop, once the router sees
    the worker ready; yields the router's base URL."""
    from router_fakes import start_router, wait_for

    from hetero_infer.contracts.router_options import RouterOptions

    async with real_workers([engine]) as workers:
        router, runner, url = await start_router(RouterOptions(worker=workers, health_interval_s=0.02,
                                                               tokenizer="none", **router_options))
        try:
            await wait_for(lambda: len(router.pool.ready()) == 1, what="the worker ready")
            yield url
        finally:
            await runner.cleanup()


class ThreadedWorker:
    def __init__(self, engine: LLMEngine, **server_options: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.url, self._runner, self._client = asyncio.run_coroutine_threadsafe(
            self._start(engine, server_options), self.loop).result(60)

    async def _start(self, engine: LLMEngine, server_options: dict[str, Any]) -> tuple[str, web.AppRunner, Any]:
        state = ServerState(ServerOptions(access_log=False, **server_options))
        runner = web.AppRunner(create_app(state))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        client = state.start_engine(engine, max_num_seqs=engine.config.max_num_seqs)
        return f"http://127.0.0.1:{runner.addresses[0][1]}", runner, client

    def request(self, method: str, path: str, body: Any = None,
                headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def stop(self) -> None:
        async def _stop() -> None:
            self._client.shutdown()
            await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(_stop(), self.loop).result(60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
