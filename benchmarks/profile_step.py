"""Where a steady decode step's time goes on the GPU: torch.profiler over a few engine steps.

Builds the engine on a dummy-weight shape (default benchmarks/shapes/qwen3-0.6b, bf16, token ids), brings
``--requests`` requests with prompts of ``--min-prompt``-``--max-prompt`` tokens to a steady decode state (every
request running, every row a decode), times ``--steps`` steps without the profiler, then profiles as many
(CPU + CUDA activity) and reports, per step:

* the top kernels by device time (name, calls, µs, share of the device's busy time) and the same by group
  (decode attention, matmuls, norms, rotary, KV write, element-wise, copies, sampling);
* the device's busy time (the union of its kernels' intervals) against the step's wall time: the difference is
  the time the device waits for the host; the CUDA-graph launches per step (a replayed graph shows as one
  ``cudaGraphLaunch`` from the host: whether its kernels appear below it depends on CUPTI, so the eager run,
  ``--modes eager``, names them in any case);
* the step's roofline floor: weight bytes + K/V bytes of the batch's contexts at the copy bandwidth measured in
  the same run, overall and per group (attention against the K/V bytes, matmuls against the weight bytes);
* the host's side: as many more steps under cProfile, the Python functions by their own time per step, and
  the host runtime's calls per step (kernel launches, copies, synchronisations): where a host-bound step goes.

``--modes graphs,eager`` (the default) runs each mode in a process of its own (a fresh engine and KV pool) and
merges them into one ``--json``::

    python benchmarks/profile_step.py --json profile.json                      # on a GPU
    python benchmarks/profile_step.py --modes graphs --requests 64 --min-prompt 100 --max-prompt 1024
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
# (group, pattern on the kernel's name), first match wins
GROUPS = [
    ("attention decode", r"_decode_kernel|_decode_reduce"),
    ("attention prefill", r"_prefill_kernel"),
    ("matmul", r"gemm|cutlass|xmma|nvjet|cublas|sm\d+_|splitK|_w8_kernel|_w4_kernel|splitk_reduce"),
    ("rms norm", r"rms_norm|_rmsnorm"),
    ("rotary", r"rotary"),
    ("kv write", r"write_kv"),
    ("silu and mul", r"silu"),
    ("sampling", r"sort|topk|top_k|argmax|softmax|multinomial|exponential|distribution|cumsum|scatter|gather"),
    ("copies", r"^Memcpy|^Memset|copy_kernel|CatArrayBatched"),
    ("element-wise", r"elementwise|vectorized|unrolled|reduce_kernel|fill"),
]


@dataclass
class Event:
    name: str
    cat: str
    ts: float  # µs
    dur: float  # µs

    @property
    def end(self) -> float:
        return self.ts + self.dur


def trace_events(trace: dict) -> list[Event]:
    """The complete ("X") events of a Chrome trace as torch.profiler exports it."""
    return [Event(e["name"], e.get("cat", ""), float(e["ts"]), float(e.get("dur", 0.0)))
            for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "ts" in e]


def busy_us(events: list[Event]) -> float:
    """Length of the union of the events' intervals (kernels of several streams may overlap)."""
    total, end = 0.0, float("-inf")
    for e in sorted(events, key=lambda e: e.ts):
        if e.end <= end:
            continue
        total += e.end - max(e.ts, end)
        end = e.end
    return total


def group_of(name: str) -> str:
    return next((g for g, pattern in GROUPS if re.search(pattern, name)), "other")


def short(name: str, width: int = 90) -> str:
    name = re.sub(r"\s+", " ", name)
    return name if len(name) <= width else name[: width - 3] + "..."


def kernel_table(events: list[Event], steps: int, top: int = 15) -> tuple[list[dict], list[dict]]:
    """(top kernels, groups) by device time per step, each with its share of the device's busy time."""
    device = [e for e in events if e.cat in DEVICE_CATS]
    busy = busy_us(device) or 1.0
    by_name: dict[str, list[float]] = {}
    for e in device:
        by_name.setdefault(e.name, []).append(e.dur)
    rows = sorted(({"name": short(n), "group": group_of(n), "calls": len(d) / steps, "us": sum(d) / steps,
                    "share": sum(d) / busy} for n, d in by_name.items()), key=lambda r: -r["us"])
    groups: dict[str, dict] = {}
    for r in rows:
        g = groups.setdefault(r["group"], {"group": r["group"], "kernels": 0, "calls": 0.0, "us": 0.0, "share": 0.0})
        g["kernels"] += 1
        g["calls"] += r["calls"]
        g["us"] += r["us"]
        g["share"] += r["share"]
    return rows[:top], sorted(groups.values(), key=lambda g: -g["us"])


def step_summary(events: list[Event], steps: int, wall_us: float) -> dict:
    """Per step: the device's busy time, the wall time, the device's idle time, launches of kernels and graphs."""
    device = [e for e in events if e.cat in DEVICE_CATS]
    runtime = [e for e in events if e.cat in ("cuda_runtime", "cuda_driver")]
    busy = busy_us(device) / steps
    wall = wall_us / steps
    return {"steps": steps, "device_busy_us": busy, "wall_us": wall, "device_idle_us": max(wall - busy, 0.0),
            "device_busy_share": busy / wall if wall else None,
            "kernels": sum(e.cat == "kernel" for e in device) / steps,
            "kernel_launches": sum(e.name in ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx",
                                              "cudaLaunchKernelExC") for e in runtime) / steps,
            "graph_launches": sum(e.name in ("cudaGraphLaunch", "cuGraphLaunch") for e in runtime) / steps,
            "sync_us": sum(e.dur for e in runtime if "Synchronize" in e.name) / steps}


def runtime_calls(events: list[Event], steps: int, top: int = 8) -> list[dict]:
    """The CUDA runtime/driver calls per step by name (count, host µs): what the host asks of the device."""
    by: dict[str, list[float]] = {}
    for e in events:
        if e.cat in ("cuda_runtime", "cuda_driver"):
            by.setdefault(e.name, []).append(e.dur)
    rows = [{"name": n, "calls": len(d) / steps, "us": sum(d) / steps} for n, d in by.items()]
    return sorted(rows, key=lambda r: -r["calls"])[:top]


def python_hotspots(step, steps: int, sync=lambda: None, top: int = 20) -> list[dict]:
    """``steps`` calls of ``step`` under cProfile: the functions by their own time per step (µs, calls), and each
    one's cumulative time. cProfile slows Python down about evenly, so the shares are what to read."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    sync()
    prof.enable()
    for _ in range(steps):
        step()
    sync()
    prof.disable()
    stats = pstats.Stats(prof).stats
    total = sum(tt for (_, _, tt, _, _) in stats.values()) or 1.0
    rows = [{"function": f"{Path(file).name}:{line}({fn})", "calls": nc / steps, "self_us": tt / steps * 1e6,
             "cum_us": ct / steps * 1e6, "share": tt / total}
            for (file, line, fn), (_, nc, tt, ct, _) in stats.items()]
    return sorted(rows, key=lambda r: -r["self_us"])[:top]


def floors(hf, dtype, contexts: list[int], copy_bytes_per_s: float) -> dict:
    """The decode step's memory roofline at the copy bandwidth: all of it, the weights', the K/V's (µs)."""
    from hetero_infer.bench.throughput import decode_step_cost

    flops, weight_bytes, kv_bytes = decode_step_cost(hf, dtype, contexts)
    us = 1e6 / copy_bytes_per_s
    return {"batch": len(contexts), "mean_context": sum(contexts) / max(len(contexts), 1),
            "weight_bytes": weight_bytes, "kv_bytes": kv_bytes, "flops": flops,
            "copy_gbs": copy_bytes_per_s / 1e9, "floor_us": (weight_bytes + kv_bytes) * us,
            "weights_floor_us": weight_bytes * us, "kv_floor_us": kv_bytes * us}


def against_floor(summary: dict, groups: list[dict], floor: dict) -> dict:
    """Shares of the floor reached: the step (wall and busy), decode attention (K/V bytes), matmuls (weights)."""
    by = {g["group"]: g["us"] for g in groups}
    out = {"step_wall": floor["floor_us"] / summary["wall_us"] if summary["wall_us"] else None,
           "step_busy": floor["floor_us"] / summary["device_busy_us"] if summary["device_busy_us"] else None}
    out["attention_decode"] = floor["kv_floor_us"] / by["attention decode"] if by.get("attention decode") else None
    out["matmul"] = floor["weights_floor_us"] / by["matmul"] if by.get("matmul") else None
    return out


def format_report(rep: dict) -> str:
    s, f, vs = rep["summary"], rep["floor"], rep["vs_floor"]

    def pct(x):
        return f"{100 * x:.0f}%" if x is not None else "-"

    lines = [f"### {rep['mode']}: {f['batch']} sequences, mean context {f['mean_context']:.0f}, "
             f"{s['steps']} steps profiled",
             "",
             f"step wall {s['wall_us']:.0f} µs (unprofiled {rep['unprofiled_step_us']:.0f} µs), device busy "
             f"{s['device_busy_us']:.0f} µs ({pct(s['device_busy_share'])}), idle {s['device_idle_us']:.0f} µs; "
             f"{s['kernels']:.0f} kernels, {s['kernel_launches']:.0f} kernel launches, "
             f"{s['graph_launches']:.0f} graph launches per step",
             f"floor at {f['copy_gbs']:.0f} GB/s: {f['floor_us']:.0f} µs (weights {f['weights_floor_us']:.0f}, "
             f"K/V {f['kv_floor_us']:.0f}); step at {pct(vs['step_wall'])} of it (busy time: "
             f"{pct(vs['step_busy'])}), decode attention at {pct(vs['attention_decode'])} of the K/V floor, "
             f"matmuls at {pct(vs['matmul'])} of the weights' floor"]
    if s["graph_launches"] and s["kernels"] < 10:  # a decoder layer alone runs more than that
        lines.append("the graph replays' kernels are not in this trace (CUPTI did not report them): the device "
                     "times above are only what ran outside the graphs; the eager run names the kernels")
    lines += ["", "| group | kernels | calls/step | µs/step | % of busy |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {g['group']} | {g['kernels']} | {g['calls']:.0f} | {g['us']:.1f} | {pct(g['share'])} |"
              for g in rep["groups"]]
    lines += ["", "| kernel | group | calls/step | µs/step | % of busy |", "|---|---|---:|---:|---:|"]
    lines += [f"| `{k['name']}` | {k['group']} | {k['calls']:.0f} | {k['us']:.1f} | {pct(k['share'])} |"
              for k in rep["kernels"]]
    if rep.get("runtime"):
        lines += ["", "| host runtime call | calls/step | host µs/step |", "|---|---:|---:|"]
        lines += [f"| `{r['name']}` | {r['calls']:.1f} | {r['us']:.1f} |" for r in rep["runtime"]]
    if rep.get("python"):
        lines += ["", "| Python function (cProfile) | calls/step | self µs/step | cum µs/step | % of self |",
                  "|---|---:|---:|---:|---:|"]
        lines += [f"| `{r['function']}` | {r['calls']:.1f} | {r['self_us']:.0f} | {r['cum_us']:.0f} | "
                  f"{pct(r['share'])} |" for r in rep["python"]]
    return "\n".join(lines)


# -- on the GPU --------------------------------------------------------------------------------------------------
def steady_engine(config, requests: int, min_prompt: int, max_prompt: int, extra_steps: int, seed: int = 0):
    """An engine whose every request is running and decoding."""
    from hetero_infer.bench.throughput import Workload
    from hetero_infer.contracts.sampling_params import SamplingParams
    from hetero_infer.worker.core.engine import LLMEngine
    from hetero_infer.worker.runner.loader import load_hf_config

    engine = LLMEngine(config)
    prompts, _ = Workload(requests, min_prompt, max_prompt, 1, 1, seed).build(
        load_hf_config(Path(config.model)).vocab_size)
    budget = config.max_num_batched_tokens or 2048
    max_tokens = sum(map(len, prompts)) // max(budget - requests, 1) + extra_steps + 64  # never done in the window
    for i, p in enumerate(prompts):
        engine.add_request(f"profile-{i}", None, p, SamplingParams(temperature=0.0, max_tokens=max_tokens,
                                                                    ignore_eos=True))
    for _ in range(100_000):
        engine.step()
        sched = engine.last_schedule
        if sched is not None and len(sched.scheduled) == requests and all(
                not s.seq.is_prefill and s.num_new_tokens == 1 for s in sched.scheduled):
            return engine
    raise RuntimeError("the requests never reached a steady decode state")


def profile_mode(config, args) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from hetero_infer.bench.throughput import copy_bandwidth

    t0 = time.perf_counter()
    engine = steady_engine(config, args.requests, args.min_prompt, args.max_prompt, 3 * args.steps + args.warm_steps)
    ready_s = time.perf_counter() - t0
    for _ in range(args.warm_steps):
        engine.step()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(args.steps):
        engine.step()
    torch.cuda.synchronize()
    unprofiled_us = (time.perf_counter() - t) / args.steps * 1e6
    contexts = [s.seq.num_computed_tokens + 1 for s in engine.last_schedule.scheduled]
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(args.steps):
            engine.step()
        torch.cuda.synchronize()
        wall_us = (time.perf_counter() - t) * 1e6
    python = python_hotspots(engine.step, args.steps, torch.cuda.synchronize, args.top)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.trace) if args.trace else Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = trace_events(json.loads(path.read_text()))
    hf, dtype, device = engine.executor.model.config, engine.executor.dtype, engine.executor.device
    del engine
    import gc

    gc.collect()
    torch.cuda.empty_cache()
    copy_bw = copy_bandwidth(device, 1 << 30 if device.type == "cuda" else 64 << 20)
    kernels, groups = kernel_table(events, args.steps, args.top)
    summary = step_summary(events, args.steps, wall_us)
    floor = floors(hf, dtype, contexts, copy_bw)
    return {"mode": "eager" if config.enforce_eager else "graphs", "device": torch.cuda.get_device_name(device),
            "torch": torch.__version__, "ready_s": round(ready_s, 1), "unprofiled_step_us": unprofiled_us,
            "summary": summary, "floor": floor, "vs_floor": against_floor(summary, groups, floor),
            "groups": groups, "kernels": kernels, "events": len(events),
            "runtime": runtime_calls(events, args.steps), "python": python}


def build_parser() -> argparse.ArgumentParser:
    from hetero_infer.worker.cli_args import add_engine_args

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--min-prompt", type=int, default=800)
    p.add_argument("--max-prompt", type=int, default=1200)
    p.add_argument("--steps", type=int, default=10, help="steps timed, then as many profiled")
    p.add_argument("--warm-steps", type=int, default=5)
    p.add_argument("--top", type=int, default=15, help="kernels in the table")
    p.add_argument("--modes", default="graphs,eager", help="comma-separated: graphs (CUDA graphs), eager")
    p.add_argument("--mode", choices=["graphs", "eager"], help=argparse.SUPPRESS)  # one mode, in this process
    p.add_argument("--trace", help="also keep the Chrome trace here (one mode only)")
    p.add_argument("--json", type=Path, help="the report")
    add_engine_args(p)
    p.set_defaults(model=str(ROOT / "benchmarks" / "shapes" / "qwen3-0.6b"), load_format="dummy",
                   skip_tokenizer_init=True, device="cuda", dtype="bfloat16")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("profile_step: needs a CUDA device (it profiles the engine's kernels on the GPU)", file=sys.stderr)
        return 2
    from hetero_infer.worker.cli_args import engine_config_from_args

    if args.mode:  # one mode in this process: the report as JSON on the last line of stdout
        args.enforce_eager = args.mode == "eager"
        rep = profile_mode(engine_config_from_args(args), args)
        print(format_report(rep), flush=True)
        print("REPORT " + json.dumps(rep), flush=True)
        return 0
    argv = list(sys.argv[1:] if argv is None else argv)
    reports, failed = [], []
    for mode in [m for m in args.modes.split(",") if m]:
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), *argv, "--mode", mode],
                              capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        lines = proc.stdout.splitlines()
        found = [json.loads(line[len("REPORT "):]) for line in lines if line.startswith("REPORT ")]
        print("\n".join(line for line in lines if not line.startswith("REPORT ")), flush=True)
        if proc.returncode or not found:
            failed.append(mode)
            print(f"profile_step --mode {mode} failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}", flush=True)
        reports += found
    if args.json:
        args.json.write_text(json.dumps({"reports": reports, "failed": failed}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
