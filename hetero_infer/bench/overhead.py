"""What the serving path costs: the same workload on the engine alone, on the async engine (thread + asyncio,
no HTTP; with `--process-engine` also in its own process) and through HTTP (`hetero-infer serve` in its own
process, streaming clients; `--server-arg=--no-engine-process` for the thread mode). By default on the
mock executor with zero step latency, where the serving layer's overhead is most visible; `--executor torch`
or `--mock-step-latency-s` for steps that take time (and release the GIL) as a model's do.

    python -m hetero_infer.bench.overhead --concurrency 64 --num-requests 1024

Every request streams `--output-len` tokens for a prompt of `--input-len` random token ids (sent as ids, so
tokenization costs the same in every mode: nothing). Throughput counts generated tokens; latency is per
request (submit to last token). Each mode runs `--repeats` times, interleaved; the best run is reported, the median,
and the median over the rounds of each run against the engine run of its round. `--baseline CHECKOUT` adds a
second server with another checkout's code, loaded in turn with this one (an A/B in the same minutes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from hetero_infer.bench.cpu_speed import probe, slowdown
from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.contracts.sampling_params import SamplingParams
from hetero_infer.worker.frontend.gc_freeze import freeze_startup_objects


@dataclass
class Run:
    mode: str
    seconds: float
    tokens: int
    latencies: list[float]
    cpu_seconds: float | None = None  # CPU time of the serving side (engine thread, or the whole server with
    # its engine process)
    client_cpu_seconds: float | None = None  # HTTP: CPU time of the load generator (this process)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def cpu_us_per_token(self) -> float | None:
        return None if self.cpu_seconds is None else self.cpu_seconds / self.tokens * 1e6

    def latency(self, q: float) -> float:
        s = sorted(self.latencies)
        return s[min(len(s) - 1, int(q * len(s)))]


# A round counts as measured at full speed when no CPU's median probe sample, before or after it, was more than
# this much slower than the fastest sample of the whole invocation.
QUIET_SLOWDOWN = 1.15


def _prompts(n: int, length: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, 40000) for _ in range(length)] for _ in range(n)]


def _params(output_len: int) -> SamplingParams:
    return SamplingParams(max_tokens=output_len, ignore_eos=True, temperature=0.0)


def run_engine(engine: Any, prompts: list[list[int]], output_len: int, concurrency: int, tag: str) -> Run:
    """The engine alone: keep `concurrency` requests in flight, add a new one as each finishes."""
    start: dict[str, float] = {}
    latencies: list[float] = []
    tokens = 0
    nxt = 0

    def add() -> None:
        nonlocal nxt
        rid = f"{tag}-{nxt}"
        start[rid] = time.perf_counter()
        engine.add_request(rid, None, prompts[nxt], _params(output_len))
        nxt += 1

    t0, cpu0 = time.perf_counter(), time.thread_time()
    while nxt < min(concurrency, len(prompts)):
        add()
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                latencies.append(time.perf_counter() - start.pop(out.request_id))
                tokens += sum(len(c.token_ids) for c in out.outputs)
                if nxt < len(prompts):
                    add()
    return Run("engine", time.perf_counter() - t0, tokens, latencies, time.thread_time() - cpu0)


async def run_async_engine(engine: Any, prompts: list[list[int]], output_len: int, concurrency: int,
                           tag: str, stream_interval: float, core: Any = None) -> Run:
    """The engine on its thread (or, with `core`, in its process), driven by asyncio tasks (no HTTP)."""
    from hetero_infer.worker.core.busy_loop import EngineRequest
    from hetero_infer.worker.frontend.client import EngineClient
    from hetero_infer.worker.frontend.inproc import InprocEngineClient

    if core is not None:
        from hetero_infer.worker.frontend.process import ProcessEngineClient

        ae: EngineClient = ProcessEngineClient(core, stream_interval=stream_interval, tokenizer=engine.tokenizer)
    else:
        ae = InprocEngineClient(engine, stream_interval=stream_interval)
    ae.start()
    queue = list(enumerate(prompts))
    latencies: list[float] = []
    tokens = 0

    async def worker() -> None:
        nonlocal tokens
        while queue:
            i, ids = queue.pop()
            t = time.perf_counter()
            stream = ae.submit([EngineRequest(f"{tag}-{i}", None, ids, _params(output_len))])
            last = None
            while outs := await stream.next():
                last = outs[-1]
            latencies.append(time.perf_counter() - t)
            tokens += sum(len(c.token_ids) for c in last.outputs) if last else 0

    child0 = process_cpu_seconds(core.pid) or 0.0 if core is not None else 0.0
    t0, cpu0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*[worker() for _ in range(concurrency)])
    seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    if core is not None:  # the engine process's CPU too
        cpu += (process_cpu_seconds(core.pid) or 0.0) - child0
    ae.shutdown()
    return Run("async engine" if core is None else "process engine", seconds, tokens, latencies, cpu)


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process (Linux /proc), None where unavailable."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def tree_cpu_seconds(pid: int) -> float | None:
    """CPU time of a process plus its live children (the server and its engine process), None where unavailable."""
    total = process_cpu_seconds(pid)
    if total is None:
        return None
    try:
        names = os.listdir("/proc")
    except OSError:
        return total
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid:
            total += process_cpu_seconds(int(name)) or 0.0
    return total


async def run_http(url: str, prompts: list[list[int]], output_len: int, concurrency: int,
                   server_pid: int | None = None, client: str = "lean") -> Run:
    """Streaming /v1/completions requests, `concurrency` at a time, tokens counted from `usage`; `client` "lean"
    (keep-alive connections driven by `_SSEConnection`) or "aiohttp" (`aiohttp.ClientSession`)."""
    queue = list(prompts)
    latencies: list[float] = []
    tokens = 0
    host, port = _host_port(url)

    def body(ids: list[int]) -> bytes:
        return json.dumps({"prompt": ids, "max_tokens": output_len, "temperature": 0.0, "ignore_eos": True,
                           "stream": True, "stream_options": {"include_usage": True}}).encode()

    async def aiohttp_worker(session: aiohttp.ClientSession) -> None:
        nonlocal tokens
        while queue:
            data = body(queue.pop())
            t = time.perf_counter()
            async with session.post(url + "/v1/completions", data=data,
                                    headers={"Content-Type": "application/json"}) as resp:
                if resp.status != 200:
                    raise RuntimeError(f"HTTP {resp.status}: {await resp.text()}")
                usage = None
                async for line in resp.content:
                    if line.startswith(b'data: {"id"') and b'"usage":{' in line:
                        usage = json.loads(line[6:])["usage"]
            latencies.append(time.perf_counter() - t)
            tokens += usage["completion_tokens"] if usage else 0

    async def lean_worker(conn: _SSEConnection) -> None:
        nonlocal tokens
        try:
            while queue:
                data = body(queue.pop())
                request = (b"POST /v1/completions HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
                           b"Content-Length: %d\r\n\r\n" % (host.encode(), port, len(data))) + data
                t = time.perf_counter()
                last = await conn.request(request)
                latencies.append(time.perf_counter() - t)
                usage = None
                for line in last.split(b"\n"):
                    if line.startswith(b'data: {"id"') and b'"usage":{' in line:
                        usage = json.loads(line[6:])["usage"]
                tokens += usage["completion_tokens"] if usage else 0
        finally:
            conn.close()

    conns: list[_SSEConnection] = []
    if client == "lean":  # keep-alive connections, opened before the clock starts (as a client's pool is)
        loop = asyncio.get_running_loop()
        conns = [c for _, c in await asyncio.gather(*[loop.create_connection(_SSEConnection, host, port)
                                                      for _ in range(concurrency)])]
    cpu0 = tree_cpu_seconds(server_pid) if server_pid else None
    own0 = time.process_time()
    t0 = time.perf_counter()
    if client == "aiohttp":
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            await asyncio.gather(*[aiohttp_worker(session) for _ in range(concurrency)])
    else:
        await asyncio.gather(*[lean_worker(conn) for conn in conns])
    seconds = time.perf_counter() - t0
    own = time.process_time() - own0
    cpu1 = tree_cpu_seconds(server_pid) if server_pid else None
    cpu = cpu1 - cpu0 if cpu0 is not None and cpu1 is not None else None
    return Run("HTTP", seconds, tokens, latencies, cpu, own)


def _host_port(url: str) -> tuple[str, int]:
    m = re.match(r"http://([^:/]+):(\d+)", url)
    if not m:
        raise ValueError(f"not an http://host:port URL: {url}")
    return m.group(1), int(m.group(2))


class _SSEConnection(asyncio.Protocol):
    """The lean load generator: one keep-alive HTTP/1.1 connection, one streaming request at a time. It parses the
    status line and the chunked body, and keeps the body's last non-empty chunk (the usage event and [DONE]):
    a small fraction of the CPU of an `aiohttp` client, which matters because the load generator shares the
    machine (here: 2 CPUs) with the server it measures."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.future: asyncio.Future[bytes] | None = None
        self.in_body = False
        self.last = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def request(self, data: bytes) -> asyncio.Future[bytes]:
        assert self.transport is not None and self.future is None
        self.future = asyncio.get_running_loop().create_future()
        self.in_body = False
        self.last = b""
        self.transport.write(data)
        return self.future

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        pos = 0
        if not self.in_body:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(buf[:end])
            if not head.startswith(b"HTTP/1.1 200") or b"transfer-encoding: chunked" not in head.lower():
                self._fail(RuntimeError(f"unexpected response: {head[:200]!r}"))
                return
            self.in_body = True
            pos = end + 4
        while True:
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            size = int(buf[pos:eol], 16)
            if len(buf) < eol + 2 + size + 2:
                break
            if size == 0:  # the last chunk: the response is complete
                del buf[:eol + 4]
                future, self.future = self.future, None
                if future is not None and not future.done():
                    future.set_result(self.last)
                return
            self.last = bytes(buf[eol + 2:eol + 2 + size])
            pos = eol + 2 + size + 2
        del buf[:pos]

    def _fail(self, exc: BaseException) -> None:
        future, self.future = self.future, None
        if future is not None and not future.done():
            future.set_exception(exc)
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._fail(exc or ConnectionError("connection closed"))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


def _drain(fd: int) -> None:
    while os.read(fd, 1 << 16):
        pass


def _toml_load(f: Any) -> dict[str, Any]:
    """tomllib is new in Python 3.11; on 3.10 its backport, tomli (the dev extra installs it there)."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib
    return tomllib.load(f)


def importable_checkout(checkout: str, into: str) -> str:
    """Lay out another checkout of this repository as an importable `hetero_infer` package under `into` (links,
    following pyproject.toml's package-dir: hetero_infer.worker is the folder worker/, ...); returns `into`."""
    with open(os.path.join(checkout, "pyproject.toml"), "rb") as f:
        package_dir = _toml_load(f)["tool"]["setuptools"]["package-dir"]
    root = os.path.join(into, "hetero_infer")
    os.makedirs(root, exist_ok=True)
    top = os.path.join(checkout, package_dir["hetero_infer"])
    for name in os.listdir(top):
        os.symlink(os.path.join(top, name), os.path.join(root, name))
    for package, folder in package_dir.items():
        if package != "hetero_infer":
            os.symlink(os.path.join(checkout, folder), os.path.join(root, package.split(".", 1)[1]))
    return into


def start_server(extra: list[str], pythonpath: str | None = None) -> tuple[subprocess.Popen[str], str]:
    """`hetero-infer serve` on a free port; `pythonpath`: a folder holding the `hetero_infer` package to serve
    with instead of this one (`importable_checkout`)."""
    cmd = [sys.executable, "-m", "hetero_infer.cli", "serve", "--port", "0", "--log-format", "text", *extra]
    env = None if pythonpath is None else {**os.environ, "PYTHONPATH": pythonpath}
    # `python -m` puts the working directory first on sys.path: the baseline's folder, not this checkout.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            cwd=pythonpath)
    assert proc.stdout is not None
    url = ""
    for line in proc.stdout:
        m = re.search(r"listening on (http://\S+)", line)
        if m:
            url = m.group(1)
        if "ready: serving" in line:
            break
    if not url:
        proc.kill()
        raise RuntimeError("the server did not start")
    # The server's log goes on to a pipe that must be drained: in large reads, not line by line, since this
    # thread takes the GIL (and CPU) from the load generator.
    threading.Thread(target=_drain, args=(proc.stdout.fileno(),), daemon=True).start()
    return proc, url


def print_table(runs: dict[str, list[Run]]) -> None:
    """One row per path: the best run (on a shared machine interference only ever slows a run down, so the
    fastest run, and the least CPU per token, is the most faithful figure of each path), the median, and the
    median over the rounds of each run against the engine run of its round (robust to a machine whose speed
    drifts between rounds)."""
    best = {mode: max(rs, key=lambda x: x.tokens_per_s) for mode, rs in runs.items()}
    cpu = {mode: min(r.cpu_us_per_token for r in rs if r.cpu_us_per_token is not None)
           for mode, rs in runs.items() if any(r.cpu_us_per_token is not None for r in rs)}
    median = {mode: statistics.median(r.tokens_per_s for r in rs) for mode, rs in runs.items()}
    paired = {mode: statistics.median(r.tokens_per_s / e.tokens_per_s for r, e in zip(rs, runs["engine"])) - 1.0
              for mode, rs in runs.items()}
    base = best["engine"]
    print("| path | output tok/s | vs engine | median tok/s | vs engine, same round (median) "
          "| request latency p50 / p99 (s) | serving CPU per token (µs) | vs engine |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for mode, run in best.items():
        change = run.tokens_per_s / base.tokens_per_s - 1.0
        c = cpu.get(mode)
        c_text = f"{c:.1f} | {c / cpu['engine'] - 1.0:+.1%}" if c is not None and "engine" in cpu else "n/a | n/a"
        print(f"| {mode} | {run.tokens_per_s:,.0f} | {change:+.1%} | {median[mode]:,.0f} | {paired[mode]:+.1%} | "
              f"{run.latency(0.5):.3f} / {run.latency(0.99):.3f} | {c_text} |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hetero_infer.bench.overhead",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--num-requests", type=int, default=1024,
                   help="requests per run (default 1024: 16 waves of 64, so that the first wave and the last, "
                   "whose requests end at different steps once the waves have spread out, weigh little)")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stream-interval", type=float, default=0.01, help="as `serve --stream-interval`")
    p.add_argument("--executor", choices=("mock", "torch"), default="mock")
    p.add_argument("--mock-step-latency-s", type=float, default=0.0, help="mock executor: seconds per step")
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--server-arg", action="append", default=[], help="extra `hetero-infer serve` argument")
    p.add_argument("--process-engine", action="store_true",
                   help="also run the engine in its own process (as `serve --engine-process`), driven by "
                   "asyncio tasks, no HTTP")
    p.add_argument("--client", choices=("lean", "aiohttp"), default="lean",
                   help="the HTTP load generator: lean keep-alive connections (default) or aiohttp.ClientSession "
                   "(several times the CPU per token, taken from the same CPUs as the server's)")
    p.add_argument("--baseline", metavar="CHECKOUT",
                   help="also serve with the code of another checkout of this repository (say, `git worktree add "
                   "/tmp/base HEAD~3`) and load both servers in turn, in the same minutes: an A/B of two servers "
                   "on a machine whose speed drifts")
    p.add_argument("--probe-seconds", type=float, default=0.3,
                   help="time each CPU's speed for this long before and after every round "
                   "(hetero_infer.bench.cpu_speed) and also report the rounds measured at full speed; 0: off")
    p.add_argument("--output-json", help="write the runs as JSON")
    args = p.parse_args(argv)

    from hetero_infer.worker.core.engine import LLMEngine

    config = EngineConfig(executor=args.executor, mock_step_latency_s=args.mock_step_latency_s,
                          max_model_len=args.max_model_len)
    engine = LLMEngine(config)
    # The garbage collector as the server and its engine process set it once loaded, for every path here too.
    freeze_startup_objects()
    prompts = _prompts(args.num_requests, args.input_len, args.seed)
    engine_args = ["--executor", args.executor, "--mock-step-latency-s", str(args.mock_step_latency_s)]
    if args.max_model_len:
        engine_args += ["--max-model-len", str(args.max_model_len)]
    serve_args = [*engine_args, "--stream-interval", str(args.stream_interval), *args.server_arg]
    servers: dict[str, tuple[subprocess.Popen[str], str]] = {}
    probes: list[tuple[dict[int, list[float]], dict[int, list[float]]]] = []  # CPU speed before/after each round
    baseline_dir = tempfile.mkdtemp(prefix="hetero-infer-baseline-") if args.baseline else None
    try:
        servers["HTTP"] = start_server(serve_args)
        if args.baseline:
            servers["HTTP (baseline)"] = start_server(serve_args, importable_checkout(args.baseline, baseline_dir))
        runs: dict[str, list[Run]] = {"engine": [], "async engine": [], **{name: [] for name in servers}}
        if args.process_engine:
            runs["process engine"] = []
        for _, url in servers.values():  # warm-up
            asyncio.run(run_http(url, prompts[:16], args.output_len, 16, client=args.client))
        run_engine(engine, prompts[:16], args.output_len, 16, "warm")
        for r in range(args.repeats):
            before = probe(seconds=args.probe_seconds) if args.probe_seconds > 0 else None
            runs["engine"].append(run_engine(engine, prompts, args.output_len, args.concurrency, f"e{r}"))
            runs["async engine"].append(asyncio.run(
                run_async_engine(engine, prompts, args.output_len, args.concurrency, f"a{r}", args.stream_interval)))
            if args.process_engine:  # a fresh engine process per run, started before the clock starts
                from hetero_infer.worker.frontend.process import EngineProcess

                core = EngineProcess(config, args.stream_interval)
                core.start()
                core.wait_ready()
                runs["process engine"].append(asyncio.run(run_async_engine(
                    engine, prompts, args.output_len, args.concurrency, f"p{r}", args.stream_interval, core)))
            order = list(servers.items())
            for name, (proc, url) in order if r % 2 == 0 else order[::-1]:  # neither server always goes first
                runs[name].append(asyncio.run(run_http(url, prompts, args.output_len, args.concurrency, proc.pid,
                                                       args.client)))
            if before is not None:
                probes.append((before, probe(seconds=args.probe_seconds)))
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(30)
        if baseline_dir is not None:
            shutil.rmtree(baseline_dir, ignore_errors=True)

    executor = (f"mock executor, {args.mock_step_latency_s * 1000:g} ms per step" if args.executor == "mock"
                else f"{engine.model_name} on {args.executor}")
    print(f"{args.num_requests} requests, {args.concurrency} concurrent, {args.input_len} prompt + "
          f"{args.output_len} output tokens, {executor}, stream interval {args.stream_interval * 1000:g} ms, "
          f"{os.cpu_count()} CPUs, best of {args.repeats} runs\n")
    print_table(runs)
    if probes:
        fastest = min(min(x) for pre, post in probes for side in (pre, post) for x in side.values())
        quiet = [i for i, (pre, post) in enumerate(probes)
                 if max(slowdown(pre, fastest), slowdown(post, fastest)) <= QUIET_SLOWDOWN]
        print(f"\nRounds at full speed (every CPU's median probe sample within {QUIET_SLOWDOWN - 1:.0%} of the "
              f"fastest, {fastest:.2f} ms, before and after the round): {len(quiet)} of {len(probes)}")
        if quiet:
            print()
            print_table({mode: [rs[i] for i in quiet] for mode, rs in runs.items()})
    client_cpu = [r.client_cpu_seconds / r.tokens * 1e6 for r in runs["HTTP"] if r.client_cpu_seconds is not None]
    if client_cpu:
        print(f"\nload generator ({args.client} client, in this process, on the same CPUs): "
              f"{min(client_cpu):.1f} µs CPU per token (least of the runs)")
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump({m: [{"tokens_per_s": r.tokens_per_s, "seconds": r.seconds, "tokens": r.tokens,
                            "cpu_seconds": r.cpu_seconds, "client_cpu_seconds": r.client_cpu_seconds,
                            "latency_p50": r.latency(0.5),
                            "latency_p99": r.latency(0.99)} for r in rs]
                       for m, rs in runs.items()}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
