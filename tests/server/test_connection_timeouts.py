"""Connections that make no progress are closed (issue 15, defect 4): one that sends nothing, part of its headers,
part of its body, or sits idle after a response; a slow reader of a long stream is not cut.

Raw sockets against a real `hetero-infer serve` with one-second timeouts; every wait is for a condition with a
generous deadline (a busy CPU only makes the server late, never the test wrong)."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator, Iterator

import pytest
from aiohttp.test_utils import TestServer
from server_proc import ServerProcess

from hetero_infer.contracts.server_options import ServerOptions
from hetero_infer.worker.server.app import create_app
from hetero_infer.worker.server.state import ServerState
from hetero_infer.worker.server.timeouts import GUARD_KEY

DEADLINE_S = 60.0  # against timeouts of 1 s: only a broken server misses it


@pytest.fixture(scope="module")
def slow_server() -> Iterator[ServerProcess]:
    s = ServerProcess("--max-model-len", "512", "--mock-step-latency-s", "0.02", "--header-timeout-s", "1",
                      "--body-timeout-s", "1", "--keepalive-timeout-s", "1")
    yield s
    assert s.stop() == 0, s.log()


def _connect(url: str) -> socket.socket:
    host, port = url.split("://", 1)[1].split(":")
    sock = socket.create_connection((host, int(port)), timeout=DEADLINE_S)
    return sock


def _read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (socket timeout: DEADLINE_S)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


@pytest.mark.parametrize("sent", [b"", b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Le",
                                  b"GET /healthz HTT"])
def test_silent_or_partial_headers_are_closed(slow_server: ServerProcess, sent: bytes) -> None:
    with _connect(slow_server.url) as sock:
        sock.sendall(sent)
        assert _read_until_closed(sock) == b""  # closed without a response


def test_partial_body_gets_408_and_is_closed(slow_server: ServerProcess) -> None:
    body = json.dumps({"prompt": "hello", "max_tokens": 2}).encode()
    with _connect(slow_server.url) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body[:5])
        reply = _read_until_closed(sock)
    assert reply.startswith(b"HTTP/1.1 408"), reply
    assert b"did not arrive within 1 seconds" in reply


@pytest.mark.parametrize("then", [b"", b"GET /healthz HTTP/1.1\r\nHo"])
def test_idle_keepalive_is_closed(slow_server: ServerProcess, then: bytes) -> None:
    with _connect(slow_server.url) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        first = b""
        while b'"ok"}' not in first:
            chunk = sock.recv(65536)
            assert chunk, f"closed before the answer: {first!r}"  # never spin on a closed socket
            first += chunk
        assert first.startswith(b"HTTP/1.1 200")
        sock.sendall(then)
        assert _read_until_closed(sock) == b""


def test_slow_stream_reader_is_not_cut(slow_server: ServerProcess) -> None:
    """A stream that lasts many timeouts long, read in small pieces with pauses, arrives whole."""
    body = json.dumps({"prompt": "stream", "max_tokens": 150, "ignore_eos": True, "stream": True}).encode()
    with _connect(slow_server.url) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                     b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        started = time.monotonic()
        data = b""
        while chunk := sock.recv(256):
            data += chunk
            time.sleep(0.02)
    assert data.startswith(b"HTTP/1.1 200")
    events = [line for line in data.split(b"\n") if line.startswith(b"data: ")]
    assert events[-1] == b"data: [DONE]"
    finish = [c["finish_reason"] for e in events[:-1] for c in json.loads(e[6:])["choices"] if c["finish_reason"]]
    assert finish == ["length"]  # all 150 tokens were generated and sent
    # It really outlived the timeouts (150 steps of 20 ms = 3 s against timeouts of 1 s).
    assert time.monotonic() - started > 1.0


# ------------------------------------------------------------------ the header guard alone, in-process
@pytest.fixture
async def guarded() -> AsyncIterator[tuple[str, int]]:
    """No engine; aiohttp's keep-alive timeout set far away, so only the guard can close a silent connection."""
    app = create_app(ServerState(ServerOptions(access_log=False, header_timeout_s=0.5)))
    server = TestServer(app, keepalive_timeout=3600)
    await server.start_server()
    assert server.runner is not None and server.runner.server is not None
    app[GUARD_KEY].install(server.runner.server)
    yield server.host, server.port
    await server.close()


async def test_header_guard_closes_silent_connections(guarded: tuple[str, int]) -> None:
    host, port = guarded
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"GET /healthz HTTP/1.1\r\n")
    assert await asyncio.wait_for(reader.read(), DEADLINE_S) == b""
    writer.close()
    # A connection whose request arrived in time is not cut by the guard afterwards.
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
    first = await asyncio.wait_for(reader.readuntil(b'"ok"}'), DEADLINE_S)
    assert first.startswith(b"HTTP/1.1 200")
    await asyncio.sleep(1.5)  # past the header timeout: the kept-alive connection still serves
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
    second = await asyncio.wait_for(reader.readuntil(b'"ok"}'), DEADLINE_S)
    assert second.startswith(b"HTTP/1.1 200")
    writer.close()


@pytest.mark.parametrize("name", ["header_timeout_s", "body_timeout_s", "keepalive_timeout_s"])
def test_timeouts_must_be_positive(name: str) -> None:
    with pytest.raises(ValueError, match=name):
        ServerOptions(**{name: 0})
