"""A small fleet of real processes, stopped the way Kubernetes stops pods, under a load of long streams.

- Workers: `hetero-infer serve --executor mock` processes, each with a mock step latency so a stream lasts seconds.
- Routers: `hetero-infer router --discover-service` processes; they find the workers in the EndpointSlices of
  the workers' Service, served by the KMock API emulator in the test's event loop (`Endpoints`).
- The routers' Service: `Service`, a TCP balancer that does what kube-proxy does for a ClusterIP: a new
  connection goes to one of the Service's current endpoints and stays on it for its whole life; removing an
  endpoint only stops new connections from going there, the established ones keep flowing.
- `stop_pod`: the kubelet's order for a pod that is deleted (rollout, scale-down, drain): its endpoint is marked
  terminating (not ready) so discovery and kube-proxy drop it, the preStop hook runs (a sleep), then SIGTERM,
  then SIGKILL when the grace period runs out (counted here as a failure: the process should have exited).
- `Load`: users that keep sending long streamed completions (and some plain ones) through the Service, each
  checked to the end: 200, every token, the final chunk with its finish reason, `data: [DONE]`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from cli_process import CliProcess

NAMESPACE = "fleet"
WORKERS_SERVICE = "workers"
SLICES = f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"


# -- processes ----------------------------------------------------------------------------------------------

def start_worker(step_latency_s: float, drain_s: float, *extra: str) -> CliProcess:
    """A mock worker (blocking: run it in a thread); `drain_s` is its --shutdown-grace, what the operator renders
    from spec.drainSeconds."""
    proc = CliProcess("serve", "--port", "0", "--executor", "mock", "--no-engine-process", "--log-format", "json",
                      "--no-access-log", "--mock-step-latency-s", str(step_latency_s), "--max-num-seqs", "16",
                      "--shutdown-grace", str(drain_s), *extra)
    proc.wait_ready()
    return proc


def start_router(hold_timeout_s: float, *extra: str) -> CliProcess:
    """A router discovering the workers' Service (KUBECONFIG must point at the emulator); its --shutdown-grace-s
    is its hold time-out, as the operator renders it (operator/manifests/router.py)."""
    proc = CliProcess("router", "--port", "0", "--discover-service", WORKERS_SERVICE, "--namespace", NAMESPACE,
                      "--tokenizer", "none", "--health-interval-s", "0.2", "--hold-timeout-s", str(hold_timeout_s),
                      "--shutdown-grace-s", str(hold_timeout_s), *extra)
    proc.wait_ready()
    return proc


async def start_all(starters: list[Callable[[], CliProcess]]) -> list[CliProcess]:
    """Start processes side by side; if one fails, stop the others and raise."""
    results = await asyncio.gather(*(asyncio.to_thread(s) for s in starters), return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        for r in results:
            if isinstance(r, CliProcess):
                r.stop()
        raise errors[0]
    return list(results)  # type: ignore[arg-type]


def port_of(proc: CliProcess) -> int:
    return int(proc.url.rsplit(":", 1)[1])


# -- the workers' Service: EndpointSlices in the API emulator ------------------------------------------------

class Endpoints:
    """The workers' Service as the EndpointSlice controller shows it: one slice per worker (each listens on its
    own port; a slice holds the endpoints of one port set), ready while the pod is, terminating once deleted."""

    def __init__(self, kmock: Any) -> None:
        self.kmock = kmock
        self.names: dict[int, str] = {}
        self._ids = itertools.count(1)

    @staticmethod
    def _slice(name: str, port: int, ready: bool) -> dict[str, Any]:
        conditions = {"ready": ready, "serving": ready, "terminating": not ready}
        return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
                "metadata": {"name": name, "namespace": NAMESPACE, "labels": {SERVICE_NAME_LABEL: WORKERS_SERVICE}},
                "endpoints": [{"addresses": ["127.0.0.1"], "conditions": conditions}],
                "ports": [{"name": "http", "port": port, "protocol": "TCP"}]}

    async def add(self, worker: CliProcess) -> None:
        """The pod passed its readiness probe."""
        port = port_of(worker)
        name = self.names[port] = f"{WORKERS_SERVICE}-{next(self._ids)}"
        rsp = await self.kmock.post(SLICES, json=self._slice(name, port, True))
        assert rsp.status == 200, await rsp.text()

    async def terminating(self, worker: CliProcess) -> None:
        """The pod was deleted: its endpoint turns not ready (terminating) at once."""
        port = port_of(worker)
        rsp = await self.kmock.patch(f"{SLICES}/{self.names[port]}", json=self._slice(self.names[port], port, False),
                                     headers={"Content-Type": "application/merge-patch+json"})
        assert rsp.status == 200, await rsp.text()


# -- the routers' Service: kube-proxy ------------------------------------------------------------------------

class Service:
    """A ClusterIP as kube-proxy runs it: each new TCP connection is sent to the next ready endpoint (round robin)
    and stays there; an endpoint removed gets no new connection, its established ones go on until either side
    closes. With no endpoint a connection is refused (closed at once)."""

    def __init__(self) -> None:
        self.endpoints: list[int] = []
        self.connections: dict[int, int] = {}  # endpoint port -> connections sent there
        self._rr = 0
        self._server: asyncio.Server | None = None
        self.url = ""

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()

    def add(self, router: CliProcess) -> None:
        self.endpoints.append(port_of(router))

    def remove(self, router: CliProcess) -> None:
        self.endpoints.remove(port_of(router))

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.endpoints:
            writer.close()
            return
        port = self.endpoints[self._rr % len(self.endpoints)]
        self._rr += 1
        self.connections[port] = self.connections.get(port, 0) + 1
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        writer.close()
        up_writer.close()

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()  # a FIN passes through as a FIN (half-close)
        except (ConnectionError, OSError, RuntimeError):
            writer.transport.abort()  # a reset passes through as a reset


# -- stopping a pod the kubelet's way -----------------------------------------------------------------------

@dataclass
class Stopped:
    name: str
    exit_code: int | None
    seconds: float  # from SIGTERM to exit
    killed: bool  # outlived its grace period
    log_tail: str = ""  # its last output lines, kept when it did not exit cleanly


async def stop_pod(proc: CliProcess, name: str, remove_endpoint: Callable[[], Any], prestop_s: float,
                   grace_s: float, before_sigterm: Callable[[], Any] | None = None) -> Stopped:
    """Endpoint removed, preStop sleep, (`before_sigterm`, a check), SIGTERM, SIGKILL after the grace period (which
    counts from the start of the preStop, as the kubelet counts it)."""
    started = time.monotonic()
    result = remove_endpoint()
    if asyncio.iscoroutine(result):
        await result
    await asyncio.sleep(prestop_s)
    if before_sigterm is not None:
        result = before_sigterm()
        if asyncio.iscoroutine(result):
            await result
    proc.terminate()
    sent = time.monotonic()
    left = max(0.0, grace_s - (sent - started))
    try:
        code = await asyncio.wait_for(asyncio.to_thread(proc.proc.wait), left)
        killed = False
    except asyncio.TimeoutError:
        proc.kill()
        code, killed = proc.proc.returncode, True
    tail = "".join(proc.lines[-30:]) if killed or code != 0 else ""
    return Stopped(name, code, time.monotonic() - sent, killed, tail)


async def running_requests(worker: CliProcess) -> float:
    """hetero_infer_num_requests_running of one worker, read directly."""
    async with aiohttp.ClientSession() as session, session.get(worker.url + "/metrics") as r:
        text = await r.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("hetero_infer_num_requests_running"))


async def a_request_starts(worker: CliProcess, timeout: float = 30.0) -> None:
    """Return when the worker has just taken a new request (its running count went up): a stream that has all its
    length still to run."""
    before = await running_requests(worker)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        await asyncio.sleep(0.02)
        now = await running_requests(worker)
        if now > before:
            return
        before = now
    raise AssertionError(f"{worker.url} took no new request in {timeout} s")


# -- the load ---------------------------------------------------------------------------------------------

@dataclass
class Outcome:
    kind: str  # "stream" or "plain"
    prompt: str
    status: int | None = None
    text: str = ""
    tokens: int = 0  # usage.completion_tokens
    finish_reason: str | None = None
    done: bool = False
    error: str | None = None
    started: float = 0.0
    ended: float = 0.0

    def problem(self, max_tokens: int, reference: str) -> str | None:
        if self.error is not None:
            return self.error
        if self.status != 200:
            return f"status {self.status}"
        if self.tokens != max_tokens:
            return f"usage says {self.tokens} of {max_tokens} tokens"
        if self.finish_reason != "length":
            return f"finish_reason {self.finish_reason!r}"
        if self.text != reference:
            return f"text {self.text!r} is not the reference {reference!r}"
        if self.kind == "stream" and not self.done:
            return "no data: [DONE]"
        return None


def completion_body(prompt: str, max_tokens: int, stream: bool) -> dict[str, Any]:
    body = {"model": "mock", "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


async def reference_texts(worker: CliProcess, prompts: list[str], max_tokens: int) -> dict[str, str]:
    """Each prompt's whole completion, asked of one worker directly before any pod is stopped (the mock executor's
    tokens depend on the prompt only)."""
    out = {}
    async with aiohttp.ClientSession() as session:
        for prompt in prompts:
            async with session.post(worker.url + "/v1/completions",
                                    json=completion_body(prompt, max_tokens, False)) as r:
                assert r.status == 200, await r.text()
                data = await r.json()
            assert data["usage"]["completion_tokens"] == max_tokens
            out[prompt] = data["choices"][0]["text"]
    return out


@dataclass
class Load:
    """`users` clients, each with its own connection pool (keep-alive, as an SDK keeps one), sending requests one
    after another until stopped, each a prompt of `reference`; every `plain_every`-th request is not streamed."""

    url: str
    users: int
    max_tokens: int
    reference: dict[str, str]
    plain_every: int = 4
    outcomes: list[Outcome] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task] = field(default_factory=list)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._user(i)) for i in range(self.users)]

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)

    def problems(self) -> list[tuple[float, str]]:
        """(when it was sent, what went wrong) of each request that failed."""
        return [(o.started, f"{o.kind} request: {p}") for o in self.outcomes
                if (p := o.problem(self.max_tokens, self.reference[o.prompt])) is not None]

    async def _user(self, user: int) -> None:
        prompts = sorted(self.reference)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            for n in itertools.count():
                if self._stop.is_set():
                    return
                stream = (user + n) % self.plain_every != 0
                prompt = prompts[(user + n) % len(prompts)]
                outcome = Outcome("stream" if stream else "plain", prompt, started=time.monotonic())
                self.outcomes.append(outcome)
                try:
                    async with session.post(self.url + "/v1/completions",
                                            json=completion_body(prompt, self.max_tokens, stream)) as r:
                        outcome.status = r.status
                        if stream and r.status == 200:
                            await _read_stream(r, outcome)
                        else:
                            data = await r.json(content_type=None)
                            if r.status == 200:
                                outcome.tokens = data["usage"]["completion_tokens"]
                                outcome.text = data["choices"][0]["text"]
                                outcome.finish_reason = data["choices"][0]["finish_reason"]
                except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError) as exc:
                    outcome.error = f"{exc.__class__.__name__}: {exc}"
                outcome.ended = time.monotonic()


async def _read_stream(r: aiohttp.ClientResponse, outcome: Outcome) -> None:
    """Server-sent events to the end of the body: the text of every chunk, the finish reason, the usage chunk,
    `data: [DONE]` last."""
    async for line in r.content:
        if not line.startswith(b"data: "):
            continue
        data = line[6:].strip()
        if outcome.done:
            raise ValueError("an event after data: [DONE]")
        if data == b"[DONE]":
            outcome.done = True
            continue
        event = json.loads(data)
        if "error" in event:
            raise ValueError(f"error event: {event['error']}")
        for choice in event.get("choices") or []:
            outcome.text += choice.get("text") or ""
            outcome.finish_reason = choice.get("finish_reason") or outcome.finish_reason
        if event.get("usage"):
            outcome.tokens = event["usage"]["completion_tokens"]
