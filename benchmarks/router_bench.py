"""Router benchmark: the policies side by side, on the workload of a scenario, against mock workers.

Starts mock workers with a cost model (a step takes `--step-s` plus `--token-s` per token it computes and
`--seq-s` per sequence it runs, so a prefix-cache hit saves real time), then for each policy a router in front of
them, and drives the same workload through it, prompts as token ids (so the router hashes exactly what the
workers cache). Each policy and run gets its own random salt in the prompts, so none starts on another's cache.
Reports per policy: the cluster's prefix-cache hit rate (workers' own counters) and the rate one replica holding
everything would get, TTFT p50/p99, output tokens/s, the spread of requests over workers and each worker's mean
queue (running + waiting) and waiting, sampled every 0.2 s.

Scenarios (`--scenario`):
- `conversations` (default): 3 workers with 640-block pools, `--systems` long system prompts, `--users` users each
  holding a `--turns`-turn conversation on one of them, `--concurrency` conversations at a time (or, with
  `--rate`, arriving at that Poisson rate: the same offered load for every policy). `--slow-worker 3` makes the
  first worker three times slower.
- `small-pools`: issue 26's light-traffic case: 4 workers with `--max-num-blocks 112 --block-size 16` (a pool
  holds 3-4 of the prefixes), 12 shared prefixes of 368 tokens x 20 requests (each with its own 26-token tail),
  shuffled, 4 requests in flight, default router options.
- `hot-prefix`: one prefix for every request (200), 48 in flight, workers running at most 8 sequences each (so
  a worker saturates): the prefix must spread.
- `many-prefixes`: 60 prefixes x 4 requests, shuffled, 4 in flight, on the small pools: the working set (1,380
  blocks) is 3x the cluster's cache (448).

`--runs N` repeats the policies N times, interleaved; `--baseline-rev REV` adds the prefix policy of the router at
git revision REV (run from a copy of that revision's sources, beside this one, in the same minutes).

    python benchmarks/router_bench.py [--scenario small-pools] [--runs 5] [--baseline-rev f3ab0a4] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "router")]
from router_proc import Proc, samples, start_router, start_workers  # noqa: E402

BLOCK = 16
SCENARIOS = ("conversations", "small-pools", "hot-prefix", "many-prefixes")


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


def shared_prefixes(salt: int, prefixes: int, repeats: int, prefix_tokens: int = 368,
                    tail_tokens: int = 26) -> list[list[list[int]]]:
    """`prefixes` shared prefixes x `repeats` requests, each with its own tail, shuffled: one-turn sessions."""
    rng = random.Random(salt)
    shared = [[rng.randrange(1000, 40000) for _ in range(prefix_tokens)] for _ in range(prefixes)]
    prompts = [p + [rng.randrange(1000, 40000) for _ in range(tail_tokens)] for p in shared for _ in range(repeats)]
    rng.shuffle(prompts)
    return [[p] for p in prompts]


def workload(args: argparse.Namespace, salt: int) -> list[list[list[int]]]:
    if args.scenario == "conversations":
        return conversations(args, salt)
    if args.scenario == "small-pools":
        return shared_prefixes(salt, 12, 20)
    if args.scenario == "hot-prefix":
        return shared_prefixes(salt, 1, 200)
    return shared_prefixes(salt, 60, 4)


_TOKENIZER: list = []


def tokenizer():  # the mock workers' (the default model's), loaded once
    if not _TOKENIZER:
        from hetero_infer.default_model import default_tokenizer

        _TOKENIZER.append(default_tokenizer())
    return _TOKENIZER[0]


def as_text(convs: list[list[list[int]]]) -> list[list[str]]:
    """--text-prompts: each prompt as text (its ids decoded): the router hashes text chunks until it has the
    workers' tokenizer, then token blocks, as it does for a client's text prompts."""
    tok = tokenizer()
    return [[tok.decode(p) for p in turns] for turns in convs]


def encoded(prompt: list[int] | str) -> list[int]:
    return tokenizer().encode(prompt) if isinstance(prompt, str) else prompt


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
    waits: dict[str, list[float]] = {w: [] for w in worker_urls}

    async def sample_queues(session: aiohttp.ClientSession) -> None:
        while True:
            for w in worker_urls:
                async with session.get(w + "/metrics") as r:
                    text = await r.text()
                gauges = {name: sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))
                          for name in ("hetero_infer_num_requests_waiting", "hetero_infer_num_requests_running")}
                waits[w].append(gauges["hetero_infer_num_requests_waiting"])
                queues[w].append(sum(gauges.values()))
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
    mean_queue = [statistics.fmean(q) if q else 0.0 for q in queues.values()]
    return {"requests": len(ttfts), "errors": errors, "elapsed_s": elapsed, "output_tokens_per_s": out_tokens / elapsed,
            "ttft_p50_ms": 1000 * statistics.median(ttfts) if ttfts else None,
            "ttft_p99_ms": 1000 * ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))] if ttfts else None,
            "mean_queue_per_worker": [round(q, 2) for q in mean_queue],
            "mean_waiting_per_worker": [round(statistics.fmean(q), 2) if q else None for q in waits.values()],
            "max_queue_over_mean": max(mean_queue) / statistics.fmean(mean_queue) if any(mean_queue) else None}


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


def overhead(args: argparse.Namespace, worker: Proc, model: str, versions: dict[str, dict | None]) -> dict:
    """The router's added latency: the same requests straight to one worker and through a router in front of it
    alone (one per version: label -> the router process's environment), interleaved in rounds so a busy machine
    slows every side alike."""
    routers = {label: start_router([worker], "--policy", "prefix", env=env) for label, env in versions.items()}
    direct: list[float] = []
    routed: dict[str, list[float]] = {label: [] for label in routers}
    cpu = dict.fromkeys(routers, 0.0)
    try:
        for _ in range(5):
            direct += asyncio.run(latencies(worker.url, model, args.overhead_requests // 5))
            for label, router in routers.items():
                before = cpu_seconds(router.proc.pid)
                routed[label] += asyncio.run(latencies(router.url, model, args.overhead_requests // 5))
                cpu[label] += cpu_seconds(router.proc.pid) - before
    finally:
        for router in routers.values():
            router.stop()
    d = statistics.median(direct)
    # The router's own CPU time per request (its health polls included): what it adds on a core of its own,
    # apart from the loopback hop; the wall-clock difference also holds waiting for a core on a busy machine.
    return {"direct_p50_ms": 1000 * d,
            **{label: {"routed_p50_ms": 1000 * statistics.median(r), "added_p50_ms": 1000 * (statistics.median(r) - d),
                       "router_cpu_ms_per_request": 1000 * cpu[label] / len(r)} for label, r in routed.items()}}


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


def source_path(rev: str, into: Path) -> str:
    """A PYTHONPATH under which `hetero_infer` is git revision `rev`'s sources, laid out as its pyproject's
    package-dir maps folders onto subpackages (ahead of the editable install on sys.path)."""
    src = into / "src"
    src.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib  # the dev extra installs it on 3.10
    dirs = tomllib.loads((src / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    pkg = into / "path" / "hetero_infer"
    pkg.mkdir(parents=True)
    for item in (src / dirs["hetero_infer"]).iterdir():
        (pkg / item.name).symlink_to(item)
    for name, folder in dirs.items():
        if name != "hetero_infer":
            (pkg / name.split(".", 1)[1]).symlink_to(src / folder)
    return str(into / "path")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenario", choices=SCENARIOS, default="conversations")
    p.add_argument("--runs", type=int, default=1, help="repeat every policy this many times, interleaved")
    p.add_argument("--baseline-rev", help="also run the prefix policy of the router at this git revision")
    p.add_argument("--workers", type=int, help="default: 3 (conversations), else 4")
    p.add_argument("--policies", nargs="+", default=["prefix", "least-load", "round-robin"])
    p.add_argument("--systems", type=int, default=12)
    p.add_argument("--system-tokens", type=int, default=1024)
    p.add_argument("--users", type=int, default=48)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--question-tokens", type=int, default=128)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--concurrency", type=int,
                   help="closed loop: conversations at a time (default 12; small-pools and many-prefixes 4, "
                   "hot-prefix 48)")
    p.add_argument("--rate", type=float, default=0.0,
                   help="open loop instead: conversations started per second (Poisson), the same for every policy")
    p.add_argument("--kv-blocks", type=int,
                   help="KV blocks per worker (default 640: room for a few system prompts, not all; 112 in the "
                   "other scenarios)")
    p.add_argument("--max-num-seqs", type=int, help="sequences a worker runs at once (default 16; hot-prefix 8; "
                   "small-pools and many-prefixes: the worker's default)")
    p.add_argument("--step-s", type=float, default=0.002)
    p.add_argument("--token-s", type=float, default=0.0003)
    p.add_argument("--seq-s", type=float, default=0.0005)
    p.add_argument("--slow-worker", type=float, default=1.0,
                   help="make the first worker this many times slower (all its latencies), e.g. 3")
    p.add_argument("--overhead-requests", type=int, default=200,
                   help="sequential requests per side for the router's added latency (0: skip)")
    p.add_argument("--stream-tokens", type=int, default=500,
                   help="tokens per stream (16 at once) for the router's CPU cost per streamed token (0: skip)")
    p.add_argument("--at-once", action="store_true",
                   help="send the traffic as soon as the router listens (as a user starts it), not once it has "
                   "seen every worker ready")
    p.add_argument("--text-prompts", action="store_true",
                   help="send the prompts as text (the router switches from text to token hashes when the "
                   "workers' tokenizer arrives), not token ids")
    p.add_argument("--json", help="write the results here as JSON too")
    args = p.parse_args(argv)
    conv = args.scenario == "conversations"
    defaults = {"workers": 3 if conv else 4, "kv_blocks": 640 if conv else 112,
                "concurrency": {"conversations": 12, "hot-prefix": 48}.get(args.scenario, 4),
                "max_num_seqs": {"conversations": 16, "hot-prefix": 8}.get(args.scenario)}
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def costs(factor: float) -> list[str]:
        return ["--mock-step-latency-s", str(args.step_s * factor), "--mock-token-latency-s",
                str(args.token_s * factor), "--mock-seq-latency-s", str(args.seq_s * factor)]

    seqs = ["--max-num-seqs", str(args.max_num_seqs)] if args.max_num_seqs else []
    workers = start_workers(args.workers, *costs(1.0), *seqs, "--max-num-blocks", str(args.kv_blocks),
                            "--block-size", str(BLOCK),
                            extra={0: costs(args.slow_worker)} if args.slow_worker != 1 else None)
    tmp = Path(tempfile.mkdtemp(prefix="router-bench-"))
    versions: dict[str, dict | None] = {"prefix": None}
    if args.baseline_rev:
        # PYTHONSAFEPATH: `python -m` would put the working directory (a checkout: hetero_infer/) first on sys.path.
        versions[f"prefix@{args.baseline_rev}"] = {"PYTHONPATH": source_path(args.baseline_rev, tmp),
                                                   "PYTHONSAFEPATH": "1"}
    labels = [*versions, *(p for p in args.policies if p != "prefix")] if "prefix" in args.policies else \
        [*(v for v in versions if v != "prefix"), *args.policies]
    # The router's defaults (the test helper polls every 0.2 s; the conversations scenario's earlier runs did too).
    router_options = [] if args.scenario == "conversations" else ["--health-interval-s", "1"]
    rows: list[dict] = []
    results: dict = {"scenario": args.scenario, "runs": rows}
    model = ""
    try:
        for run in range(args.runs):
            for i, label in enumerate(labels):
                policy, env = ("prefix", versions[label]) if label in versions else (label, None)
                router = start_router(workers, "--policy", policy, *router_options, env=env, at_once=args.at_once)
                try:
                    model = json.loads(__import__("urllib.request").request.urlopen(router.url + "/v1/models")
                                       .read())["data"][0]["id"]
                    convs = workload(args, salt=1000 + 100 * run + i)
                    if args.text_prompts:
                        convs = as_text(convs)
                    h0, q0 = worker_counters(workers)
                    r = asyncio.run(run_policy(args, router.url, convs, model, [w.url for w in workers]))
                    h1, q1 = worker_counters(workers)
                    routed = samples(router.url, "hetero_infer_router_requests_routed_total")
                    predicted = sum(samples(router.url, "hetero_infer_router_prefix_matched_tokens_total").values())
                    per_worker = [int(sum(v for k, v in routed.items() if w.url in k)) for w in workers]
                    ideal_hit, ideal_query = ideal_hit_tokens([encoded(t) for c in convs for t in c])
                    r.update({"policy": label, "run": run + 1, "hit_rate": (h1 - h0) / max(q1 - q0, 1),
                              "ideal_hit_rate": ideal_hit / ideal_query, "hit_tokens": h1 - h0,
                              "predicted_hit_tokens": predicted, "requests_per_worker": per_worker})
                    rows.append(r)
                    print(f"{label} run {run + 1}: {json.dumps(r)}", flush=True)
                finally:
                    router.stop()
                    if os.environ.get("ROUTER_BENCH_LOGS"):  # the router's log of each run (with its decisions
                        # at HETERO_INFER_ROUTER_LOG_LEVEL=debug)
                        Path(os.environ["ROUTER_BENCH_LOGS"], f"{label}-{run + 1}.log").write_text(router.log())
        if args.overhead_requests:
            results["overhead"] = overhead(args, workers[0], model, versions)
            print(f"overhead: {json.dumps(results['overhead'])}", flush=True)
        if args.stream_tokens:
            results["streaming"] = streaming_cost(args, workers[0], model)
            print(f"streaming: {json.dumps(results['streaming'])}", flush=True)
    finally:
        for w in workers:
            w.stop()
        subprocess.run(["rm", "-rf", str(tmp)], check=False)
    print_tables(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


def print_tables(rows: list[dict]) -> None:
    print("\n| policy | run | hit rate (ideal) | of ideal | TTFT p50 ms | TTFT p99 ms | output tok/s | requests per "
          "worker | mean queue per worker | mean waiting per worker |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['policy']} | {r['run']} | {r['hit_rate']:.3f} ({r['ideal_hit_rate']:.3f}) | "
              f"{r['hit_rate'] / r['ideal_hit_rate']:.0%} | {r['ttft_p50_ms']:.0f} | {r['ttft_p99_ms']:.0f} | "
              f"{r['output_tokens_per_s']:.0f} | {r['requests_per_worker']} | {r['mean_queue_per_worker']} | "
              f"{r['mean_waiting_per_worker']} |")
    print("\n| policy | runs | hit rate min / median | of ideal, min | TTFT p50 ms, median | max queue / mean queue, "
          "worst |")
    print("|---|---|---|---|---|---|")
    for label in dict.fromkeys(r["policy"] for r in rows):
        mine = [r for r in rows if r["policy"] == label]
        hits = [r["hit_rate"] for r in mine]
        ratios = [r["max_queue_over_mean"] for r in mine if r["max_queue_over_mean"] is not None]
        print(f"| {label} | {len(mine)} | {min(hits):.3f} / {statistics.median(hits):.3f} | "
              f"{min(r['hit_rate'] / r['ideal_hit_rate'] for r in mine):.0%} | "
              f"{statistics.median(r['ttft_p50_ms'] for r in mine):.0f} | "
              f"{max(ratios) if ratios else float('nan'):.2f} |")


if __name__ == "__main__":
    sys.exit(main())
