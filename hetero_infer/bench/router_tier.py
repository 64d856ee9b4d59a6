"""The cluster's prefix hit rate through the router, host KV tier off and on, in one run (docs/benchmarks.md,
"Router and host KV tier").

`python -m hetero_infer.bench.router_tier`: 3 workers (mock executor, with its modelled costs: compute per token,
`--mock-block-copy-s` per block moved to or from the host tier) whose device pools each hold about two
conversations' histories, behind the router (prefix policy; the workers publish KV events, the router follows
them). C multi-turn conversations (a shared system prompt, then each its own history, growing by an assistant
answer and a user message per turn) are sent turn by turn, round-robin over the conversations, a few at once.
Each system is fresh workers and a fresh router:

- tier off: device pools only (a history evicted before its conversation comes back is computed again);
- tier on: `--kv-offloading-size` on every worker, the router scoring host-tier hits (`--host-hit-weight` 0.5);
- tier on, blind router: the same workers, the router ignoring host tiers (`--host-hit-weight 0`).

The hit rate is the workers' own metrics, summed over the cluster: (`vllm:prefix_cache_hits` +
`vllm:external_prefix_cache_hits`) / `vllm:prefix_cache_queries`, tokens. Also printed: each tier's share,
TTFT p50 of turns 2+ (streamed, first chunk), and the total time."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from dataclasses import dataclass

import aiohttp
from aiohttp import web

BLOCK = 16
SYSTEMS = (("tier off", 0.0, 0.5), ("tier on", None, 0.5), ("tier on, blind router", None, 0.0))


@dataclass
class Result:
    name: str
    queries: float
    device_hits: float
    host_hits: float
    ttft_later_p50: float
    total_s: float

    @property
    def hit_rate(self) -> float:
        return (self.device_hits + self.host_hits) / self.queries if self.queries else 0.0


def conversations(args: argparse.Namespace) -> list[list[list[int]]]:
    """Per conversation, the prompt (token ids) of each turn."""
    rng = random.Random(args.seed)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(100, 30000) for _ in range(n)]

    system = tokens(args.system_tokens)
    out = []
    for _ in range(args.conversations):
        history = system + tokens(args.history)
        turns = []
        for _ in range(args.turns):
            turns.append(list(history))
            history += tokens(args.turn_tokens)  # the assistant's answer and the next user message
        out.append(turns)
    return out


def metric_sum(text: str, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


async def run_system(name: str, tier_gib: float, host_weight: float, args: argparse.Namespace) -> Result:
    from hetero_infer.contracts.engine_options import EngineConfig
    from hetero_infer.contracts.router_options import RouterOptions
    from hetero_infer.contracts.server_options import ServerOptions
    from hetero_infer.router.app import Router, make_runner
    from hetero_infer.router.app import create_app as router_app
    from hetero_infer.worker.core.engine import LLMEngine
    from hetero_infer.worker.server.app import create_app
    from hetero_infer.worker.server.state import ServerState

    longest = args.system_tokens + args.history + (args.turns - 1) * args.turn_tokens + args.max_tokens
    pool_blocks = 2 * (-(-longest // BLOCK)) + args.max_num_seqs  # about two histories, and a block per sequence
    events = json.dumps({"enable_kv_cache_events": True, "endpoint": "tcp://127.0.0.1:*", "topic": "kv"})
    runners, clients, urls, models = [], [], [], []
    for _ in range(args.workers):
        engine = LLMEngine(EngineConfig(
            executor="mock", max_model_len=longest + BLOCK, max_num_blocks=pool_blocks, max_num_seqs=args.max_num_seqs,
            kv_offloading_size=tier_gib, kv_events_config=events, mock_token_latency_s=args.token_latency_s,
            mock_step_latency_s=args.step_latency_s, mock_block_copy_s=args.block_copy_s))
        models.append(engine.model_name)
        state = ServerState(ServerOptions(access_log=False))
        runner = web.AppRunner(create_app(state))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        clients.append(state.start_engine(engine, max_num_seqs=args.max_num_seqs))
        runners.append(runner)
        urls.append(f"http://127.0.0.1:{runner.addresses[0][1]}")
    router = Router(RouterOptions(worker=urls, tokenizer="none", block_size=BLOCK, health_interval_s=0.2,
                                  host_hit_weight=host_weight))
    router_runner = make_runner(router_app(router))
    await router_runner.setup()
    await web.TCPSite(router_runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{router_runner.addresses[0][1]}"
    try:
        deadline = time.monotonic() + 60
        while not (len(router.pool.ready()) == args.workers and len(router.pool.feeds) == args.workers
                   and all(f.live for f in router.pool.feeds.values())):
            if time.monotonic() > deadline:
                raise RuntimeError("the workers did not become ready behind the router")
            await asyncio.sleep(0.05)
        model = models[0]
        convs = conversations(args)
        ttft: list[float] = []
        async with aiohttp.ClientSession() as session:
            async def ask(prompt: list[int], later: bool) -> None:
                body = {"model": model, "prompt": prompt, "max_tokens": args.max_tokens, "stream": True}
                sent = time.perf_counter()
                async with session.post(url + "/v1/completions", json=body) as r:
                    if r.status != 200:
                        raise RuntimeError(f"{r.status}: {await r.text()}")
                    first = None
                    async for _ in r.content:
                        if first is None:
                            first = time.perf_counter() - sent
                if later and first is not None:
                    ttft.append(first)

            gate = asyncio.Semaphore(args.concurrency)

            async def gated(prompt: list[int], later: bool) -> None:
                async with gate:
                    await ask(prompt, later)

            start = time.perf_counter()
            for turn in range(args.turns):
                await asyncio.gather(*(gated(c[turn], turn > 0) for c in convs))
            total = time.perf_counter() - start
            texts = []
            for u in urls:
                async with session.get(u + "/metrics") as r:
                    texts.append(await r.text())
        return Result(name, sum(metric_sum(t, "vllm:prefix_cache_queries_total") for t in texts),
                      sum(metric_sum(t, "vllm:prefix_cache_hits_total") for t in texts),
                      sum(metric_sum(t, "vllm:external_prefix_cache_hits_total") for t in texts),
                      statistics.median(ttft) if ttft else float("nan"), total)
    finally:
        await router_runner.cleanup()
        for c in clients:
            c.shutdown()
        for r in runners:
            await r.cleanup()


async def run_all(args: argparse.Namespace) -> list[Result]:
    return [await run_system(name, args.tier_gib if gib is None else gib, weight, args)
            for name, gib, weight in SYSTEMS]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--conversations", type=int, default=12)
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--system-tokens", type=int, default=0, help="a system prompt all conversations share (the "
                   "prefix policy then gathers the first turns on the worker that holds it)")
    p.add_argument("--history", type=int, default=1536, help="each conversation's own first turn")
    p.add_argument("--turn-tokens", type=int, default=128, help="an answer and a user message, per turn")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=3)
    p.add_argument("--max-num-seqs", type=int, default=4)
    p.add_argument("--tier-gib", type=float, default=0.5, help="each worker's --kv-offloading-size in the tier-on "
                   "systems (the mock's blocks are the default model's size: 360 KiB of 16 tokens)")
    p.add_argument("--token-latency-s", type=float, default=50e-6, help="mock: compute per token")
    p.add_argument("--step-latency-s", type=float, default=2e-3, help="mock: per step")
    p.add_argument("--block-copy-s", type=float, default=15e-6, help="mock: per block moved to or from the tier "
                   "(360 KiB at ~25 GB/s)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    results = asyncio.run(run_all(args))
    longest = args.system_tokens + args.history + (args.turns - 1) * args.turn_tokens
    print(f"{args.workers} workers, {args.conversations} conversations x {args.turns} turns (histories "
          f"{args.system_tokens + args.history}-{longest} tokens, {args.system_tokens} shared), device pools of about "
          f"two histories, {args.concurrency} requests at once")
    print("| system | cluster hit rate | device hits | host hits | TTFT p50, turns 2+ (ms) | total (s) |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r.name} | {r.hit_rate:.3f} | {r.device_hits / r.queries:.3f} | {r.host_hits / r.queries:.3f} | "
              f"{r.ttft_later_p50 * 1000:.1f} | {r.total_s:.1f} |")


if __name__ == "__main__":
    main()
