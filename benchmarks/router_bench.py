"""Router benchmark: the policies side by side on one shared-prefix, multi-turn workload.

Starts `--workers` mock workers with a cost model (a step takes `--step-s` plus `--token-s` per token it
computes and `--seq-s` per sequence it runs, so a prefix-cache hit saves real time), then for each policy a
router in front of them, and drives the same workload through it: `--systems` long system prompts, `--users`
users each holding a `--turns`-turn conversation on one of them, `--concurrency` conversations at a time
(or, with `--rate`, conversations arriving at that Poisson rate: the same offered load for every policy),
prompts as token ids (so the router hashes exactly what the workers cache). Each policy gets its own random
salt in the prompts, so no policy starts on another's cache. Reports per policy: the cluster's prefix-cache hit
rate (workers' own counters) and the rate one replica holding everything would get, TTFT p50/p99, output
tokens/s, the spread of requests over workers and each worker's mean waiting queue (`--slow-worker 3` makes
the first worker three times slower).

    python benchmarks/router_bench.py [--workers 3] [--policies prefix least-load round-robin] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

import aiohttp

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[1] / "tests" / "router")]
from router_proc import Proc, samples, start_router, start_workers  # noqa: E402

BLOCK = 16


def ideal_hit_tokens(prompts: list[list[int]]) -> tuple[int, int]:
    """(hit tokens, query tokens) of one replica with an unbounded cache seeing the prompts in order (as the
    engine looks up: full blocks, the newest token always computed)."""
    from hetero_infer.router.hashing import block_hashes

    seen: set[int] = set()
    hit = query = 0
    for p in prompts:
        hashes = block_hashes(p, BLOCK)[: (len(p) - 1) // BLOCK]
        n = 0
        while n < len(hashes) and hashes[n] in seen:
            n += 1
        hit += n * BLOCK
        query += len(p)
        seen.update(block_hashes(p, BLOCK))
    return hit, query


def conversations(args: argparse.Namespace, salt: int) -> list[list[list[int]]]:
    """Per user, the token ids of each turn's prompt (system + earlier turns + a new question)."""
    rng = random.Random(salt)
    systems = [[rng.randrange(1000, 40000) for _ in range(args.system_tokens)] for _ in range(args.systems)]
    out = []
    for u in range(args.users):
        history = list(systems[u % args.systems])
        turns = []
        for _ in range(args.turns):
            history += [rng.randrange(1000, 40000) for _ in range(args.question_tokens)]
            turns.append(list(history))
            history += [rng.randrange(1000, 40000) for _ in range(args.max_tokens)]  # stands in for the answer
        out.append(turns)
    return out


async def run_policy(args: argparse.Namespace, url: str, convs: list[list[list[int]]], model: str,
                     worker_urls: list[str]) -> dict:
    ttfts: list[float] = []
    out_tokens = 0
    errors = 0
    queue: asyncio.Queue[list[list[int]]] = asyncio.Queue()
    for c in convs:
        queue.put_nowait(c)

    async def converse(session: aiohttp.ClientSession, turns: list[list[int]]) -> None:
        nonlocal out_tokens, errors
        for prompt in turns:
            body = {"model": model, "prompt": prompt, "max_tokens": args.max_tokens, "stream": True,
                    "ignore_eos": True, "stream_options": {"include_usage": True}}
            start = time.perf_counter()
            first = None
            async with session.post(url + "/v1/completions", json=body) as r:
                if r.status != 200:
                    errors += 1
                    await r.read()
                    continue
                async for line in r.content:
                    if line.startswith(b"data: {"):
                        if first is None:
                            first = time.perf_counter() - start
                        if b'"usage":{' in line:  # the last event: tokens, not events (one may carry several)
                            out_tokens += json.loads(line[len(b"data: "):])["usage"]["completion_tokens"]
            if first is not None:
                ttfts.append(first)

    async def user(session: aiohttp.ClientSession) -> None:
        """Closed loop: one conversation after another."""
        while not queue.empty():
            await converse(session, queue.get_nowait())

    async def arrivals(session: aiohttp.ClientSession) -> None:
        """Open loop: conversations start at Poisson times, `--rate` per second, whatever the policy's speed
        (the same offered load for every policy)."""
        rng = random.Random(7)
        tasks = []
        for turns in convs:
            tasks.append(asyncio.create_task(converse(session, turns)))
            await asyncio.sleep(rng.expovariate(args.rate))
        await asyncio.gather(*tasks)

    queues: dict[str, list[float]] = {w: [] for w in worker_urls}

    async def sample_queues(session: aiohttp.ClientSession) -> None:
        while True:
            for w in worker_urls:
                async with session.get(w + "/metrics") as r:
                    text = await r.text()
                queues[w].append(sum(float(line.split()[-1]) for line in text.splitlines()
                                     if line.startswith("hetero_infer_num_requests_waiting")))
            await asyncio.sleep(0.2)

    start = time.perf_counter()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        sampler = asyncio.create_task(sample_queues(session))
        if args.rate:
            await arrivals(session)
        else:
            await asyncio.gather(*(user(session) for _ in range(args.concurrency)))
        sampler.cancel()
    elapsed = time.perf_counter() - start
    ttfts.sort()
    return {"requests": len(ttfts), "errors": errors, "elapsed_s": elapsed, "output_tokens_per_s": out_tokens / elapsed,
            "ttft_p50_ms": 1000 * statistics.median(ttfts) if ttfts else None,
            "ttft_p99_ms": 1000 * ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))] if ttfts else None,
            "mean_waiting_per_worker": [round(statistics.fmean(q), 2) if q else None for q in queues.values()]}


async def latencies(url: str, model: str, n: int) -> list[float]:
    """Seconds per sequential one-token completion (a short prompt), sorted."""
    out = []
    async with aiohttp.ClientSession() as session:
        for i in range(n):
            start = time.perf_counter()
            async with session.post(url + "/v1/completions",
                                    json={"model": model, "prompt": f"ping {i}", "max_tokens": 1}) as r:
                await r.read()
            out.append(time.perf_counter() - start)
    return sorted(out)


def overhead(args: argparse.Namespace, worker: Proc, model: str) -> dict:
    """The router's added latency: the same requests straight to one worker and through a router in front of it
    alone, interleaved in rounds so a busy machine slows both alike."""
    router = start_router([worker], "--policy", "prefix")
    direct: list[float] = []
    routed: list[float] = []
    router_cpu = 0.0
    try:
        for _ in range(5):
            direct += asyncio.run(latencies(worker.url, model, args.overhead_requests // 5))
            before = cpu_seconds(router.proc.pid)
            routed += asyncio.run(latencies(router.url, model, args.overhead_requests // 5))
            router_cpu += cpu_seconds(router.proc.pid) - before
    finally:
        router.stop()
    d, r = statistics.median(direct), statistics.median(routed)
    # The router's own CPU time per request (its health polls included): what it adds on a core of its own,
    # apart from the loopback hop; the wall-clock difference also holds waiting for a core on a busy machine.
    return {"direct_p50_ms": 1000 * d, "routed_p50_ms": 1000 * r, "added_p50_ms": 1000 * (r - d),
            "router_cpu_ms_per_request": 1000 * router_cpu / len(routed)}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def stream_tokens(url: str, model: str, streams: int, tokens: int) -> int:
    """Stream `streams` completions of `tokens` tokens each at once; the chunks received."""
    async def one(session: aiohttp.ClientSession) -> int:
        body = {"model": model, "prompt": "go", "max_tokens": tokens, "stream": True, "ignore_eos": True}
        n = 0
        async with session.post(url + "/v1/completions", json=body) as r:
            async for line in r.content:
                n += line.startswith(b"data: {")
        return n

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        return sum(await asyncio.gather(*(one(session) for _ in range(streams))))


def streaming_cost(args: argparse.Namespace, worker: Proc, model: str) -> dict:
    """Streamed tokens per second of the router's own CPU time (one core fully busy would pass this many)."""
    router = start_router([worker], "--policy", "prefix")
    try:
        before = cpu_seconds(router.proc.pid)
        start = time.perf_counter()
        chunks = asyncio.run(stream_tokens(router.url, model, 16, args.stream_tokens))
        elapsed = time.perf_counter() - start
        used = cpu_seconds(router.proc.pid) - before
    finally:
        router.stop()
    return {"chunks": chunks, "elapsed_s": elapsed, "router_cpu_s": used,
            "chunks_per_router_cpu_s": chunks / used if used else None}


def worker_counters(workers: list[Proc]) -> tuple[float, float]:
    hits = sum(sum(samples(w.url, "hetero_infer_prefix_cache_hits_total").values()) for w in workers)
    queries = sum(sum(samples(w.url, "hetero_infer_prefix_cache_queries_total").values()) for w in workers)
    return hits, queries


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--policies", nargs="+", default=["prefix", "least-load", "round-robin"])
    p.add_argument("--systems", type=int, default=12)
    p.add_argument("--system-tokens", type=int, default=1024)
    p.add_argument("--users", type=int, default=48)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--question-tokens", type=int, default=128)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=12, help="closed loop: conversations at a time")
    p.add_argument("--rate", type=float, default=0.0,
                   help="open loop instead: conversations started per second (Poisson), the same for every policy")
    p.add_argument("--kv-blocks", type=int, default=640,
                   help="KV blocks per worker: room for a few system prompts, not all (default 640)")
    p.add_argument("--step-s", type=float, default=0.002)
    p.add_argument("--token-s", type=float, default=0.0003)
    p.add_argument("--seq-s", type=float, default=0.0005)
    p.add_argument("--slow-worker", type=float, default=1.0,
                   help="make the first worker this many times slower (all its latencies), e.g. 3")
    p.add_argument("--overhead-requests", type=int, default=200,
                   help="sequential requests per side for the router's added latency (0: skip)")
    p.add_argument("--stream-tokens", type=int, default=500,
                   help="tokens per stream (16 at once) for the router's CPU cost per streamed token (0: skip)")
    p.add_argument("--json", help="write the results here as JSON too")
    args = p.parse_args(argv)

    def costs(factor: float) -> list[str]:
        return ["--mock-step-latency-s", str(args.step_s * factor), "--mock-token-latency-s",
                str(args.token_s * factor), "--mock-seq-latency-s", str(args.seq_s * factor)]

    workers = start_workers(args.workers, *costs(1.0), "--max-num-seqs", "16", "--max-num-blocks",
                            str(args.kv_blocks), extra={0: costs(args.slow_worker)} if args.slow_worker != 1 else None)
    results = {}
    try:
        for i, policy in enumerate(args.policies):
            router = start_router(workers, "--policy", policy)
            try:
                model = json.loads(__import__("urllib.request").request.urlopen(router.url + "/v1/models").read())[
                    "data"][0]["id"]
                convs = conversations(args, salt=1000 + i)
                h0, q0 = worker_counters(workers)
                r = asyncio.run(run_policy(args, router.url, convs, model, [w.url for w in workers]))
                h1, q1 = worker_counters(workers)
                routed = samples(router.url, "hetero_infer_router_requests_routed_total")
                per_worker = [sum(v for k, v in routed.items() if w.url in k) for w in workers]
                ideal_hit, ideal_query = ideal_hit_tokens([t for c in convs for t in c])
                r.update({"hit_rate": (h1 - h0) / max(q1 - q0, 1), "ideal_hit_rate": ideal_hit / ideal_query,
                          "requests_per_worker": per_worker})
                results[policy] = r
                print(f"{policy}: {json.dumps(r)}", flush=True)
            finally:
                router.stop()
        if args.overhead_requests:
            results["overhead"] = overhead(args, workers[0], model)
            print(f"overhead: {json.dumps(results['overhead'])}", flush=True)
        if args.stream_tokens:
            results["streaming"] = streaming_cost(args, workers[0], model)
            print(f"streaming: {json.dumps(results['streaming'])}", flush=True)
    finally:
        for w in workers:
            w.stop()
    print("\n| policy | hit rate (ideal) | TTFT p50 ms | TTFT p99 ms | output tok/s | requests per worker | "
          "mean queue per worker |")
    print("|---|---|---|---|---|---|---|")
    for policy, r in results.items():
        if policy in ("overhead", "streaming"):
            continue
        print(f"| {policy} | {r['hit_rate']:.2f} ({r['ideal_hit_rate']:.2f}) | {r['ttft_p50_ms']:.0f} | "
              f"{r['ttft_p99_ms']:.0f} | {r['output_tokens_per_s']:.0f} | {r['requests_per_worker']} | "
              f"{r['mean_waiting_per_worker']} |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
