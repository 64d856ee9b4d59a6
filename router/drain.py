"""Stopping the router without closing a client's connection under its next request (SIGTERM, after the preStop).

By SIGTERM kube-proxy sends no new connection here (the endpoint left the Service first), but the connections
clients keep alive still do: an SDK sends its next request on the connection its last answer came on. Closing
such a connection (what a plain server shutdown does, once its response is done) fails the request the client is
writing at that moment: it was never told the connection would close. So the drain:

- stops listening;
- answers every response prepared from now on with `Connection: close`, so each client opens its next
  connection elsewhere after this answer;
- closes a connection itself only once it has sat idle for `idle_close_s` (an idle keep-alive connection the
  client has stopped using; a busy one is closed by its `Connection: close` answer instead);
- when no connection is left, or `grace_s` is over, cleans up: what still runs then is cut.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web

logger = logging.getLogger("hetero_infer.router")

IDLE_CLOSE_S = 1.0


class Drain:
    def __init__(self, idle_close_s: float = IDLE_CLOSE_S) -> None:
        self.idle_close_s = idle_close_s
        self.draining = False
        self._active: dict[Any, int] = {}  # a connection (its RequestHandler) -> its requests being handled
        self._idle_since: dict[Any, float] = {}  # when a connection's last request ended, during the drain only

    def install(self, app: web.Application) -> None:
        """Before the app starts: track each connection's requests, and mark responses during the drain."""
        app.middlewares.insert(0, self._track)
        app.on_response_prepare.append(self._on_prepare)

    @web.middleware
    async def _track(self, request: web.Request, handler: Any) -> web.StreamResponse:
        conn = request.protocol
        self._active[conn] = self._active.get(conn, 0) + 1
        try:
            return await handler(request)
        finally:
            left = self._active.pop(conn) - 1
            if left:
                self._active[conn] = left
            if self.draining:
                self._idle_since[conn] = asyncio.get_running_loop().time()

    async def _on_prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        if self.draining:  # the headers are computed by now (aiohttp runs this hook after): set both
            response.force_close()
            response.headers["Connection"] = "close"

    async def run(self, runner: web.AppRunner, grace_s: float) -> None:
        """Drain, then clean the runner up (within `grace_s` in all)."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        deadline = start + grace_s
        self.draining = True
        for site in list(runner.sites):
            await site.stop()
        server = runner.server
        logger.info("draining: %d connection(s), %d request(s) in flight, grace %.1f s",
                    len(server.connections) if server else 0, sum(self._active.values()), grace_s)
        while server is not None and server.connections and loop.time() < deadline:
            now = loop.time()
            for conn in server.connections:
                idle_for = now - max(start, self._idle_since.get(conn, start))
                if not self._active.get(conn) and idle_for >= self.idle_close_s and _waiting(conn):
                    conn.force_close()
            await asyncio.sleep(0.05)
        if server is not None and server.connections:
            logger.warning("grace period over: closing %d connection(s), %d request(s) in flight",
                           len(server.connections), sum(self._active.values()))
            for conn in server.connections:  # what still runs is cut
                conn.force_close()
        await runner.cleanup()
        logger.info("drained in %.1f s", loop.time() - start)


def _waiting(conn: Any) -> bool:
    """The connection waits for its next request (nothing read yet), as aiohttp's own keep-alive timer checks before
    it closes one (RequestHandler._process_keepalive); a request read but not yet handled is not lost."""
    waiter = getattr(conn, "_waiter", None)
    return waiter is not None and not waiter.done()
