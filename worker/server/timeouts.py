"""Timeouts for connections that hold a slot without making progress (issue 15, defect 4).

aiohttp closes a keep-alive connection that has been idle, or is stuck in the headers of its next request,
for `keepalive_timeout` seconds after a response (`--keepalive-timeout-s`, passed to the AppRunner). Before a
connection's first request it does nothing in the aiohttp releases we support (3.12 to 3.14.4: a client that
connects and sends nothing, or half a request line, holds the socket forever), and nothing bounds reading a
body. So:

- `ConnectionGuard` gives every new connection `--header-timeout-s` seconds to deliver its first request's
  headers (it wraps the aiohttp `Server`'s public per-connection hooks; the request middleware tells it when
  a request has started); then `RequestHandler.force_close()`.
- `body_timeout_middleware` reads a request's body within `--body-timeout-s` seconds, else answers 408 and
  closes the connection (the body is then cached on the request: handlers' `request.read()` returns it).

Nothing here limits a response: a slow client reading a long stream is not cut (the request timeout is
`--request-timeout`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from hetero_infer.worker.server.errors import APIError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ConnectionGuard:
    """Closes connections whose first request's headers have not arrived `header_timeout` seconds after
    they opened."""

    def __init__(self, header_timeout: float) -> None:
        self.header_timeout = header_timeout
        self._timers: dict[Any, asyncio.TimerHandle] = {}
        self.closed = 0  # connections closed for want of headers

    def install(self, server: web.Server) -> None:
        """Hook the aiohttp server's per-connection callbacks (instance attributes: nothing else changes)."""
        made, lost = server.connection_made, server.connection_lost

        def connection_made(handler: Any, transport: asyncio.Transport) -> None:
            made(handler, transport)
            loop = asyncio.get_running_loop()
            self._timers[handler] = loop.call_later(self.header_timeout, self._expire, handler)

        def connection_lost(handler: Any, exc: BaseException | None = None) -> None:
            self._cancel(handler)
            lost(handler, exc)

        server.connection_made = connection_made  # type: ignore[method-assign]
        server.connection_lost = connection_lost  # type: ignore[method-assign]

    def request_started(self, handler: Any) -> None:
        """A request's headers are in: from now on aiohttp's keep-alive timeout covers the connection."""
        self._cancel(handler)

    def _cancel(self, handler: Any) -> None:
        timer = self._timers.pop(handler, None)
        if timer is not None:
            timer.cancel()

    def _expire(self, handler: Any) -> None:
        if self._timers.pop(handler, None) is not None:
            self.closed += 1
            handler.force_close()


GUARD_KEY = web.AppKey("connection_guard", ConnectionGuard)


def guard_middleware(guard: ConnectionGuard) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        guard.request_started(request.protocol)
        return await handler(request)

    return middleware


def body_timeout_middleware(timeout: float) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.body_exists:
            try:
                await asyncio.wait_for(request.read(), timeout)
            except asyncio.TimeoutError:
                response = APIError(408, f"the request body did not arrive within {timeout:g} seconds",
                                    code="request_timeout").response()
                response.force_close()
                # Sent now and the connection closed at once: aiohttp would otherwise linger reading the rest.
                await response.prepare(request)
                await response.write_eof()
                request.protocol.force_close()
                return response
        return await handler(request)

    return middleware
