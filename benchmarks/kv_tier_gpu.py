"""The host KV tier on a GPU (issue 40), the GPU check's `kv_tier` phase: the Llama-3-8B shape, dummy bf16 weights.

1. TTFT of a restored prefix against recomputing it: a `--prefix`-token prompt (8k) is computed, evicted from a
   pool that holds about one such prompt by another, then asked again with a short suffix: with the tier its
   blocks are restored (copied from pinned host memory on their own stream), without it they are computed again.
   Target: restored <= 1/3 of recomputed.
2. Decode TPOT while the tier's copies run: `--batch` requests decoding, their step times alone, then while
   requests whose `--restore`-token prefixes sit in the tier arrive (every `--every` steps: each restores its
   blocks and evicts others into the tier, both directions copying behind the decode steps). Target: the mean
   step time of the window with copies within 5% of the one without.

    python benchmarks/kv_tier_gpu.py --json OUT/kv_tier.json

Prints a table and writes the numbers (and whether each target is met) as JSON. Made for CUDA (the copies on
their own streams); `--device cpu` on a small shape runs the same steps (tests/test_gpu_check.py).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def engine(args: argparse.Namespace, tier_gib: float, blocks: int):
    from hetero_infer.contracts.engine_options import EngineConfig
    from hetero_infer.worker.core.engine import LLMEngine

    return LLMEngine(EngineConfig(model=str(ROOT / "benchmarks" / "shapes" / args.shape), load_format="dummy",
                                  dtype=args.dtype, device=args.device, skip_tokenizer_init=True, block_size=16,
                                  max_num_blocks=blocks, max_model_len=args.prefix + 512,
                                  max_num_seqs=max(args.batch + 4, 8), kv_offloading_size=tier_gib,
                                  enable_prefix_caching=True))


def run_one(eng, rid: str, prompt: list[int], max_tokens: int = 1) -> float:
    """Seconds from adding the request to its first token; steps until it ends (others run meanwhile)."""
    from hetero_infer.contracts.sampling_params import SamplingParams

    start = time.perf_counter()
    eng.add_request(rid, None, prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
    first, done = None, False
    while not done:
        for out in eng.step():
            if out.request_id == rid:
                if first is None and out.outputs[0].token_ids:
                    first = time.perf_counter() - start
                done = done or out.finished
    return first if first is not None else time.perf_counter() - start


def synchronize(args: argparse.Namespace) -> None:
    import torch

    if args.device == "cuda":
        torch.cuda.synchronize()


def ttft(args: argparse.Namespace, tier_gib: float) -> dict:
    rng = random.Random(0)
    a = [rng.randrange(100, 4000) for _ in range(args.prefix)]
    b = [rng.randrange(100, 4000) for _ in range(args.prefix)]
    blocks = args.prefix // 16 + 8  # one prompt: b evicts a (all but its leading blocks at most)
    eng = engine(args, tier_gib, blocks)
    run_one(eng, "warm", [rng.randrange(100, 4000) for _ in range(min(512, args.prefix // 2))])
    cold = run_one(eng, "a", a)
    run_one(eng, "b", b)
    synchronize(args)
    again = run_one(eng, "a2", a + [7, 8, 9])
    bm = eng.block_manager
    out = {"tier_gib": tier_gib, "first_s": cold, "again_s": again, "blocks_restored": bm.blocks_restored,
           "host_hits_tokens": bm.host_hits}
    del eng
    return out


def tpot(args: argparse.Namespace) -> dict:
    from hetero_infer.contracts.sampling_params import SamplingParams

    rng = random.Random(1)
    prefixes = [[rng.randrange(100, 4000) for _ in range(args.restore)] for _ in range(args.prefixes)]
    max_tokens = args.steps * 2 + 16 + 4 * args.prefixes  # the warm-up, the fills and both windows
    decode_blocks = args.batch * (-(-(64 + max_tokens) // 16))
    blocks = decode_blocks + args.restore // 16 + 8  # room for the decoders and one prefix
    eng = engine(args, args.tier_gib, blocks)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    for i in range(args.batch):
        eng.add_request(f"dec{i}", None, [rng.randrange(100, 4000) for _ in range(64)], params)
    for _ in range(8):  # the prefills, then steady decodes
        eng.step()
    for i, p in enumerate(prefixes):  # each evicts the one before into the tier
        run_one(eng, f"fill{i}", p)

    def window(arrivals: bool) -> list[float]:
        times = []
        for k in range(args.steps):
            if arrivals and k % args.every == 0:
                p = prefixes[(k // args.every) % len(prefixes)]
                eng.add_request(f"r{k}", None, p + [5, 6], SamplingParams(temperature=0.0, max_tokens=1))
            synchronize(args)
            start = time.perf_counter()
            eng.step()
            synchronize(args)
            times.append(time.perf_counter() - start)
        return times

    restored_before = eng.block_manager.blocks_restored
    alone = window(False)
    with_copies = window(True)
    bm = eng.block_manager
    return {"batch": args.batch, "alone_mean_s": statistics.mean(alone), "alone_p50_s": statistics.median(alone),
            "copies_mean_s": statistics.mean(with_copies), "copies_p50_s": statistics.median(with_copies),
            "copies_max_s": max(with_copies), "blocks_restored": bm.blocks_restored - restored_before,
            "blocks_saved": bm.blocks_saved}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="llama-3-8b")
    p.add_argument("--device", default="cuda", help="cuda (the check); cpu for a smoke run on a small shape")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--prefix", type=int, default=8192, help="the restored prefix of part 1, tokens")
    p.add_argument("--tier-gib", type=float, default=8.0)
    p.add_argument("--batch", type=int, default=32, help="part 2: requests decoding")
    p.add_argument("--steps", type=int, default=100, help="part 2: steps per window")
    p.add_argument("--restore", type=int, default=2048, help="part 2: tokens each arrival restores")
    p.add_argument("--prefixes", type=int, default=8, help="part 2: prefixes that take turns in the tier (more "
                   "than the pool holds beside the decoders)")
    p.add_argument("--every", type=int, default=5, help="part 2: an arrival every this many steps")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    off, on = ttft(args, 0.0), ttft(args, args.tier_gib)
    decode = tpot(args)
    ratio = on["again_s"] / off["again_s"]
    slowdown = decode["copies_mean_s"] / decode["alone_mean_s"]
    result = {"shape": args.shape, "ttft_off": off, "ttft_on": on, "restored_over_recomputed": ratio,
              "ttft_target_met": ratio <= 1 / 3 and on["blocks_restored"] > 0, "decode": decode,
              "decode_copies_over_alone": slowdown, "tpot_target_met": slowdown <= 1.05}
    print(f"| {args.shape}, {args.prefix}-token prefix asked again | TTFT (ms) | blocks restored |")
    print("|---|---:|---:|")
    print(f"| tier off (recomputed) | {off['again_s'] * 1e3:.1f} | {off['blocks_restored']} |")
    print(f"| tier {args.tier_gib:g} GiB (restored) | {on['again_s'] * 1e3:.1f} | {on['blocks_restored']} |")
    print(f"restored / recomputed: {ratio:.3f} (target <= 0.333: {'met' if result['ttft_target_met'] else 'NOT met'})")
    print(f"decode, {args.batch} requests: step {decode['alone_mean_s'] * 1e3:.2f} ms alone, "
          f"{decode['copies_mean_s'] * 1e3:.2f} ms with copies ({decode['blocks_restored']} blocks restored, max step "
          f"{decode['copies_max_s'] * 1e3:.2f} ms): {slowdown:.3f}x (target <= 1.05: "
          f"{'met' if result['tpot_target_met'] else 'NOT met'})")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
