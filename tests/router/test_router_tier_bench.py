"""`python -m hetero_infer.bench.router_tier`, small: 3 mock workers whose pools hold about two histories behind the
router, multi-turn conversations; with the host tier and a router that scores it, the cluster's hit rate (the
workers' own metrics) is near the workload's ceiling, and far above device pools alone."""

from __future__ import annotations

import argparse

from hetero_infer.bench import router_tier


async def test_the_host_tier_keeps_the_clusters_histories() -> None:
    args = argparse.Namespace(workers=3, conversations=12, turns=4, system_tokens=0, history=384, turn_tokens=64,
                              max_tokens=4, concurrency=3, max_num_seqs=4, tier_gib=0.05, token_latency_s=0.0,
                              step_latency_s=0.0, block_copy_s=0.0, seed=1)
    off = await router_tier.run_system("tier off", 0.0, 0.5, args)
    on = await router_tier.run_system("tier on", 0.05, 0.5, args)
    # the ceiling: every turn after the first hits its whole previous prompt (384, 448, 512 of 448, 512, 576 ...)
    prompts = [args.history + t * args.turn_tokens for t in range(args.turns)]
    ceiling = sum(prompts[:-1]) / sum(prompts)
    assert on.queries == off.queries == args.conversations * sum(prompts)
    assert on.hit_rate >= 0.95 * ceiling, (on, ceiling)
    assert off.hit_rate < 0.5 * on.hit_rate, (off, on)
    assert on.host_hits > on.device_hits
