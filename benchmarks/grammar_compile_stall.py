"""How long one stream pauses while other clients send structured-output schemas never seen before
(docs/benchmarks.md, "Grammar compiles and other streams"): a real `hetero-infer serve` (mock executor with
logits, the default model's tokenizer, 10 ms steps), one streaming completion, and meanwhile `--schemas`
requests, one after the other, each with a fresh `"maxLength"` (xgrammar compiles each anew). Prints the stream's
longest gap between chunks with and without the schemas, and the schema requests' own latency.

    python -m benchmarks.grammar_compile_stall [--no-engine-process] [--max-length 53] \
        [--server-arg=--grammar-compile-timeout=300]

To measure a checkout without the fix, put it first on PYTHONPATH (a folder `hetero_infer/` whose `worker`,
`kernels`, ... point at that checkout's folders).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.request


def _post(url: str, body: dict, timeout: float = 600) -> tuple[int, bytes]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _stream_gaps(url: str, model: str, max_tokens: int, out: list[float], started: threading.Event) -> None:
    body = {"model": model, "prompt": "count:", "max_tokens": max_tokens, "stream": True, "ignore_eos": True}
    req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    last = None
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            if not line.startswith(b"data: "):
                continue
            now = time.monotonic()
            if last is not None:
                out.append(now - last)
            last = now
            started.set()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--no-engine-process", action="store_true")
    ap.add_argument("--max-length", type=int, default=100000007, help="first maxLength (each request adds 1)")
    ap.add_argument("--schemas", type=int, default=3)
    ap.add_argument("--stream-tokens", type=int, default=1500)
    ap.add_argument("--server-arg", action="append", default=[],
                    help="more flags for the server, e.g. --server-arg=--grammar-compile-timeout=300")
    args = ap.parse_args()
    cmd = [sys.executable, "-m", "hetero_infer.cli", "serve", "--port", "0", "--executor", "mock", "--mock-logits",
           "--mock-step-latency-s", "0.01", "--max-model-len", "4096", "--log-format", "text",
           "--no-engine-process" if args.no_engine_process else "--engine-process", *args.server_arg]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            m = re.search(r"listening on (http://\S+)", line)
            if m:
                url = m.group(1)
                break
        threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()  # drain the log
        while True:
            try:
                with urllib.request.urlopen(url + "/readyz", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.2)
        with urllib.request.urlopen(url + "/v1/models") as r:
            model = json.load(r)["data"][0]["id"]
        chat = url + "/v1/chat/completions"
        _post(chat, {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                     "guided_choice": ["a", "b"]})  # the tokenizer's xgrammar view: built once per engine

        def run(with_schemas: bool) -> tuple[float, list[float], list[int]]:
            gaps: list[float] = []
            started = threading.Event()
            t = threading.Thread(target=_stream_gaps, args=(url, model, args.stream_tokens, gaps, started))
            t.start()
            started.wait(120)
            waits, statuses = [], []
            for i in range(args.schemas if with_schemas else 0):
                schema = {"type": "object", "properties": {"s": {"type": "string",
                                                                 "maxLength": args.max_length + i + 2 * run.calls}}}
                t0 = time.monotonic()
                status, _ = _post(chat, {"model": model, "messages": [{"role": "user", "content": "J"}],
                                         "max_tokens": 4, "response_format": {"type": "json_schema", "json_schema": {
                                             "name": "s", "schema": schema}}})
                waits.append(time.monotonic() - t0)
                statuses.append(status)
            run.calls += 1
            t.join()
            return max(gaps), waits, statuses

        run.calls = 0
        alone = run(False)
        loaded = run(True)
        mode = "thread" if args.no_engine_process else "process"
        print(f"| engine | stream alone: longest gap | with {args.schemas} fresh schemas: longest gap | "
              f"schema requests (s) | statuses |")
        print("|---|---|---|---|---|")
        print(f"| {mode} | {alone[0]:.3f} s | {loaded[0]:.3f} s | "
              f"{', '.join(f'{w:.2f}' for w in loaded[1])} (median {statistics.median(loaded[1]):.2f}) | "
              f"{loaded[2]} |")
    finally:
        proc.terminate()
        proc.wait(60)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
