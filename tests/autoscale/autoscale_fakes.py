"""Fake worker pods for the autoscaling tests: HTTP servers with a worker's /metrics, values set by a test."""

from __future__ import annotations

from typing import Any

import kmock
from aiohttp import web

PODS = kmock.resource("", "v1", "pods")


class FakeWorkers:
    """In-process HTTP servers with a worker's /metrics; the test sets the gauges."""

    def __init__(self) -> None:
        self.runners: list[web.AppRunner] = []
        self.ports: list[int] = []
        self.values: dict[int, tuple[float, float] | None] = {}  # None: the worker answers 503

    async def start(self, n: int) -> None:
        for i in range(n):
            app = web.Application()
            app.router.add_get("/metrics", self._handler(i))
            runner = web.AppRunner(app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.runners.append(runner)
            self.ports.append(runner.addresses[0][1])
            self.values[i] = (0.0, 0.0)

    def _handler(self, i: int) -> Any:
        async def metrics(_: web.Request) -> web.Response:
            v = self.values[i]
            if v is None:
                return web.Response(status=503, text="engine failed")
            kv, queue = v
            text = (f'hetero_infer_kv_cache_usage_ratio{{model_name="m"}} {kv}\n'
                    f'hetero_infer_num_requests_waiting{{model_name="m"}} {queue}\n'
                    f'hetero_infer_num_requests_running{{model_name="m"}} 4\n')
            return web.Response(text=text)
        return metrics

    def set_all(self, kv: float, queue: float) -> None:
        for i in self.values:
            self.values[i] = (kv, queue)

    async def stop(self) -> None:
        for runner in self.runners:
            await runner.cleanup()
