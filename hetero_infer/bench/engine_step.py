"""The engine core's host cost per step and its throughput on the mock executor, beside another checkout of this
repository measured in the same minutes (interleaved, each measurement in a fresh process).

    python -m hetero_infer.bench.engine_step --baseline /tmp/base    # git worktree add /tmp/base <commit>
    python -m hetero_infer.bench.engine_step --baseline /tmp/base --device-ms 0 --rounds 6 --steps 400

Each measurement (one tree, one configuration) runs in a process of its own, the trees alternating within each
round and configuration (which goes first alternates from round to round), so that a change in the machine's load
falls on both trees alike; the ratios are the median of the per-round ratios.

For each number of running sequences (`--running`, default 1, 32, 256: 128-token prompts, greedy, no EOS) and
each modelled device time per step (`--device-ms`, default 0 and 4: the mock executor's step latency), the engine
is stepped as the busy loop steps it (`LLMEngine.step_deltas`, the engine core's loop in the engine process)
for `--steps` decode steps after the prefill. Reported: host time per step (wall time of a step where the device
takes 0 ms: all of it is host work), main-thread CPU time per step, and generated tokens per second. Each tree
runs `--rounds` times, alternating which goes first; the table shows medians and the median of the per-round
ratios. Where the checkout's engine leaves the text to the frontend, the frontend's cost of making it
(`DeltaDetokenizer.fill`, per token) is measured too: in the server's process mode that work runs in the API
process, beside the engine core's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def measure(running: int, device_ms: float, steps: int) -> dict[str, float]:
    """One configuration, in this process (whatever `hetero_infer` it imports)."""
    import random

    from hetero_infer import SamplingParams  # (every checkout has this name)
    from hetero_infer.contracts.engine_options import EngineConfig
    from hetero_infer.worker.core.engine import LLMEngine

    engine = LLMEngine(EngineConfig(executor="mock", max_num_seqs=running, max_num_blocks=running * 40 + 64,
                                    max_num_batched_tokens=max(running * 128, 2048), max_model_len=2048,
                                    mock_step_latency_s=device_ms / 1000))
    rng = random.Random(0)
    prompts = [[rng.randint(100, 40000) for _ in range(128)] for _ in range(running)]
    params = SamplingParams(max_tokens=steps + 64, ignore_eos=True, temperature=0.0)
    from hetero_infer.worker.frontend.gc_freeze import freeze_startup_objects

    freeze_startup_objects()  # as the engine process does once loaded
    for i, prompt in enumerate(prompts):
        engine.add_request(f"s{i}", None, prompt, params)
    deltas = []
    for _ in range(8):  # the prefill, then a few decode steps
        deltas += engine.step_deltas()
    wall, cpu, tokens = [], [], 0
    t0 = time.perf_counter()
    for _ in range(steps):
        w, c = time.perf_counter(), time.thread_time()
        out = engine.step_deltas()
        wall.append(time.perf_counter() - w)
        cpu.append(time.thread_time() - c)
        tokens += sum(len(s.token_ids) for d in out for s in d.samples)
        if len(deltas) < 4 * running:
            deltas += out
    elapsed = time.perf_counter() - t0
    result = {"host_ms": statistics.median(wall) * 1e3, "cpu_ms": statistics.median(cpu) * 1e3,
              "tokens_per_s": tokens / elapsed}
    try:  # the frontend's text, where the engine leaves it to the frontend
        from hetero_infer.worker.core.detokenizer import DeltaDetokenizer
    except ImportError:
        return result
    text = DeltaDetokenizer(engine.tokenizer)
    for i, prompt in enumerate(prompts):
        text.add(f"s{i}", prompt, params)
    n = sum(len(s.token_ids) for d in deltas for s in d.samples)
    c = time.thread_time()
    for d in deltas:
        text.fill(d)
    result["frontend_text_us_per_token"] = (time.thread_time() - c) / max(n, 1) * 1e6
    return result


def _worker(spec: str) -> None:
    import hetero_infer

    args = json.loads(spec)
    out = {"tree": os.path.dirname(os.path.dirname(os.path.realpath(hetero_infer.__file__))), "results": []}
    for running, device_ms in args["configs"]:
        out["results"].append([running, device_ms, measure(running, device_ms, args["steps"])])
    print("RESULT " + json.dumps(out))


def run_tree(pythonpath: str | None, configs: list[tuple[int, float]], steps: int) -> dict:
    """Measure `configs` in one fresh process importing the tree at `pythonpath` (None: this one)."""
    return run_in_tree(os.path.abspath(__file__), pythonpath, {"configs": configs, "steps": steps})


def run_in_tree(script: str, pythonpath: str | None, spec: dict) -> dict:
    """Run `script --worker SPEC` in a fresh process that imports `hetero_infer` from `pythonpath` (None: this
    one); the JSON it prints after "RESULT "."""
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    env["TQDM_DISABLE"] = "1"
    proc = subprocess.run([sys.executable, script, "--worker", json.dumps(spec)],
                          env=env, cwd=tempfile.gettempdir(), capture_output=True, text=True, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"the measurement failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hetero_infer.bench.engine_step", description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", metavar="CHECKOUT", help="another checkout of this repository to measure beside "
                   "this one (`git worktree add /tmp/base <commit>`)")
    p.add_argument("--running", default="1,32,256", help="running sequences, comma-separated")
    p.add_argument("--device-ms", default="0,4", help="modelled device time per step (ms), comma-separated")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--output-json")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        _worker(args.worker)
        return 0

    from hetero_infer.bench.overhead import importable_checkout

    configs = [(int(r), float(d)) for d in args.device_ms.split(",") for r in args.running.split(",")]
    trees: dict[str, str | None] = {"this": None}
    tmp = tempfile.mkdtemp(prefix="hetero-infer-engine-step-")
    if args.baseline:
        trees["baseline"] = importable_checkout(args.baseline, tmp)
    # runs[tree][config index]: one measurement a round
    runs: dict[str, list[list[dict]]] = {name: [[] for _ in configs] for name in trees}
    for r in range(args.rounds):
        order = list(trees.items())
        for i, config in enumerate(configs):
            for name, path in order if r % 2 == 0 else order[::-1]:
                out = run_tree(path, [config], args.steps)
                result = out["results"][0][2]
                runs[name][i].append(result)
                print(f"round {r + 1}/{args.rounds}, {config[0]} running, {config[1]:g} ms: {name} "
                      f"({out['tree']}) host {result['host_ms']:.4f} ms/step", file=sys.stderr)

    def values(name: str, i: int, key: str) -> list[float]:
        return [result[key] for result in runs[name][i]]

    def ratio(i: int, key: str) -> float:
        return statistics.median(a / b for a, b in zip(values("this", i, key), values("baseline", i, key)))

    cols = list(trees)
    print(f"\nmock executor, 128-token prompts, greedy, {args.steps} decode steps per measurement (one process "
          f"each), median of {args.rounds} rounds{' (interleaved with the baseline)' if args.baseline else ''}, "
          f"{os.cpu_count()} CPUs\n")
    head = "| running | device ms/step | " + " | ".join(f"{c}: host ms/step | {c}: CPU ms/step | {c}: tok/s"
                                                     for c in cols)
    if args.baseline:
        head += " | host ms/step vs baseline (median of rounds) | CPU ms/step vs baseline | tok/s vs baseline |"
    print(head)
    print("|" + "---|" * (2 + 3 * len(cols) + (3 if args.baseline else 0)))
    for i, (running, device_ms) in enumerate(configs):
        row = f"| {running} | {device_ms:g} | "
        row += " | ".join(f"{statistics.median(values(c, i, 'host_ms')):.4f} | "
                          f"{statistics.median(values(c, i, 'cpu_ms')):.4f} | "
                          f"{statistics.median(values(c, i, 'tokens_per_s')):,.0f}" for c in cols)
        if args.baseline:
            row += f" | {ratio(i, 'host_ms'):.3f}x | {ratio(i, 'cpu_ms'):.3f}x | {ratio(i, 'tokens_per_s'):.3f}x"
        print(row + " |")
    text = [result.get("frontend_text_us_per_token") for per_config in runs["this"] for result in per_config]
    text = [t for t in text if t is not None]
    if text:
        print(f"\nthis tree's frontend text (DeltaDetokenizer.fill, off the engine loop): "
              f"{statistics.median(text):.2f} µs CPU per token (median)")
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump({"configs": configs, "runs": runs}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
