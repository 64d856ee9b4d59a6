"""`hetero-infer bench serve`: a serving benchmark for any OpenAI-compatible endpoint.

Sends streaming requests at a request rate (Poisson arrivals, or all at once) and/or with a fixed number in
flight, with seeded random prompts or prompts from a file, and reports time to first token, inter-token
latency (between streamed chunks), time per output token and end-to-end latency (mean, p50, p90, p99),
throughput and errors, as a table and optionally as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

WORDS = (
    "the of and to in is was for on that with as by at from his her an were are which this be or had not but "
    "one all their has have they more can when who will time been said about also new would there into other "
    "first after two some what its over only most made city world year may people many between state work such "
    "where during part number these then under known used years great through three while house power water "
    "light music river north south early long small high before each school family field story place group "
    "game system language history music market science nature garden window morning question answer energy "
    "mountain ocean village bridge engine letter winter summer forest island season machine picture reason"
).split()


@dataclass
class BenchRequest:
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    max_tokens: int = 128


@dataclass
class RequestResult:
    ok: bool = False
    status: int | None = None
    error: str | None = None
    ttft: float | None = None
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    prompt_tokens: int = 0
    output_tokens: int = 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hetero-infer bench serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:3000 (with or without /v1)")
    p.add_argument("--endpoint", choices=("completions", "chat"), default="completions")
    p.add_argument("--model", help="model name (default: the first one /v1/models lists)")
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"), help="bearer key (default $OPENAI_API_KEY)")
    p.add_argument("--num-prompts", type=int, default=200, help="requests to send")
    p.add_argument("--request-rate", type=float, default=math.inf,
                   help="requests per second, Poisson arrivals (default inf: all at once)")
    p.add_argument("--concurrency", type=int, default=None, help="most requests in flight (default: no limit)")
    p.add_argument("--dataset", default="random",
                   help="'random', or a file: one prompt per line, or JSONL with 'prompt' or 'messages' "
                   "(and optional 'max_tokens')")
    p.add_argument("--input-len", type=int, default=128, help="random prompts: words per prompt")
    p.add_argument("--output-len", type=int, default=128, help="max_tokens per request")
    p.add_argument("--range-ratio", type=float, default=0.0,
                   help="random lengths vary uniformly in [len*(1-r), len*(1+r)]")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
                   help="ask for exactly max_tokens tokens (vLLM extension; default on)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    p.add_argument("--output-json", help="also write the results as JSON to this file ('-' for stdout)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _check_args(args: argparse.Namespace) -> None:
    if args.num_prompts < 1:
        raise ValueError("--num-prompts must be >= 1")
    if not args.request_rate > 0:
        raise ValueError("--request-rate must be > 0 (inf for all at once)")
    if args.concurrency is not None and args.concurrency < 1:
        raise ValueError("--concurrency must be >= 1")
    if args.input_len < 1 or args.output_len < 1:
        raise ValueError("--input-len and --output-len must be >= 1")
    if not 0.0 <= args.range_ratio < 1.0:
        raise ValueError("--range-ratio must be in [0, 1)")
    if args.dataset != "random" and not Path(args.dataset).is_file():
        raise ValueError(f"--dataset: no such file: {args.dataset}")


def _vary(rng: random.Random, n: int, ratio: float) -> int:
    return max(1, rng.randint(int(n * (1 - ratio)), int(math.ceil(n * (1 + ratio)))))


def make_requests(args: argparse.Namespace) -> list[BenchRequest]:
    rng = random.Random(args.seed)
    if args.dataset == "random":
        out = []
        for _ in range(args.num_prompts):
            text = " ".join(rng.choice(WORDS) for _ in range(_vary(rng, args.input_len, args.range_ratio)))
            out.append(BenchRequest(prompt=text, max_tokens=_vary(rng, args.output_len, args.range_ratio)))
    else:
        out = _read_dataset(Path(args.dataset), args.output_len)
        if not out:
            raise ValueError(f"--dataset {args.dataset} holds no prompt")
        out = [out[i % len(out)] for i in range(args.num_prompts)]
    if args.endpoint == "chat":
        for r in out:
            if r.messages is None:
                r.messages, r.prompt = [{"role": "user", "content": r.prompt}], None
    else:
        for r in out:
            if r.prompt is None:
                r.prompt = "\n".join(str(m.get("content", "")) for m in r.messages or [])
    return out


def _read_dataset(path: Path, default_max_tokens: int) -> list[BenchRequest]:
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        if path.suffix == ".jsonl":
            try:
                obj = json.loads(line)
            except ValueError:
                raise ValueError(f"{path}:{n}: not JSON") from None
            if not isinstance(obj, dict) or not ("prompt" in obj or "messages" in obj):
                raise ValueError(f"{path}:{n}: needs a 'prompt' or 'messages' field")
            out.append(BenchRequest(obj.get("prompt"), obj.get("messages"), int(obj.get("max_tokens", default_max_tokens))))
        else:
            out.append(BenchRequest(prompt=line, max_tokens=default_max_tokens))
    return out


def _api_base(url: str) -> str:
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


async def _discover_model(session: aiohttp.ClientSession, base: str) -> str:
    async with session.get(base + "/models") as r:
        body = await r.json(content_type=None)
        if r.status != 200 or not body.get("data"):
            raise RuntimeError(f"GET {base}/models answered {r.status}: {body}")
        return body["data"][0]["id"]


async def run_one(session: aiohttp.ClientSession, base: str, model: str, req: BenchRequest,
                  args: argparse.Namespace) -> RequestResult:
    body: dict[str, Any] = {"model": model, "max_tokens": req.max_tokens, "temperature": args.temperature,
                            "stream": True, "stream_options": {"include_usage": True}}
    if args.ignore_eos:
        body["ignore_eos"] = True
    if args.endpoint == "chat":
        url, body["messages"] = base + "/chat/completions", req.messages
    else:
        url, body["prompt"] = base + "/completions", req.prompt
    res = RequestResult()
    t0 = time.perf_counter()
    last = t0
    chunks = 0
    try:
        async with session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=args.timeout)) as resp:
            res.status = resp.status
            if resp.status != 200:
                res.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                return res
            done = False
            async for raw in resp.content:
                if not raw.startswith(b"data:"):
                    continue
                data = raw[5:].strip()
                if data == b"[DONE]":
                    done = True
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    res.error = f"stream error: {chunk['error'].get('message')}"
                    return res
                if chunk.get("usage"):
                    res.prompt_tokens = chunk["usage"].get("prompt_tokens", 0)
                    res.output_tokens = chunk["usage"].get("completion_tokens", 0)
                has_content = any((c.get("text") or (c.get("delta") or {}).get("content"))
                                  for c in chunk.get("choices") or [])
                if has_content:
                    now = time.perf_counter()
                    if res.ttft is None:
                        res.ttft = now - t0
                    else:
                        res.itl.append(now - last)
                    last = now
                    chunks += 1
            if not done:
                res.error = "stream ended without [DONE]"
                return res
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
        res.error = f"{type(exc).__name__}: {exc}"
        return res
    res.latency = time.perf_counter() - t0
    res.output_tokens = res.output_tokens or chunks
    res.ok = True
    return res


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0}
    s = sorted(values)

    def pct(q: float) -> float:
        k = (len(s) - 1) * q
        lo, hi = math.floor(k), math.ceil(k)
        return s[lo] + (s[hi] - s[lo]) * (k - lo)

    return {"mean": statistics.fmean(s), "p50": pct(0.5), "p90": pct(0.9), "p99": pct(0.99)}


def summarize(results: list[RequestResult], duration: float, args: argparse.Namespace, model: str) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    errors: dict[str, int] = {}
    for r in results:
        if not r.ok:
            key = f"HTTP {r.status}" if r.status not in (None, 200) else (r.error or "error").split(":")[0]
            errors[key] = errors.get(key, 0) + 1
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    tpot = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok if r.ttft is not None and r.output_tokens > 1]
    ms = 1000.0
    return {
        "url": args.url, "endpoint": args.endpoint, "model": model,
        "num_prompts": len(results), "request_rate": args.request_rate if math.isfinite(args.request_rate) else "inf",
        "concurrency": args.concurrency, "duration_s": duration,
        "completed": len(ok), "failed": len(results) - len(ok), "errors": errors,
        "prompt_tokens": in_tokens, "output_tokens": out_tokens,
        "request_throughput": len(ok) / duration if duration else 0.0,
        "output_throughput": out_tokens / duration if duration else 0.0,
        "total_token_throughput": (in_tokens + out_tokens) / duration if duration else 0.0,
        "ttft_ms": {k: v * ms for k, v in _percentiles([r.ttft for r in ok if r.ttft is not None]).items()},
        "itl_ms": {k: v * ms for k, v in _percentiles([x for r in ok for x in r.itl]).items()},
        "tpot_ms": {k: v * ms for k, v in _percentiles(tpot).items()},
        "e2e_ms": {k: v * ms for k, v in _percentiles([r.latency for r in ok]).items()},
    }


def format_table(s: dict[str, Any]) -> str:
    rows = [
        ("Endpoint", f"{s['url']} ({s['endpoint']}, model {s['model']})"),
        ("Requests", f"{s['completed']} completed, {s['failed']} failed of {s['num_prompts']}"),
        ("Request rate / concurrency", f"{s['request_rate']} req/s / {s['concurrency'] or 'unlimited'}"),
        ("Duration", f"{s['duration_s']:.2f} s"),
        ("Prompt / output tokens", f"{s['prompt_tokens']} / {s['output_tokens']}"),
        ("Request throughput", f"{s['request_throughput']:.2f} req/s"),
        ("Output token throughput", f"{s['output_throughput']:.1f} tok/s"),
        ("Total token throughput", f"{s['total_token_throughput']:.1f} tok/s"),
    ]
    lines = [f"{k:<28}{v}" for k, v in rows]
    if s["errors"]:
        lines.append(f"{'Errors':<28}" + ", ".join(f"{k}: {v}" for k, v in sorted(s["errors"].items())))
    lines.append("")
    lines.append(f"{'latency (ms)':<14}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}")
    for name, key in (("TTFT", "ttft_ms"), ("ITL", "itl_ms"), ("TPOT", "tpot_ms"), ("E2E", "e2e_ms")):
        v = s[key]
        lines.append(f"{name:<14}{v['mean']:>10.2f}{v['p50']:>10.2f}{v['p90']:>10.2f}{v['p99']:>10.2f}")
    return "\n".join(lines)


async def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    requests = make_requests(args)
    base = _api_base(args.url)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:
        model = args.model or await _discover_model(session, base)
        limit = asyncio.Semaphore(args.concurrency) if args.concurrency else None
        rng = random.Random(args.seed + 1)
        bar = None
        if not args.no_progress:
            from tqdm import tqdm

            bar = tqdm(total=len(requests), desc="requests", unit="req", file=sys.stderr)

        async def one(req: BenchRequest) -> RequestResult:
            if limit is None:
                r = await run_one(session, base, model, req, args)
            else:
                async with limit:
                    r = await run_one(session, base, model, req, args)
            if bar is not None:
                bar.update(1)
            return r

        tasks = []
        t0 = time.perf_counter()
        for i, req in enumerate(requests):
            tasks.append(asyncio.create_task(one(req)))
            if math.isfinite(args.request_rate) and i < len(requests) - 1:
                await asyncio.sleep(rng.expovariate(args.request_rate))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - t0
        if bar is not None:
            bar.close()
    return summarize(results, duration, args, model)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        _check_args(args)
        summary = asyncio.run(run_benchmark(args))
    except (ValueError, RuntimeError, aiohttp.ClientError, OSError) as exc:
        print(f"hetero-infer bench serve: error: {exc}", file=sys.stderr)
        return 2
    if args.output_json == "-":
        print(json.dumps(summary, indent=2))
    else:
        print(format_table(summary))
        if args.output_json:
            Path(args.output_json).write_text(json.dumps(summary, indent=2))
    return 0 if summary["completed"] else 1

