"""Helpers for the server tests: a real `hetero-infer serve` process and a /metrics parser."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from cli_process import CliProcess
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


class ServerProcess(CliProcess):
    """`hetero-infer serve` on a free port (port 0; the chosen port is read from the log), ready."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, executor: str = "mock",
                 start_timeout: float = 120.0) -> None:
        super().__init__("serve", "--port", "0", "--executor", executor, "--log-format", "json", *args, env=env,
                         start_timeout=start_timeout)
        self.wait_ready(start_timeout)

    def records(self) -> list[dict]:
        out = []
        for line in list(self.lines):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
        return out

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def metrics(self) -> dict[str, float]:
        """Samples as {'name{label=value,...}': value}, labels sorted, model_name dropped."""
        text = http("GET", self.url + "/metrics", timeout=5).text
        return parse_metrics(text)

    def stop(self, timeout: float = 120.0) -> int | None:
        return super().stop(timeout)


def parse_metrics(text: str) -> dict[str, float]:
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "model_name")
            samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return samples


def metric(samples: dict[str, float], name: str) -> float:
    return samples.get(name, 0.0)
