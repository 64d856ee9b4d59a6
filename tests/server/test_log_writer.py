"""The log writer thread: every record written, in order, filtered by the target's level, in one write per batch."""

from __future__ import annotations

import io
import json
import logging

from hetero_infer.worker.server.logs import JsonFormatter, LogWriter


class CountingStream(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, s: str) -> int:
        self.writes += 1
        return super().write(s)


def _logger(writer: LogWriter) -> logging.Logger:
    logger = logging.getLogger(f"test-log-writer-{id(writer)}")
    logger.propagate = False
    logger.handlers = [writer]
    logger.setLevel(logging.DEBUG)
    return logger


def test_batch_is_written_whole_in_order_and_filtered() -> None:
    stream = CountingStream()
    target = logging.StreamHandler(stream)
    target.setFormatter(JsonFormatter())
    target.setLevel(logging.INFO)
    writer = LogWriter(target, interval=10.0)  # not started: everything stays queued until stop()
    logger = _logger(writer)
    for i in range(200):
        logger.info("request %d done", i, extra={"request_id": f"r{i}", "status": 200})
    logger.debug("below the target's level")
    writer.stop()
    records = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [r["msg"] for r in records] == [f"request {i} done" for i in range(200)]
    assert [r["request_id"] for r in records] == [f"r{i}" for i in range(200)]
    assert stream.writes == 1


def test_running_writer_writes_everything_and_errors_at_once() -> None:
    stream = CountingStream()
    target = logging.StreamHandler(stream)
    target.setFormatter(JsonFormatter())
    writer = LogWriter(target, interval=0.01)
    writer.start()
    logger = _logger(writer)
    for i in range(50):
        logger.info("line %d", i)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logger.exception("failed")
    writer.stop()
    records = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [r["msg"] for r in records] == [f"line {i}" for i in range(50)] + ["failed"]
    assert "RuntimeError: boom" in records[-1]["exc"]
    assert stream.writes < 51


def test_other_handlers_get_each_record() -> None:
    seen: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    writer = LogWriter(Collect(), interval=10.0)
    logger = _logger(writer)
    logger.info("a %s", "b")
    logger.warning("c")
    writer.stop()
    assert seen == ["a b", "c"]


class _Stream:
    def __init__(self, tty: bool) -> None:
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_auto_format_is_text_on_a_terminal_and_json_elsewhere() -> None:
    from hetero_infer.contracts.server_options import ServerOptions
    from hetero_infer.worker.server.logs import JsonFormatter, TextFormatter, formatter

    assert ServerOptions().log_format == "auto"
    assert isinstance(formatter("auto", _Stream(True)), TextFormatter)
    assert isinstance(formatter("auto", _Stream(False)), JsonFormatter)
    assert isinstance(formatter("auto", object()), JsonFormatter)  # no isatty: a collector, not a person
    assert isinstance(formatter("json", _Stream(True)), JsonFormatter)
    assert isinstance(formatter("text", _Stream(False)), TextFormatter)
