"""Logging: JSON lines (default) or text, and an access logger that writes one record per request.

Access records carry the request id, method, path (never the query string), status, duration and the
response size. Headers are never logged, so API keys never reach the logs. Records are written by a
background thread (the event loop only enqueues them).
"""

from __future__ import annotations

import json
import logging
import queue
import sys
import time
from logging.handlers import QueueHandler, QueueListener
from typing import Any

from aiohttp.abc import AbstractAccessLogger
from aiohttp.web import BaseRequest, StreamResponse

ACCESS_LOGGER = "hetero_infer.access"
_EXTRA_FIELDS = ("request_id", "method", "path", "status", "duration_ms", "bytes", "remote", "user_agent")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key in _EXTRA_FIELDS:
            value = getattr(record, key, None)
            if value is not None:
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exc"] = record.exc_text
        return json.dumps(entry, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = [f"{k}={getattr(record, k)}" for k in _EXTRA_FIELDS if getattr(record, k, None) is not None]
        return f"{line} {' '.join(extras)}" if extras else line


class _EnqueueHandler(QueueHandler):
    """Hands records to the writer thread; only merges the message (and a traceback) on the caller's side."""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        if record.exc_info and not record.exc_text:
            record.exc_text = _TRACEBACK.formatException(record.exc_info)
        record.msg = record.getMessage()
        record.args = None
        record.exc_info = None
        return record


_TRACEBACK = logging.Formatter()


def setup_logging(level: str, fmt: str) -> QueueListener:
    """Log records are formatted and written by a background thread, so the event loop never waits on
    stderr. Returns the listener: `stop()` it before exiting to flush what is queued."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    listener = QueueListener(records, handler)
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(_EnqueueHandler(records))
    root.setLevel(level.upper())
    # aiohttp's own access logger would duplicate ours.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    listener.start()
    return listener


class AccessLogger(AbstractAccessLogger):
    """One structured record per finished request (aiohttp calls `log` after the response is sent)."""

    def log(self, request: BaseRequest, response: StreamResponse, time: float) -> None:  # noqa: A002
        self.logger.info(
            "%s %s %s", request.method, request.path, response.status,
            extra={
                "request_id": request.get("request_id"),
                "method": request.method,
                "path": request.path,
                "status": response.status,
                "duration_ms": round(time * 1000, 2),
                "bytes": response.body_length,
                "remote": request.remote,
                "user_agent": request.headers.get("User-Agent"),
            },
        )
