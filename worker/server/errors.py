"""The engine's errors as API errors (the shapes themselves: hetero_infer.contracts.errors)."""

from __future__ import annotations

from hetero_infer.contracts.errors import APIError, bad_request, overloaded, unavailable
from hetero_infer.worker.core.request_check import RequestError
from hetero_infer.worker.frontend.client import EngineDeadError, RequestFailedError

__all__ = ["APIError", "bad_request", "overloaded", "unavailable", "from_request_error", "STREAM_ERRORS",
           "as_api_error"]


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
