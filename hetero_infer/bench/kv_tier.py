"""Multi-turn conversations with the host KV tier off and on, in one run (docs/benchmarks.md, "Host KV tier").

`python -m hetero_infer.bench.kv_tier`: C conversations x T turns, each history ~H tokens, sent round-robin one
request at a time (as a chat service sees them), through a device pool that holds about two histories, so each
turn's history has been evicted by the time it comes back. Without a tier its prefill is recomputed; with one it
is restored. Prints TTFT (first turn and later turns, p50) and the total time of each system, and whether their
outputs are identical (greedy)."""

from __future__ import annotations

import argparse
import random
import statistics
import time

from hetero_infer import LLM, SamplingParams


def run(tier_gib: float, args: argparse.Namespace) -> dict:
    rng = random.Random(args.seed)
    histories = [[rng.randrange(100, 40000) for _ in range(args.history)] for _ in range(args.conversations)]
    turn_tokens = [[rng.randrange(100, 40000) for _ in range(args.turn_tokens)]
                   for _ in range(args.conversations * args.turns)]
    blocks = 2 * (args.history + args.turns * (args.turn_tokens + args.max_tokens)) // args.block_size + 8
    llm = LLM(args.model, dtype=args.dtype, device=args.device, load_format=args.load_format,
              skip_tokenizer_init=args.load_format == "dummy", block_size=args.block_size, max_num_blocks=blocks,
              kv_offloading_size=tier_gib, enable_prefix_caching=True)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    llm.generate(prompt_token_ids=[[rng.randrange(100, 40000) for _ in range(32)]], sampling_params=params)  # warm
    ttft: dict[int, list[float]] = {t: [] for t in range(args.turns)}
    outputs = []
    start = time.perf_counter()
    for turn in range(args.turns):
        for c, history in enumerate(histories):
            history.extend(turn_tokens[turn * args.conversations + c])
            sent = time.monotonic()  # the engine's clock too (CLOCK_MONOTONIC, one per machine), in its process or not
            (out,) = llm.generate(prompt_token_ids=[list(history)], sampling_params=params)
            ttft[turn].append(out.metrics["first_token_time"] - sent)
            outputs.append(out.outputs[0].token_ids)
            history.extend(out.outputs[0].token_ids)
    total = time.perf_counter() - start
    engine = getattr(llm, "engine", None)
    stats = engine.stats() if engine is not None and hasattr(engine, "stats") else None
    return {"tier_gib": tier_gib, "blocks": blocks, "total_s": total,
            "ttft_first_p50": statistics.median(ttft[0]),
            "ttft_later_p50": statistics.median([x for t in range(1, args.turns) for x in ttft[t]]),
            "host_hits": getattr(stats, "host_prefix_cache_hits_total", None), "outputs": outputs}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default="auto")
    p.add_argument("--load-format", default="auto", help="dummy: random weights from a shape's config.json "
                   "(benchmarks/shapes/), token ids only")
    p.add_argument("--conversations", type=int, default=8)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--history", type=int, default=1500)
    p.add_argument("--turn-tokens", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--tier-gib", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    off, on = run(0.0, args), run(args.tier_gib, args)
    print(f"{args.conversations} conversations x {args.turns} turns, ~{args.history}-token histories, "
          f"device pool {off['blocks']} blocks of {args.block_size}")
    print("| tier | TTFT p50, turn 1 (s) | TTFT p50, turns 2+ (s) | total (s) | tokens restored |")
    print("|---|---:|---:|---:|---:|")
    for r in (off, on):
        print(f"| {r['tier_gib']} GiB | {r['ttft_first_p50']:.3f} | {r['ttft_later_p50']:.3f} | {r['total_s']:.1f} | "
              f"{r['host_hits'] if r['host_hits'] is not None else '-'} |")
    print(f"on / off: TTFT turns 2+ {on['ttft_later_p50'] / off['ttft_later_p50']:.2f}x, total "
          f"{on['total_s'] / off['total_s']:.2f}x; outputs identical: {on['outputs'] == off['outputs']}")


if __name__ == "__main__":
    main()
