"""Logging: text on a terminal, JSON lines otherwise (`--log-format auto`, the default; or either one), and an access logger that writes one record per request.

Access records carry the request id, method, path (never the query string), status, duration and the
response size; health probes are logged only when their answer changes. Headers are never logged, so API keys never reach the logs. Records are formatted and written
by a background thread, in batches (the event loop only appends them to a queue).
"""

from __future__ import annotations

import collections
import json
import logging
import sys
import threading
import time
from typing import Any

from aiohttp.abc import AbstractAccessLogger
from aiohttp.web import BaseRequest, RequestKey, StreamResponse

from hetero_infer.model_source import quiet_http_client_logs

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


_TRACEBACK = logging.Formatter()


def _prepare(record: logging.LogRecord) -> logging.LogRecord:
    """Merge the message (and a traceback) on the caller's side, so the writer thread formats plain data."""
    if record.exc_info and not record.exc_text:
        record.exc_text = _TRACEBACK.formatException(record.exc_info)
    record.msg = record.getMessage()
    record.args = None
    record.exc_info = None
    return record


class LogWriter(logging.Handler):
    """Hands records to a writer thread that formats and writes them in batches.

    A record is only appended to a deque on the caller's side: the writer is woken once per batch (at most every
    `interval` seconds while records keep coming), not once per record, which would cost the event loop a
    thread wake-up (and a GIL hand-over) per request. Warnings and errors wake it at once. `stop()` writes out
    what is still queued.
    """

    def __init__(self, target: logging.Handler, interval: float = 0.05) -> None:
        super().__init__()
        self.target = target
        self.interval = interval
        self._records: collections.deque[logging.LogRecord] = collections.deque()
        self._wake = threading.Event()
        self._urgent = threading.Event()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="log-writer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def handle(self, record: logging.LogRecord) -> bool:  # no handler lock: deque.append is thread-safe
        if not self.filter(record):
            return False
        self._records.append(_prepare(record))
        if record.levelno >= logging.WARNING:
            self._urgent.set()
            self._wake.set()
        elif not self._wake.is_set():
            self._wake.set()
        return True

    def emit(self, record: logging.LogRecord) -> None:
        self.handle(record)

    def _run(self) -> None:
        while True:
            self._wake.wait()
            if not self._stopped:
                self._urgent.wait(self.interval)  # gather a batch, unless something urgent came
            self._wake.clear()
            self._urgent.clear()
            self._write_out()
            if self._stopped:
                return

    def _write_out(self) -> None:
        """Write what is queued: to a stream, the whole batch in one write and one flush (a syscall per batch,
        not per record); to other handlers, record by record."""
        records, target = self._records, self.target
        if not isinstance(target, logging.StreamHandler):
            while records:
                target.handle(records.popleft())
            return
        lines = []
        while records:
            record = records.popleft()
            if record.levelno < target.level or not target.filter(record):
                continue
            try:
                lines.append(target.format(record) + target.terminator)
            except Exception:
                target.handleError(record)
        if not lines:
            return
        with target.lock:  # type: ignore[union-attr]
            try:
                target.stream.write("".join(lines))
                target.flush()
            except Exception:
                target.handleError(record)

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()
        self._urgent.set()
        if self._thread.is_alive():
            self._thread.join(5.0)
        self._write_out()  # never started, or did not stop in time


def formatter(fmt: str, stream: Any = None) -> logging.Formatter:
    """`auto`: text for a person at a terminal, JSON lines for whatever collects the logs of a pod or a pipe."""
    if fmt == "auto":
        isatty = getattr(stream if stream is not None else sys.stderr, "isatty", None)
        fmt = "text" if isatty is not None and isatty() else "json"
    return JsonFormatter() if fmt == "json" else TextFormatter()


def setup_child_logging(level: str, fmt: str) -> None:
    """Logging of the engine process: its records go to the stderr it shares with the server, in the server's
    format and level, written at once (it logs little: loading, failures)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(fmt, sys.stderr))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level.upper())
    quiet_http_client_logs()


def setup_logging(level: str, fmt: str) -> LogWriter:
    """Log records are formatted and written by a background thread, so the event loop never waits on
    stderr. Returns the writer: `stop()` it before exiting to flush what is queued."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(fmt, sys.stderr))
    writer = LogWriter(handler)
    # Neither format shows threads, processes or source locations: do not look them up for every record (the
    # "Optimization" section of the logging documentation).
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    logging._srcfile = None  # type: ignore[attr-defined]
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(writer)
    root.setLevel(level.upper())
    # aiohttp's own access logger would duplicate ours.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    quiet_http_client_logs()
    writer.start()
    return writer


PROBE_PATHS = frozenset({"/healthz", "/readyz", "/health"})


class ProbeLog:
    """Health probes are logged when their answer changes (503 loading -> 200 ready -> 503 draining), not at every
    poll: kubelets, load balancers and the README's own wait loop poll them every second or so."""

    def __init__(self) -> None:
        self._last: dict[str, int] = {}

    def wanted(self, path: str, status: int) -> bool:
        if path not in PROBE_PATHS:
            return True
        if self._last.get(path) == status:
            return False
        self._last[path] = status
        return True


_PROBES = ProbeLog()  # aiohttp builds an access logger per connection; probes' last answers are per process


# The status logged and counted for a request whose client went away before its response was complete (the
# handler is cancelled, or its write fails): nginx's "client closed request".
CLIENT_CLOSED = 499


def log_access(logger: logging.Logger, request: BaseRequest, status: int, seconds: float, nbytes: int) -> None:
    """The one access record of a request."""
    logger.info(
        "%s %s %s", request.method, request.path, status,
        extra={
            "request_id": request.get(REQUEST_ID_KEY),
            "method": request.method,
            "path": request.path,
            "status": status,
            "duration_ms": round(seconds * 1000, 2),
            "bytes": nbytes,
            "remote": request.remote,
            "user_agent": request.headers.get("User-Agent"),
        },
    )


class AccessLogger(AbstractAccessLogger):
    """One structured record per finished request (aiohttp calls `log` after the response is sent; a request
    whose handler the client's disconnect cancelled never gets there: the error middleware logs it, as 499);
    health probes only when their answer changes (ProbeLog)."""

    def log(self, request: BaseRequest, response: StreamResponse, time: float) -> None:  # noqa: A002
        status = CLIENT_CLOSED if request.get(CLIENT_CLOSED_KEY) else response.status
        if _PROBES.wanted(request.path, status):
            log_access(self.logger, request, status, time, response.body_length)


REQUEST_ID_KEY = RequestKey("request_id", str)  # the request's id (X-Request-Id), set by the first middleware
CLIENT_CLOSED_KEY = RequestKey("client_closed", bool)  # set on a request whose client left mid-response (logged, counted as 499)
