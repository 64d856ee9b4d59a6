"""Server-sent events: a stream's formatted deltas written as `data:` events, the headers sent with the first
events, the last events and the end of the body in one write."""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter

from hetero_infer.worker.frontend.stream import OutputStream
from hetero_infer.worker.server.errors import STREAM_ERRORS, APIError, as_api_error
from hetero_infer.worker.server.formatting import Formatter, dumps
from hetero_infer.worker.server.logs import CLIENT_CLOSED_KEY, REQUEST_ID_KEY

logger = logging.getLogger("hetero_infer.server")

DONE = b"data: [DONE]\n\n"
# How long the headers of a stream may wait for its first events: a client learns this soon that its request
# was accepted, however long the first token takes (queueing, a long prefill).
HEADERS_MAX_DELAY_S = 0.05


class EventStreamResponse(web.StreamResponse):
    """An SSE response whose status line and headers leave with its first events, in one write, or after
    `HEADERS_MAX_DELAY_S` if none has come by then (`stream_events` sends them). aiohttp writes them at
    `prepare()` otherwise: a write, and a wake-up of the client, for nothing when the first tokens follow within
    milliseconds, as they do unless the request waits for the engine (aiohttp < 3.12 sends them at once)."""

    _send_headers_immediately = False


def _send_headers(writer: AbstractStreamWriter) -> None:
    try:
        writer.send_headers()
    except ConnectionError:  # the client is gone; the handler learns it at its next write
        pass


async def stream_events(request: web.Request, stream: OutputStream, fmt: Formatter,
                        include_usage: bool) -> web.StreamResponse:
    """Write the stream's deltas as events until it ends; an error of the stream becomes the last event."""
    resp = EventStreamResponse(headers={
        "Content-Type": "text/event-stream",
        "Cache-Control": "no-cache",
        "X-Accel-Buffering": "no",
        "X-Request-Id": request.get(REQUEST_ID_KEY, ""),
    })
    fmt.set_include_usage(include_usage)
    writer = await resp.prepare(request)
    assert writer is not None
    headers_timer = asyncio.get_running_loop().call_later(HEADERS_MAX_DELAY_S, _send_headers, writer)
    try:
        last = b""
        deltas = await stream.next_deltas()
        headers_timer.cancel()  # they go out with these events
        while deltas:
            chunks = fmt.chunks(deltas)
            data = "".join(f"data: {c}\n\n" for c in chunks).encode() if chunks else b""
            if stream.done:  # nothing more to wait for: these events go out with the end of the stream
                last = data
                break
            if data:
                await resp.write(data)
            deltas = await stream.next_deltas()
        if include_usage:
            last += b"data: " + dumps(fmt.usage_chunk()).encode() + b"\n\n"
        await resp.write_eof(last + DONE)  # the last events and the end of the body in one write
    except STREAM_ERRORS as exc:
        err = as_api_error(exc)
        await resp.write_eof(b"data: " + dumps(err.body()).encode() + b"\n\n" + DONE)
    except ConnectionError:  # client went away; the caller's `finally` aborts the requests
        request[CLIENT_CLOSED_KEY] = True  # logged and counted as 499
        logger.info("client disconnected mid-stream", extra={"request_id": request.get(REQUEST_ID_KEY)})
    except Exception:  # a bug of ours: the response is prepared, so the error middleware can send no other
        logger.exception("stream failed", extra={"request_id": request.get(REQUEST_ID_KEY)})
        err = APIError(500, "internal server error", code="internal_error")
        await resp.write_eof(b"data: " + dumps(err.body()).encode() + b"\n\n" + DONE)
    finally:
        headers_timer.cancel()
    return resp
