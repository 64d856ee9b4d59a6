"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}` with the right HTTP status."""

from __future__ import annotations

import json

from aiohttp import web

from hetero_infer.worker.core.request_check import RequestError
from hetero_infer.worker.frontend.client import EngineDeadError, RequestFailedError

_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}


class APIError(Exception):
    """Raised anywhere in a handler; rendered by the error middleware (or into an SSE error event)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.type = type or _TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
        self.headers = headers or {}

    def body(self) -> dict[str, dict[str, str | None]]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> web.Response:
        return web.Response(
            status=self.status,
            body=json.dumps(self.body()).encode(),
            content_type="application/json",
            headers=self.headers,
        )


def bad_request(message: str, param: str | None = None, code: str | None = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


def overloaded(message: str, retry_after_s: int) -> APIError:
    return APIError(429, message, code="rate_limit_exceeded", headers={"Retry-After": str(retry_after_s)})


def unavailable(message: str, code: str, retry_after_s: int | None = None) -> APIError:
    headers = {"Retry-After": str(retry_after_s)} if retry_after_s is not None else None
    return APIError(503, message, code=code, headers=headers)


def from_request_error(exc: RequestError) -> APIError:
    """The engine's typed request error as the API's error (its status, type, code and parameter)."""
    return APIError(exc.status, exc.message, code=exc.code, param=exc.param, type=exc.type)


# What a generation's stream can fail with; each becomes an API error (`as_api_error`).
STREAM_ERRORS = (APIError, RequestError, RequestFailedError, EngineDeadError)


def as_api_error(exc: BaseException) -> APIError:
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, RequestError):
        return from_request_error(exc)
    if isinstance(exc, RequestFailedError):
        return APIError(500, f"the engine failed while generating this request: {exc}", code="engine_error")
    if isinstance(exc, EngineDeadError):
        return APIError(500, f"the engine stopped: {exc}", code="engine_failed")
    raise exc
