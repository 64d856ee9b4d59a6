"""The aiohttp application: routes, middlewares (request ids, OpenAI-shaped errors, API keys) and the small
endpoints (/healthz, /readyz, /metrics, /openapi.json, /v1/models). Generation lives in `completions` and `chat`."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from hetero_infer.contracts import cors, hosts
from hetero_infer.contracts.auth import check_api_key
from hetero_infer.worker.server.cache_blocks import cache_blocks
from hetero_infer.worker.server.chat import create_chat_completion
from hetero_infer.worker.server.completions import create_completion
from hetero_infer.worker.server.errors import APIError
from hetero_infer.worker.server.extras import add_routes as add_vllm_routes
from hetero_infer.worker.server.ids import new_id
from hetero_infer.worker.server.logs import (
    ACCESS_LOGGER,
    CLIENT_CLOSED,
    CLIENT_CLOSED_KEY,
    REQUEST_ID_KEY,
    log_access,
)
from hetero_infer.worker.server.lora import add_routes as add_lora_routes
from hetero_infer.worker.server.metrics import CONTENT_TYPE
from hetero_infer.worker.server.openapi import build_openapi
from hetero_infer.worker.server.state import DRAINING, STATE_KEY, ServerState, get_state
from hetero_infer.worker.server.timeouts import (
    GUARD_KEY,
    ConnectionGuard,
    body_timeout_middleware,
    guard_middleware,
)
from hetero_infer.worker.server.tokenizer_files import tokenizer_files

logger = logging.getLogger("hetero_infer.server")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_STATUS_CODES = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}
# Paths that need the API key when the server has keys (vLLM's /tokenize and /detokenize run the tokenizer too).
_PROTECTED = ("/v1/", "/tokenize", "/detokenize")
_START = web.RequestKey("start", float)  # time.monotonic() when the request reached the app


@web.middleware
async def request_id_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Use the client's X-Request-Id when it is sane, else a fresh one; echo it in the response."""
    given = request.headers.get("X-Request-Id", "")
    request[REQUEST_ID_KEY] = given if _REQUEST_ID.match(given) else new_id()
    request[_START] = time.monotonic()
    response = await handler(request)
    if not response.prepared:
        response.headers["X-Request-Id"] = request[REQUEST_ID_KEY]
    return response


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error leaves as `{"error": {...}}`; every response is counted by route and status, a request whose
    client went away as 499 (its handler is cancelled before aiohttp could log it: logged here)."""
    state = get_state(request)
    route = request.match_info.route.resource
    route_name = route.canonical if route is not None else "other"
    try:
        response = await handler(request)
    except APIError as exc:
        response = exc.response()
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        message = exc.text or exc.reason
        if exc.status == 404:
            message = f"no route for {request.method} {request.path}"
        err = APIError(exc.status, message, code=_STATUS_CODES.get(exc.status))
        response = err.response()
        if "Allow" in exc.headers:
            response.headers["Allow"] = exc.headers["Allow"]
    except (asyncio.CancelledError, ConnectionError):
        state.metrics.http_request(route_name, CLIENT_CLOSED)
        if state.options.access_log:
            log_access(logging.getLogger(ACCESS_LOGGER), request, CLIENT_CLOSED,
                       time.monotonic() - request.get(_START, time.monotonic()), 0)
        raise
    except Exception:
        logger.exception("unhandled error", extra={"request_id": request.get(REQUEST_ID_KEY)})
        response = APIError(500, "internal server error", code="internal_error").response()
    state.metrics.http_request(route_name, CLIENT_CLOSED if request.get(CLIENT_CLOSED_KEY) else response.status)
    return response


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """With API keys configured, /v1/*, /tokenize and /detokenize need `Authorization: Bearer <key>`
    (constant-time comparison)."""
    if request.path.startswith(_PROTECTED):
        check_api_key(request, get_state(request).api_keys)
    return await handler(request)


async def healthz(request: web.Request) -> web.Response:
    alive, status, error = get_state(request).liveness()
    body = {"status": status} if error is None else {"status": status, "error": error}
    return web.json_response(body, status=200 if alive else 503)


async def readyz(request: web.Request) -> web.Response:
    ready, status, error = get_state(request).readiness()
    body = {"status": status} if error is None else {"status": status, "error": error}
    return web.json_response(body, status=200 if ready else 503)


async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=get_state(request).metrics.render(), headers={"Content-Type": CONTENT_TYPE})


async def openapi(request: web.Request) -> web.Response:
    return web.Response(body=request.app[OPENAPI_KEY], content_type="application/json")


_OWNER = "hetero-infer"


def _model_cards(state: ServerState) -> list[dict[str, object]]:
    """The base model's card, then its LoRA adapters' (vLLM's shape: `root` where each came from, `parent` an
    adapter's base model)."""
    base = {"id": state.model_name, "object": "model", "created": state.created, "owned_by": _OWNER,
            "max_model_len": state.max_model_len, "root": state.model_root, "parent": None}
    return [base, *state.adapters.cards(state.model_name, _OWNER, state.max_model_len)]


async def list_models(request: web.Request) -> web.Response:
    state = get_state(request)
    state.check_serving()
    return web.json_response({"object": "list", "data": _model_cards(state)})


async def get_model(request: web.Request) -> web.Response:
    state = get_state(request)
    state.check_serving()
    name = request.match_info["model"]
    state.check_model(name)
    return web.json_response(next(c for c in _model_cards(state) if c["id"] == name))


OPENAPI_KEY = web.AppKey("openapi", bytes)


async def close_when_draining(request: web.Request, response: web.StreamResponse) -> None:
    """While draining, every answer (the 503s for new requests included) says `Connection: close`: a client that
    keeps its connection alive (every SDK) then retries on a new connection, which the Service sends to another pod,
    instead of asking this one again on the same connection until its retries run out."""
    if get_state(request).phase == DRAINING:  # aiohttp runs this hook after it computed the headers: set both
        response.force_close()
        response.headers["Connection"] = "close"


def create_app(state: ServerState) -> web.Application:
    options = state.options
    guard = ConnectionGuard(options.header_timeout_s)  # installed on the runner's server by `serve`
    policy = cors.CorsPolicy.from_options(options.allowed_origins, options.allowed_methods, options.allowed_headers,
                                          options.allow_credentials)
    host_policy = hosts.HostPolicy.from_options(options.allowed_hosts, options.host, bool(state.api_keys))
    app = web.Application(
        client_max_size=options.max_body_bytes,
        middlewares=[guard_middleware(guard), request_id_middleware, error_middleware,
                     hosts.host_middleware(host_policy), cors.cors_middleware(policy), auth_middleware,
                     body_timeout_middleware(options.body_timeout_s)],
    )
    cors.install(app, policy)
    app.on_response_prepare.append(close_when_draining)
    app[STATE_KEY] = state
    app[GUARD_KEY] = guard
    app[OPENAPI_KEY] = json.dumps(build_openapi(auth=bool(state.api_keys),
                                                lora_updates=options.allow_runtime_lora_updating)).encode()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/openapi.json", openapi)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model:.+}", get_model)  # served names may contain "/"
    app.router.add_post("/v1/completions", create_completion)
    app.router.add_post("/v1/chat/completions", create_chat_completion)
    app.router.add_get("/v1/cache/blocks", cache_blocks)  # the router's exact prefix index (docs/router.md)
    app.router.add_get("/v1/tokenizer/files", tokenizer_files)  # the router's tokenizer (docs/router.md)
    add_vllm_routes(app)  # /tokenize, /detokenize, /health, /version
    if options.allow_runtime_lora_updating:  # vLLM's: the routes exist only when allowed
        add_lora_routes(app)  # /v1/load_lora_adapter, /v1/unload_lora_adapter
    return app
