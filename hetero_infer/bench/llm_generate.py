"""`LLM.generate` throughput on the mock executor, beside another checkout of this repository measured in the same
minutes (interleaved, each measurement in a fresh process), and the start-up time of `LLM()`.

    python -m hetero_infer.bench.llm_generate --baseline /tmp/base    # git worktree add /tmp/base <commit>

For each modelled device time per step (`--device-ms`, default 0 and 4: the mock executor's step latency), one
process per tree builds `LLM(executor="mock", ...)`, generates for 16 prompts (warm-up), then times one
`LLM.generate` of `--num-seqs` prompts of `--input-len` random token ids, `--output-len` new tokens each (greedy,
no EOS): output tokens per second of that call's wall time, text included. This tree runs with the engine in its
own process (the default) and, as a second column, in the caller's process (`engine_process=False`); a checkout
whose `LLM` has no such choice runs as it does. `--rounds` rounds alternate which tree goes first; the table shows
medians and the median of the per-round ratios against the baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile


def measure(num_seqs: int, input_len: int, output_len: int, device_ms: float,
            engine_process: bool | None) -> dict[str, float]:
    """One measurement in this process (whatever `hetero_infer` it imports); `engine_process` None: the LLM's own
    way (a checkout without the option)."""
    import random
    import time

    t0 = time.perf_counter()
    from hetero_infer import LLM, SamplingParams

    kwargs = {} if engine_process is None else {"engine_process": engine_process}
    llm = LLM(executor="mock", max_num_seqs=num_seqs, max_num_blocks=num_seqs * ((input_len + output_len) // 16 + 2),
              max_model_len=2048, mock_step_latency_s=device_ms / 1000, **kwargs)
    startup = time.perf_counter() - t0
    rng = random.Random(0)
    prompts = [[rng.randint(100, 40000) for _ in range(input_len)] for _ in range(num_seqs)]
    params = SamplingParams(max_tokens=output_len, ignore_eos=True, temperature=0.0)
    llm.generate(prompt_token_ids=prompts[:16], sampling_params=params)
    t = time.perf_counter()
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=params)
    elapsed = time.perf_counter() - t
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    if tokens != num_seqs * output_len or not all(o.outputs[0].text for o in outs):
        raise RuntimeError(f"generated {tokens} tokens, some without text: not the workload")
    if hasattr(llm, "shutdown"):
        llm.shutdown()
    return {"tokens_per_s": tokens / elapsed, "seconds": elapsed, "startup_s": startup}


def _worker(spec: str) -> None:
    import hetero_infer

    args = json.loads(spec)
    out = {"tree": os.path.dirname(os.path.dirname(os.path.realpath(hetero_infer.__file__))),
           "result": measure(*args["measure"])}
    print("RESULT " + json.dumps(out))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hetero_infer.bench.llm_generate", description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", metavar="CHECKOUT", help="another checkout of this repository to measure beside "
                   "this one (`git worktree add /tmp/base <commit>`)")
    p.add_argument("--num-seqs", type=int, default=256)
    p.add_argument("--input-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--device-ms", default="0,4", help="modelled device time per step (ms), comma-separated")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--output-json")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        _worker(args.worker)
        return 0

    # (the worker runs this file against the other tree's `hetero_infer`: nothing of this one's at the top)
    from hetero_infer.bench.engine_step import run_in_tree
    from hetero_infer.bench.overhead import importable_checkout

    # (column, tree's PYTHONPATH, engine_process)
    columns: list[tuple[str, str | None, bool | None]] = [("engine process", None, True), ("in process", None, False)]
    if args.baseline:
        columns.append(("baseline", importable_checkout(args.baseline, tempfile.mkdtemp(prefix="hetero-infer-llm-")),
                        None))
    device_ms = [float(d) for d in args.device_ms.split(",")]
    runs: dict[str, dict[float, list[dict]]] = {c: {d: [] for d in device_ms} for c, _, _ in columns}
    for r in range(args.rounds):
        for d in device_ms:
            for name, path, engine_process in columns if r % 2 == 0 else columns[::-1]:
                spec = {"measure": [args.num_seqs, args.input_len, args.output_len, d, engine_process]}
                out = run_in_tree(os.path.abspath(__file__), path, spec)
                runs[name][d].append(out["result"])
                print(f"round {r + 1}/{args.rounds}, {d:g} ms: {name} ({out['tree']}) "
                      f"{out['result']['tokens_per_s']:,.0f} tok/s", file=sys.stderr)

    def values(name: str, d: float, key: str) -> list[float]:
        return [m[key] for m in runs[name][d]]

    names = [c for c, _, _ in columns]
    print(f"\nLLM.generate, mock executor, {args.num_seqs} sequences, {args.input_len}-token prompts, "
          f"{args.output_len} new tokens, greedy, median of {args.rounds} rounds"
          f"{' (interleaved with the baseline)' if args.baseline else ''}, {os.cpu_count()} CPUs\n")
    head = "| device ms/step | " + " | ".join(f"{c}: tok/s" for c in names)
    if args.baseline:
        head += " | " + " | ".join(f"{c} vs baseline (median of rounds)" for c in names[:-1])
    print(head + " |")
    print("|" + "---|" * (1 + len(names) + (len(names) - 1 if args.baseline else 0)))
    for d in device_ms:
        row = f"| {d:g} | " + " | ".join(f"{statistics.median(values(c, d, 'tokens_per_s')):,.0f}" for c in names)
        if args.baseline:
            row += " | " + " | ".join(
                f"{statistics.median(a / b for a, b in zip(values(c, d, 'tokens_per_s'), values('baseline', d, 'tokens_per_s'))):.2f}x"
                for c in names[:-1])
        print(row + " |")
    print("\n`LLM()` start-up (s, median over every measurement): " + ", ".join(
        f"{c} {statistics.median(m['startup_s'] for d in device_ms for m in runs[c][d]):.2f}" for c in names))
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump({c: {str(d): v for d, v in per.items()} for c, per in runs.items()}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
