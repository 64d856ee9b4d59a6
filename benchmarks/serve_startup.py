"""Start-up benchmark: from launching a server to its first answer, ours beside `transformers serve`.

For each server, `--rounds` times, interleaved (so the servers share the machine's state of the minute): launch it,
poll its health endpoint and then its readiness (every 20 ms), then send one greedy `/v1/completions` request (the
README's: "The capital of France is", 12 tokens) and stop the server. Reports the median and range of:
- listen: launch -> the health endpoint answers 200 (ours: `/healthz`; transformers: `/health`);
- ready: launch -> ready to serve (ours: `/readyz` 200; transformers loads its model before it listens, so ready
  is listen there);
- first answer: launch -> the completion's response received, and its text (the same greedy text for all: a
  server that answers differently is reported, not hidden).

Servers:
- `hetero-infer` (this checkout's console script: the default model on the CPU executor, and `--executor mock`);
- `--baseline-bin PATH`: another checkout's `hetero-infer` (run from its own virtualenv), the same two ways;
- `--peer-python PATH`: a Python with transformers and its serving extras (`pip install fastapi uvicorn`),
  running `transformers serve` on the same model folder (`FORCE_MODEL`, preloaded). Left out when not given.

    python benchmarks/serve_startup.py [--rounds 5] [--baseline-bin /venv/bin/hetero-infer] \
        [--peer-python /venv/bin/python] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

PROMPT = "The capital of France is"
MAX_TOKENS = 12
POLL_S = 0.02
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"  # what `hetero-infer serve` answers to without --model


@dataclass
class Server:
    name: str
    argv: list[str]  # with {port} and {model} placeholders
    health: str
    ready: str | None  # None: ready once healthy
    model_field: str  # the "model" of the request ({model}: the folder)
    samples: list[dict] = field(default_factory=list)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _complete(url: str, model: str) -> str:
    body = json.dumps({"model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0}).encode()
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())["choices"][0]["text"]


def run_once(server: Server, folder: str, timeout_s: float) -> dict:
    port = _free_port()
    argv = [a.format(port=port, model=folder) for a in server.argv]
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile() as log:
        started = time.monotonic()
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            marks = {}
            deadline = started + timeout_s
            for mark, path in (("listen_s", server.health), ("ready_s", server.ready or server.health)):
                while not _ok(base + path):
                    if proc.poll() is not None or time.monotonic() > deadline:
                        log.seek(0)
                        raise RuntimeError(f"{server.name} did not get {mark}: {log.read()[-2000:].decode(errors='replace')}")
                    time.sleep(POLL_S)
                marks[mark] = time.monotonic() - started
            text = _complete(base + "/v1/completions", server.model_field.format(model=folder))
            marks["answer_s"] = time.monotonic() - started
            marks["text"] = text
            return marks
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def servers(args: argparse.Namespace) -> list[Server]:
    ours = [("hetero-infer", "hetero-infer")]
    if args.baseline_bin:
        ours.append(("baseline", args.baseline_bin))
    out = []
    if "torch" in args.executors:
        for label, binary in ours:
            out.append(Server(f"{label} (torch)", [binary, "serve", "--port", "{port}"],  # the default model: {model}
                              "/healthz", "/readyz", DEFAULT_MODEL_NAME))
    if "mock" in args.executors:
        for label, binary in ours:
            out.append(Server(f"{label} (mock)", [binary, "serve", "--port", "{port}", "--executor", "mock"],
                              "/healthz", "/readyz", "mock"))
    if args.peer_python:
        out.append(Server("transformers serve", [args.peer_python, "-m", "transformers.cli.transformers", "serve",
                                                 "--port", "{port}", "{model}"], "/health", None, "{model}"))
    return out


def _span(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline-bin", help="another checkout's hetero-infer console script")
    parser.add_argument("--peer-python", help="a Python that can run `transformers serve` (fastapi, uvicorn)")
    parser.add_argument("--executors", default="torch,mock", help="our servers' executors, comma-separated")
    parser.add_argument("--timeout-s", type=float, default=300.0)
    parser.add_argument("--json", help="write the samples here")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    args.executors = args.executors.split(",")
    if not args.executors or not set(args.executors) <= {"torch", "mock"}:
        parser.error("--executors takes torch, mock or both")

    from hetero_infer.worker.runner.loader import resolve_model

    folder = str(resolve_model(None)[0])  # the default model, converted once (not part of any server's time)
    todo = servers(args)
    for r in range(args.rounds):
        for server in todo:
            sample = run_once(server, folder, args.timeout_s)
            server.samples.append(sample)
            print(f"round {r + 1}: {server.name}: listen {sample['listen_s']:.2f} s, ready {sample['ready_s']:.2f} s,"
                  f" answer {sample['answer_s']:.2f} s", file=sys.stderr, flush=True)

    print(f"\nlaunch -> (seconds, median and range over {args.rounds} rounds), model folder {folder}\n")
    print("| server | listen | ready | first answer | text |")
    print("|---|---:|---:|---:|---|")
    for s in todo:
        texts = sorted({x["text"] for x in s.samples})
        print(f"| {s.name} | {_span([x['listen_s'] for x in s.samples])} | {_span([x['ready_s'] for x in s.samples])}"
              f" | {_span([x['answer_s'] for x in s.samples])} | {' / '.join(repr(t) for t in texts)} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({s.name: s.samples for s in todo}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
