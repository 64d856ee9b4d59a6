"""In-process fake workers and a router on free ports, for the proxy tests (one event loop, no processes)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

from aiohttp import web

from hetero_infer.contracts.block_hashes import BlockLog
from hetero_infer.contracts.router_options import RouterOptions
from hetero_infer.router.app import Router, create_app, make_runner


@dataclass
class FakeWorker:
    """A worker whose behaviour each test sets: readiness, refusals, dropping mid-stream, stalling."""

    name: str
    ready: bool = True
    refuse: int | None = None  # answer every generation request with this status
    chunks: int = 3
    drop_after_first: bool = False  # send one chunk, then cut the connection once `cut` is set
    stall: bool = False  # send one chunk, then wait forever
    block_log: BlockLog | None = None  # serve /v1/cache/blocks from it
    waiting: int = 0  # reported on /metrics
    kv_usage: float = 0.0
    models: list[str] | None = None  # served on GET /v1/models (None: the endpoint is absent, as another server)
    parents: dict[str, str] = field(default_factory=dict)  # LoRA adapter -> its base model (the card's parent)
    extra_metrics: str = ""  # more exposition lines on /metrics (vllm:lora_requests_info)
    requests: list[dict] = field(default_factory=list)
    aborted: asyncio.Event = field(default_factory=asyncio.Event)
    cut: asyncio.Event = field(default_factory=asyncio.Event)
    url: str = ""
    runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/v1/cache/blocks", self.blocks)
        app.router.add_get("/v1/models", self.list_models)
        return app

    async def list_models(self, request: web.Request) -> web.Response:
        if self.models is None:
            return web.Response(status=404)
        return web.json_response({"object": "list", "data": [
            {"id": m, "object": "model", "owned_by": self.name, **({"parent": self.parents[m]} if m in self.parents
                                                                   else {})} for m in self.models]})

    async def readyz(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.ready else 503)

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=f"hetero_infer_num_requests_running 1\nhetero_infer_num_requests_waiting "
                                 f"{self.waiting}\nhetero_infer_kv_cache_usage_ratio {self.kv_usage}\n"
                                 f"{self.extra_metrics}")

    async def blocks(self, request: web.Request) -> web.Response:
        if self.block_log is None:
            return web.Response(status=404)
        since = request.query.get("since")
        return web.json_response(self.block_log.to_json(request.query.get("epoch"),
                                                        None if since is None else int(since), 4))

    async def completions(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(await request.json())
        if self.models is not None and self.requests[-1].get("model") not in self.models:
            return web.json_response({"error": {"message": "not mine", "code": "model_not_found"}}, status=404)
        if self.refuse:
            return web.json_response({"error": {"message": "busy"}}, status=self.refuse, headers={"X-From": self.name})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "X-From": self.name})
        await resp.prepare(request)
        try:
            for i in range(self.chunks):
                await resp.write(f"data: {json.dumps({'worker': self.name, 'i': i})}\n\n".encode())
                if i == 0 and self.drop_after_first:
                    await self.cut.wait()
                    request.transport.close()
                    return resp
                if i == 0 and self.stall:
                    await asyncio.Event().wait()
            await resp.write(b"data: [DONE]\n\n")
        except (asyncio.CancelledError, ConnectionResetError):
            self.aborted.set()
            raise
        return resp

    async def start(self) -> None:
        self.runner = web.AppRunner(self.app(), handler_cancellation=True)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


async def start_router(options: RouterOptions) -> tuple[Router, web.AppRunner, str]:
    router = Router(options)
    runner = make_runner(create_app(router))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return router, runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


async def wait_for(predicate, timeout: float = 30.0, what: str = "condition") -> None:
    """Poll `predicate` until true; fail after a generous `timeout`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)
