"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}` with the right HTTP status.

What every server answers with (the worker, the router): `APIError` and its usual shapes. The worker maps its
engine's own errors onto it (worker/server/errors.py)."""

from __future__ import annotations

import json

from aiohttp import web

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
