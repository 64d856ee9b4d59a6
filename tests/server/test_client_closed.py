"""A request whose client goes away (a cancelled call, a closed stream) is still an HTTP request: one access-log
line and one `hetero_infer_http_requests_total` increment, with nginx's status 499 ("client closed request"),
besides the abort that frees its KV blocks. A real server, raw sockets that hang up."""

from __future__ import annotations

import json
import socket
import time

from server_proc import ServerProcess


def _hang_up(server: ServerProcess, body: dict, request_id: str, read_first: bool) -> None:
    """Send a POST, optionally read the first bytes of the answer, then close the connection."""
    host, port = server.url.split("://", 1)[1].split(":")
    data = json.dumps(body).encode()
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: %s:%s\r\nContent-Type: application/json\r\n"
                  b"X-Request-Id: %s\r\nContent-Length: %d\r\n\r\n%s" % (
                      host.encode(), port.encode(), request_id.encode(), len(data), data))
        if read_first:
            assert s.recv(64).startswith(b"HTTP/1.1 200")
        else:
            time.sleep(0.3)  # the request is running


def _closed_count(server: ServerProcess) -> float:
    return server.metrics().get("hetero_infer_http_requests_total{route=/v1/completions,status=499}", 0.0)


def test_cancelled_requests_are_logged_and_counted(server: ServerProcess, model_name: str) -> None:
    before = _closed_count(server)
    long = {"model": model_name, "prompt": "hi", "max_tokens": 400, "ignore_eos": True}
    _hang_up(server, long, "gone-whole-1", read_first=False)
    _hang_up(server, {**long, "stream": True}, "gone-stream-1", read_first=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        access = {r.get("request_id"): r for r in server.records() if r.get("logger") == "hetero_infer.access"}
        if "gone-whole-1" in access and "gone-stream-1" in access and _closed_count(server) == before + 2:
            break
        time.sleep(0.1)
    assert access.get("gone-whole-1", {}).get("status") == 499, access.get("gone-whole-1")
    assert access.get("gone-stream-1", {}).get("status") == 499, access.get("gone-stream-1")
    assert access["gone-whole-1"]["path"] == "/v1/completions" and access["gone-whole-1"]["duration_ms"] >= 250
    assert _closed_count(server) == before + 2
    assert server.metrics()["hetero_infer_num_requests_running"] == 0  # and both were aborted
