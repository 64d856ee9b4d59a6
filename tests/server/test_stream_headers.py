"""When the headers of a streamed response leave: with its first events, in one write (a write and a wake-up of
the client fewer per request), unless those take long (tests/server/test_overload.py)."""

from __future__ import annotations

import json
import socket
from urllib.parse import urlparse

from server_proc import ServerProcess


def _post_raw(url: str, path: str, body: dict) -> socket.socket:
    u = urlparse(url)
    sock = socket.create_connection((u.hostname, u.port), timeout=10)
    data = json.dumps(body).encode()
    sock.sendall(b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                 % (path.encode(), u.netloc.encode(), len(data)) + data)
    return sock


def _read_all(sock: socket.socket, first: bytes) -> bytes:
    data = first
    while not data.endswith(b"0\r\n\r\n"):
        more = sock.recv(1 << 16)
        assert more, data
        data += more
    return data


def test_headers_leave_with_the_first_events(server: ServerProcess, model_name: str) -> None:
    for path, body in [
        ("/v1/completions", {"model": model_name, "prompt": "hello", "max_tokens": 30, "stream": True}),
        ("/v1/chat/completions", {"model": model_name, "messages": [{"role": "user", "content": "hi"}],
                                  "max_tokens": 30, "stream": True}),
    ]:
        with _post_raw(server.url, path, body) as sock:
            first = sock.recv(1 << 16)  # what the first write of the server carried
            head, sep, body_start = first.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200") and sep, first
            assert b"text/event-stream" in head.lower()
            assert body_start.split(b"\r\n", 1)[1].startswith(b"data: {"), first
            rest = _read_all(sock, first)
        assert rest.count(b"data: [DONE]") == 1
