"""API keys: `Authorization: Bearer <key>` checked against the keys a server was given (the worker's --api-key,
the router's own --api-key), in constant time."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Sequence

from aiohttp import web

from hetero_infer.contracts.errors import APIError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def bearer_matches(authorization: str, keys: Sequence[bytes]) -> bool:
    """Whether the header holds one of `keys` (compared against every key, whatever matches first)."""
    scheme, _, token = authorization.partition(" ")
    given = token.strip().encode() if scheme.lower() == "bearer" else b""
    ok = False
    for key in keys:
        ok |= hmac.compare_digest(given, key)
    return ok


def check_api_key(request: web.Request, keys: Sequence[bytes]) -> None:
    """401 (OpenAI's `invalid_api_key`) unless the request carries one of `keys`; nothing when there are none."""
    if keys and not bearer_matches(request.headers.get("Authorization", ""), keys):
        raise APIError(401, "Incorrect or missing API key. Send it as `Authorization: Bearer <key>`.",
                       code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


def api_key_middleware(keys: Sequence[str], protected: tuple[str, ...]) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Paths starting with one of `protected` need a key (probes and /metrics stay open)."""
    encoded = [k.encode() for k in keys]

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.startswith(protected):
            check_api_key(request, encoded)
        return await handler(request)

    return middleware
