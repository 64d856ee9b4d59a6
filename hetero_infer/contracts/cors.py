"""Cross-site policy (issue 15, defect 5): an unauthenticated worker must not run what a web page on another site
makes a browser send it.

- CORS is off by default. `--allowed-origins` (`*` for any) turns it on, with `--allowed-methods`,
  `--allowed-headers` and `--allow-credentials` as in vLLM; allowed origins get the `Access-Control-Allow-*`
  headers and their preflight (`OPTIONS` with `Access-Control-Request-Method`) a 204.
- A request that changes something (any method but GET, HEAD, OPTIONS) carrying a foreign `Origin` (not
  allowed, and not this server's own `Host`) is refused with 403 before its handler runs: browsers send
  `Origin` with every cross-origin POST, including the "simple" ones (`text/plain`, form bodies) that skip
  the preflight.
- A POST body must be JSON: a `Content-Type` other than `application/json` (or `*/*+json`) is a 415, as
  vLLM's FastAPI does. A body without `Content-Type` is read as JSON (raw clients).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import hdrs, web

from hetero_infer.contracts.errors import APIError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# The options' help, for every server that takes them (the worker's `serve`, the router).
HELP = {
    "allowed_origins": "origins allowed to call this server from a browser (repeatable; * for any); CORS is off "
    "without, and requests with a foreign Origin that change something get 403",
    "allowed_methods": "methods allowed to those origins (repeatable; default *)",
    "allowed_headers": "request headers allowed to those origins (repeatable; default *)",
    "allow_credentials": "let those origins send credentials (cookies, Authorization) (default off)",
}
PREFLIGHT_MAX_AGE_S = 600
EXPOSED_HEADERS = "X-Request-Id, Retry-After"


def check_options(origins: list[str], methods: list[str], headers: list[str],
                  credentials: bool) -> tuple[str, str] | None:
    """The first invalid option of the four, as (option name, why), or None."""
    for name, values in (("allowed_origins", origins), ("allowed_methods", methods), ("allowed_headers", headers)):
        if any(not isinstance(v, str) or not v.strip() for v in values):
            return name, "must be non-empty strings"
    if any(o != "*" and "://" not in o for o in origins):
        return "allowed_origins", "each must be * or an origin such as https://app.example.com"
    if credentials and "*" in origins:
        return "allow_credentials", "cannot be combined with allowed_origins *: list the origins"
    return None


@dataclass(frozen=True)
class CorsPolicy:
    origins: frozenset[str]  # "*" for any
    methods: frozenset[str]  # upper case; "*" for any
    headers: frozenset[str]  # lower case; "*" for any
    credentials: bool = False

    @classmethod
    def from_options(cls, origins: list[str], methods: list[str], headers: list[str],
                     credentials: bool) -> CorsPolicy:
        return cls(frozenset(o.rstrip("/") for o in origins), frozenset(m.upper() for m in methods),
                   frozenset(h.lower() for h in headers), credentials)

    def allows_origin(self, origin: str) -> bool:
        return "*" in self.origins or origin.rstrip("/") in self.origins

    def allows_method(self, method: str) -> bool:
        return "*" in self.methods or method.upper() in self.methods

    def allows_headers(self, requested: str) -> bool:
        names = [h.strip().lower() for h in requested.split(",") if h.strip()]
        return "*" in self.headers or all(h in self.headers for h in names)

    def allow_origin_value(self, origin: str) -> str:
        # With credentials the browser needs the origin itself, never "*".
        return "*" if "*" in self.origins and not self.credentials else origin


def _same_origin(request: web.Request, origin: str) -> bool:
    host = request.headers.get(hdrs.HOST, "")
    return bool(host) and origin.rstrip("/") in (f"http://{host}", f"https://{host}")


def is_json(content_type: str) -> bool:
    return content_type == "application/json" or content_type.endswith("+json")


POLICY_KEY = web.AppKey("cors_policy", CorsPolicy)


def cors_middleware(policy: CorsPolicy) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        origin = request.headers.get(hdrs.ORIGIN)
        if request.method == "OPTIONS" and origin is not None and hdrs.ACCESS_CONTROL_REQUEST_METHOD in request.headers:
            return _preflight(request, policy, origin)
        if (origin is not None and request.method not in SAFE_METHODS and not policy.allows_origin(origin)
                and not _same_origin(request, origin)):
            raise APIError(403, f"cross-origin request refused: origin {origin!r} is not allowed (the server's "
                           "--allowed-origins)", code="origin_not_allowed")
        if request.method == "POST" and request.body_exists and hdrs.CONTENT_TYPE in request.headers \
                and not is_json(request.content_type):
            raise APIError(415, f"unsupported Content-Type {request.content_type!r}: send the body as "
                           "application/json", code="unsupported_media_type")
        return await handler(request)

    return middleware


def _preflight(request: web.Request, policy: CorsPolicy, origin: str) -> web.Response:
    method = request.headers[hdrs.ACCESS_CONTROL_REQUEST_METHOD]
    wanted = request.headers.get(hdrs.ACCESS_CONTROL_REQUEST_HEADERS, "")
    if not policy.allows_origin(origin):
        raise APIError(403, f"CORS preflight refused: origin {origin!r} is not allowed (the server's "
                       "--allowed-origins)", code="origin_not_allowed")
    if not policy.allows_method(method) or not policy.allows_headers(wanted):
        raise APIError(403, f"CORS preflight refused: method {method!r} or headers {wanted!r} are not allowed "
                       "(the server's --allowed-methods, --allowed-headers)", code="cors_not_allowed")
    headers = {
        hdrs.ACCESS_CONTROL_ALLOW_ORIGIN: policy.allow_origin_value(origin),
        hdrs.ACCESS_CONTROL_ALLOW_METHODS: method.upper() if "*" in policy.methods else ", ".join(sorted(policy.methods)),
        hdrs.ACCESS_CONTROL_MAX_AGE: str(PREFLIGHT_MAX_AGE_S),
        hdrs.VARY: "Origin",
    }
    if wanted:
        headers[hdrs.ACCESS_CONTROL_ALLOW_HEADERS] = wanted
    if policy.credentials:
        headers[hdrs.ACCESS_CONTROL_ALLOW_CREDENTIALS] = "true"
    return web.Response(status=204, headers=headers)


async def add_cors_headers(request: web.Request, response: web.StreamResponse) -> None:
    """`on_response_prepare`: every response to an allowed origin (streams too) carries the CORS headers."""
    origin = request.headers.get(hdrs.ORIGIN)
    policy = request.app[POLICY_KEY]
    if origin is None or not policy.allows_origin(origin) or hdrs.ACCESS_CONTROL_ALLOW_ORIGIN in response.headers:
        return
    response.headers[hdrs.ACCESS_CONTROL_ALLOW_ORIGIN] = policy.allow_origin_value(origin)
    response.headers[hdrs.ACCESS_CONTROL_EXPOSE_HEADERS] = EXPOSED_HEADERS
    response.headers.add(hdrs.VARY, "Origin")
    if policy.credentials:
        response.headers[hdrs.ACCESS_CONTROL_ALLOW_CREDENTIALS] = "true"


def install(app: web.Application, policy: CorsPolicy) -> None:
    app[POLICY_KEY] = policy
    app.on_response_prepare.append(add_cors_headers)
