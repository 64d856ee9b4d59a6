"""Helpers for the server tests: a real `hetero-infer serve` process and a /metrics parser."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families


@dataclass
class HTTPResult:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode()


def http(method: str, url: str, body: bytes | str | dict | None = None, headers: dict[str, str] | None = None,
         timeout: float = 30.0) -> HTTPResult:
    """A plain HTTP request (stdlib only); never raises for an HTTP error status."""
    if isinstance(body, dict):
        body = json.dumps(body)
    data = body.encode() if isinstance(body, str) else body
    headers = dict(headers or {})
    if data is not None and not any(k.lower() == "content-type" for k in headers):
        headers["Content-Type"] = "application/json"  # urllib's default is a form: the server refuses those (415)
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return HTTPResult(r.status, {k.lower(): v for k, v in r.headers.items()}, r.read())
    except urllib.error.HTTPError as e:
        return HTTPResult(e.code, {k.lower(): v for k, v in e.headers.items()}, e.read())


_LISTENING = re.compile(r"listening on http://([^:\s]+):(\d+)")


class ServerProcess:
    """`hetero-infer serve` on a free port (port 0; the chosen port is read from the log)."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, executor: str = "mock",
                 start_timeout: float = 120.0) -> None:
        cmd = [sys.executable, "-m", "hetero_infer.cli", "serve", "--port", "0", "--executor", executor,
               "--log-format", "json", *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env={**os.environ, **(env or {})})
        self.lines: list[str] = []
        self._port = threading.Event()
        self.url = ""
        threading.Thread(target=self._read, daemon=True).start()
        if not self._port.wait(start_timeout):
            self.stop()
            raise RuntimeError("server did not start listening:\n" + self.log())
        self.wait_ready(start_timeout)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            m = _LISTENING.search(line)
            if m and not self._port.is_set():
                self.url = f"http://{m.group(1)}:{m.group(2)}"
                self._port.set()

    def log(self) -> str:
        return "".join(self.lines)

    def records(self) -> list[dict]:
        out = []
        for line in list(self.lines):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
        return out

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if http("GET", self.url + "/readyz", timeout=2).status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError("server did not become ready:\n" + self.log())

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def metrics(self) -> dict[str, float]:
        """Samples as {'name{label=value,...}': value}, labels sorted, model_name dropped."""
        text = http("GET", self.url + "/metrics", timeout=5).text
        return parse_metrics(text)

    def terminate(self) -> None:
        self.proc.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 120.0) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def parse_metrics(text: str) -> dict[str, float]:
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "model_name")
            samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return samples


def metric(samples: dict[str, float], name: str) -> float:
    return samples.get(name, 0.0)
