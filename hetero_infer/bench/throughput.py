"""`hetero-infer bench`: offline throughput on a fixed, seeded workload, beside Hugging Face transformers.

Workload: N requests of random token ids (prompt lengths uniform in [min, max]), a fixed or
uniform number of new tokens, greedy, no early EOS. Peers on the same model, dtype and
workload in the same invocation: transformers' batched `generate` (padded) and its
continuous batching (its manager, each request to its own length). Also reported: the matmul and memory roofline of
our decode steps (measured peaks), the KV-cache slot waste, and the scheduler's CPU time
per step at 256 running sequences (mock executor). On the CPU, for ours: the kernel each layer
type got per row bucket (measured at load, kernels/cpu/select.py), the decode steps' weight
bytes per second against the copy bandwidth (sampled between our steps during the same run, and measured
before it), and how many intervals the thread
governor ran at each thread count. `--contention steady|bursty` runs busy processes beside
every system's run, the same for all (bench/contention.py). `--load-format dummy` runs any model shape from
its config.json alone (benchmarks/shapes/), the transformers peers on the same random weights; with
`--skip-tokenizer-init` no tokenizer files are needed (the workload is token ids anyway).
"""

from __future__ import annotations

import argparse
import functools
import heapq
import json
import os
import platform
import random
import sys
import time
from dataclasses import asdict, dataclass, field

import torch

from hetero_infer.bench.contention import MODES, contention
from hetero_infer.bench.peer_llamacpp import run_llama_cpp
from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.kernels.cpu.threads import base_threads
from hetero_infer.worker.cli_args import add_engine_args, engine_config_from_args

OURS = "hetero-infer"  # the system name of our rows (with the weights' quantization, if any)


@dataclass
class Workload:
    num_requests: int = 32
    min_prompt: int = 32
    max_prompt: int = 256
    min_output: int = 128
    max_output: int = 128
    seed: int = 0

    def build(self, vocab_size: int) -> tuple[list[list[int]], list[int]]:
        rng = random.Random(self.seed)
        lo, hi = min(100, vocab_size // 2), vocab_size - 1
        prompts = [[rng.randint(lo, hi) for _ in range(rng.randint(self.min_prompt, self.max_prompt))]
                   for _ in range(self.num_requests)]
        outputs = [rng.randint(self.min_output, self.max_output) for _ in range(self.num_requests)]
        return prompts, outputs


@dataclass
class Result:
    system: str
    dtype: str
    output_tokens: int
    seconds: float
    extra: dict = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds if self.seconds else 0.0


# -- hardware peaks ----------------------------------------------------------------------
def measure_peaks(dtype: torch.dtype, device: torch.device) -> tuple[float, float]:
    """(matmul FLOP/s in `dtype`, copy bandwidth bytes/s), median of a few timed runs."""
    n = 4096 if device.type == "cuda" else 1024
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    mm = _median_time(lambda: torch.mm(a, b), device)
    return 2 * n**3 / mm, copy_bandwidth(device, 64 << 20 if device.type == "cpu" else 1 << 30)


def copy_bandwidth(device: torch.device, nbytes: int) -> float:
    """Bytes/s of a device-to-device copy of `nbytes` (read + write), the median of a few."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * nbytes / _median_time(lambda: dst.copy_(src), device)


class CopyProbe:
    """The copy bandwidth sampled between our steps (before the first, then at most every `every_s` seconds):
    the machine's memory speed during the run itself. On the shared dev VM one probe taken before a run moved
    between 34 and 55 GB/s within minutes, so a ratio against it said more about that minute than about the
    engine."""

    def __init__(self, device: torch.device, every_s: float = 0.25, nbytes: int = 64 << 20,
                 clock=time.perf_counter) -> None:
        self.device, self.every_s, self.clock = device, every_s, clock
        self.src = torch.ones(nbytes, dtype=torch.uint8, device=device)
        self.dst = torch.empty_like(self.src)
        self.samples: list[float] = []  # bytes/s
        self.spent = 0.0  # seconds spent probing (left out of the run's time)
        self._last: float | None = None

    def maybe(self) -> None:
        """Take one sample if `every_s` has passed since the last."""
        now = self.clock()
        if self._last is not None and now - self._last < self.every_s:
            return
        seconds = _median_time(lambda: self.dst.copy_(self.src), self.device, repeats=1)
        self.samples.append(2 * self.src.numel() / seconds)
        self._last = self.clock()
        self.spent += self._last - now

    def median(self) -> float | None:
        return sorted(self.samples)[len(self.samples) // 2] if self.samples else None


def _median_time(fn, device, repeats: int = 7) -> float:
    fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1000)
        else:
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


# -- ours --------------------------------------------------------------------------------
WASTE_EVERY = 32  # decode steps between two samples of the KV waste (each walks every running block)


def run_ours(config: EngineConfig, prompts, outputs, peaks) -> Result:
    from hetero_infer.contracts.sampling_params import SamplingParams
    from hetero_infer.kernels._backend import triton_compiles
    from hetero_infer.worker.core.engine import LLMEngine

    engine = LLMEngine(config, offline=True)
    _warm_up(engine)
    compiled_before = sum(triton_compiles().values())
    hf = engine.executor.model.config if hasattr(engine.executor, "model") else None
    for i, (p, n) in enumerate(zip(prompts, outputs)):
        engine.add_request(f"bench-{i}", None, p, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True))
    device = torch.device(getattr(engine.executor, "device", "cpu"))  # the mock executor names it as a string
    sync = torch.cuda.synchronize if getattr(device, "type", "cpu") == "cuda" else (lambda: None)
    # No synchronisation per step: with the host/device overlap a step returns once the step before it has
    # finished on the device while the next one runs, so in the steady state each call lasts one device step.
    decode_time = decode_floor = other_time = decode_bytes = 0.0
    weights = getattr(engine.executor, "weight_bytes", None)
    idle_experts = _idle_expert_bytes(engine)
    decode_steps = 0
    step_times: list[tuple[float, int, str]] = []  # (seconds, step, kind) of every step
    waste_samples: list[float] = []
    steps = 0
    probe = CopyProbe(device)
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        probe.maybe()
        t = time.perf_counter()
        outs = engine.step()
        dt = time.perf_counter() - t
        steps += 1
        sched = engine.last_schedule
        decode = sched is not None and sched.scheduled and all(not s.seq.is_prefill and s.num_new_tokens == 1
                                                               for s in sched.scheduled)
        step_times.append((dt, steps, "decode" if decode else "prefill"))
        if not decode:
            other_time += dt
        else:
            decode_time += dt
            decode_steps += 1
            if weights:  # every decode step reads every weight once, but only the experts its tokens route to
                decode_bytes += weights - idle_experts(len(sched.scheduled))
            if hf is not None:
                decode_floor += _decode_floor(hf, engine.executor.dtype, sched, peaks)
            if decode_steps % WASTE_EVERY == 1:  # a walk over every running block: not on each step of the timed loop
                waste_samples.append(engine.kv_waste())
        if any(o.error for o in outs):
            raise RuntimeError(f"benchmark request failed: {next(o.error for o in outs if o.error)}")
    sync()
    elapsed = time.perf_counter() - start - probe.spent
    total = sum(outputs)
    # where the time went: pure decode steps against the rest (prefill and mixed steps, and any step that
    # waited for one), and the slowest steps (a compile or a capture in the run shows there)
    extra = {"steps": steps, "decode_steps": decode_steps, "decode_s": round(decode_time, 3),
             "other_steps": steps - decode_steps, "other_s": round(other_time, 3),
             "slowest_steps": " ".join(f"{kind}#{i}:{1e3 * t:.0f}ms" for t, i, kind in heapq.nlargest(3, step_times))}
    compiles = sum(triton_compiles().values()) - compiled_before
    if compiles:  # Triton kernels compiled inside the timed run: a request of a real server would wait for them
        extra["jit_compiles_in_run"] = compiles
    if decode_time and decode_floor:
        extra["decode_roofline_fraction"] = decode_floor / decode_time
    if waste_samples:
        extra["kv_waste"] = sum(waste_samples) / len(waste_samples)
    if decode_time and weights:
        rate = decode_bytes / decode_time
        during = probe.median()
        extra["decode_weight_gbs"] = rate / 1e9
        if during:
            extra["copy_gbs_during"] = during / 1e9
            extra["copy_samples"] = len(probe.samples)
        extra["weight_gbs_vs_copy"] = rate / (during or peaks[1])  # against the copy speed of the same minutes
        extra["weight_gbs_vs_copy_before"] = rate / peaks[1]
    governor = getattr(engine.executor, "thread_governor", None)
    if governor is not None:
        extra["thread_intervals"] = " ".join(f"{t}:{n}" for t, n in sorted(governor.seen.items()))
    paths = getattr(engine.executor, "cpu_paths", None)
    if paths:
        extra["cpu_paths"] = dict(paths)
    system = OURS + (f" ({config.quantization} weights)" if config.quantization else "")
    return Result(system, str(config.dtype), total, elapsed, extra)


def _warm_up(engine) -> None:
    from hetero_infer.contracts.sampling_params import SamplingParams

    engine.add_request("warmup", None, [100] * 16, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()


def _idle_expert_bytes(engine):
    """rows -> the expert weight bytes a decode step of that many rows leaves unread (0 without MoE layers)."""
    model = getattr(engine.executor, "model", None)
    if model is None:
        return lambda rows: 0.0
    from hetero_infer.worker.runner.models.moe import idle_expert_bytes

    return functools.lru_cache(maxsize=None)(lambda rows: idle_expert_bytes(model, rows))


def _decode_floor(hf, dtype: torch.dtype, sched, peaks) -> float:
    """Lower bound on one decode step's time: max(matmul FLOPs / peak, bytes read / bandwidth)."""
    flops_peak, bandwidth = peaks
    flops, weight_bytes, kv_bytes = decode_step_cost(hf, dtype, [s.seq.num_computed_tokens + 1 for s in sched.scheduled])
    return max(flops / flops_peak, (weight_bytes + kv_bytes) / bandwidth)


def decode_step_cost(hf, dtype: torch.dtype, contexts: list[int]) -> tuple[float, int, int]:
    """(FLOPs, weight bytes, K/V bytes) of one decode step of sequences at these context lengths (the new token
    included): every weight read once (the tied LM head counted once; of a MoE layer's experts, those the step's
    tokens route to under uniform routing, every layer taken as sparse), every cached K/V read once."""
    from hetero_infer.worker.runner.models.moe import experts_hit

    elem = torch.empty((), dtype=dtype).element_size()
    d, layers = hf.hidden_size, hf.num_hidden_layers
    hd = getattr(hf, "head_dim", None) or d // hf.num_attention_heads
    q, kv = hf.num_attention_heads * hd, hf.num_key_value_heads * hd
    dense = layers * (d * (q + 2 * kv) + q * d) + d * hf.vocab_size
    experts = getattr(hf, "num_experts", None) or getattr(hf, "num_local_experts", None)
    if experts:  # Qwen3-MoE, Mixtral: k experts per token, the router
        expert = 3 * d * (getattr(hf, "moe_intermediate_size", None) or hf.intermediate_size)
        k = hf.num_experts_per_tok
        shared = getattr(hf, "shared_expert_intermediate_size", 0) or 0  # Qwen2-MoE: every token's, and its gate
        dense += layers * (d * experts + (3 * d * shared + d if shared else 0))
        mlp_read, mlp_per_token = layers * expert * experts_hit(experts, k, len(contexts)), layers * expert * k
    else:
        mlp_read = mlp_per_token = layers * 3 * d * hf.intermediate_size
    context = sum(contexts)
    flops = 2 * (dense + mlp_per_token) * len(contexts) + 4 * layers * q * context
    return flops, int((dense + mlp_read) * elem), 2 * layers * kv * context * elem


# -- peers -------------------------------------------------------------------------------
def _hf_model(folder, dtype, device, load_format: str = "auto", seed: int = 0):
    """transformers' model of the folder on `device`: its checkpoint, or for `load_format="dummy"` the random
    weights our engine gets from the same config and seed (built on the device, in `dtype`)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if load_format == "dummy":
        from hetero_infer.worker.runner.dummy_weights import fill_hf_model

        with torch.device(device):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), dtype=dtype)
        return fill_hf_model(model, seed).eval()
    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()


def run_hf_generate(folder, dtype, device, prompts, outputs, load_format: str = "auto", seed: int = 0) -> Result:
    model = _hf_model(folder, dtype, device, load_format, seed)
    width = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):  # left padding
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    new = max(outputs)
    with torch.inference_mode():
        model.generate(ids[:1, -8:].to(device), max_new_tokens=2, do_sample=False, pad_token_id=0)
        start = time.perf_counter()
        out = model.generate(ids.to(device), attention_mask=mask.to(device), max_new_tokens=new,
                             min_new_tokens=new, do_sample=False, pad_token_id=0)
        if device.type == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
    produced = (out.shape[1] - width) * len(prompts)
    return Result("transformers generate (padded batch)", str(dtype).replace("torch.", ""), produced, elapsed)


def run_hf_continuous(folder, dtype, device, prompts, outputs, load_format: str = "auto", seed: int = 0,
                      deadline_s: float | None = None) -> Result:
    """transformers' continuous batching on the workload as the engine gets it: each request with its own
    max_new_tokens (no EOS), all submitted at once; the manager's warm-up (CUDA graph captures) before the clock, as
    our engine's start-up is. Past `deadline_s` it raises TimeoutError saying how far it got."""
    from transformers import GenerationConfig
    from transformers.generation.continuous_batching.utils import WorkloadHints

    model = _hf_model(folder, dtype, device, load_format, seed)
    config = GenerationConfig(max_new_tokens=max(outputs), do_sample=False, eos_token_id=-1, pad_token_id=0)
    hints = WorkloadHints(max_prompt_length=max(map(len, prompts)), max_generated_length=max(outputs),
                          num_requests=len(prompts))
    cb_config = None
    if device.type != "cuda":  # sized from free GPU memory there; on the CPU it would take gigabytes it does not need
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        cb_config = ContinuousBatchingConfig()
        page = getattr(cb_config, "page_size", None) or cb_config.block_size  # 5.17 calls it block_size
        cb_config.num_blocks = sum(-(-(len(p) + n) // page) for p, n in zip(prompts, outputs))
        cb_config.max_batch_tokens = max(map(len, prompts)) + len(prompts)
    with model.continuous_batching_context_manager(generation_config=config, block=True, timeout=5,
                                                   continuous_batching_config=cb_config,
                                                   warmup=device.type == "cuda",  # it captures CUDA graphs
                                                   workload_hints=hints) as manager:
        start = time.perf_counter()
        for i, (prompt, n) in enumerate(zip(prompts, outputs)):
            manager.add_request(input_ids=list(prompt), request_id=f"r{i}", max_new_tokens=n, eos_token_id=-1)
        produced, done = 0, 0
        while done < len(prompts):
            elapsed = time.perf_counter() - start
            if deadline_s is not None and elapsed > deadline_s:
                raise TimeoutError(f"transformers continuous batching: {done} of {len(prompts)} requests "
                                   f"({produced} tokens) done in {elapsed:.1f} s")
            result = manager.get_result(timeout=1)
            if result is None:
                if not manager.is_running():
                    raise RuntimeError("transformers continuous batching stopped before the workload finished")
            elif result.is_finished():
                if result.error is not None:
                    raise RuntimeError(f"transformers continuous batching: request {result.request_id}: "
                                       f"{result.error}")
                produced, done = produced + len(result.generated_tokens), done + 1
        elapsed = time.perf_counter() - start
    return Result("transformers continuous batching", str(dtype).replace("torch.", ""), produced, elapsed)


# -- scheduler overhead ------------------------------------------------------------------
def scheduler_overhead(num_seqs: int = 256, steps: int = 200) -> dict[str, float]:
    """CPU time per step with `num_seqs` running sequences on the mock executor (zero latency)."""
    from hetero_infer.contracts.sampling_params import SamplingParams
    from hetero_infer.worker.core.engine import LLMEngine

    engine = LLMEngine(EngineConfig(executor="mock", max_num_seqs=num_seqs, max_num_blocks=num_seqs * 40,
                                    max_num_batched_tokens=num_seqs * 128, max_model_len=2048))
    rng = random.Random(0)
    for i in range(num_seqs):
        prompt = [rng.randint(100, 40000) for _ in range(128)]
        engine.add_request(f"s{i}", None, prompt, SamplingParams(max_tokens=500, ignore_eos=True))
    engine.step()  # prefill everything
    assert len(engine.scheduler.running) == num_seqs
    sched_times, step_times = [], []
    for _ in range(steps):
        t0 = time.process_time()
        engine.step()
        step_times.append(time.process_time() - t0)
        sched_times.append(engine.last_schedule_seconds)
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    return {"running": len(engine.scheduler.running), "schedule_ms": med(sched_times) * 1e3,
            "engine_step_ms": med(step_times) * 1e3}


# -- report ------------------------------------------------------------------------------
def format_table(results: list[Result]) -> str:
    lines = ["| system | dtype | output tokens | seconds | output tok/s | vs best peer |", "|---|---|---|---|---|---|"]
    for dtype in dict.fromkeys(r.dtype for r in results):
        group = [r for r in results if r.dtype == dtype]
        peers = [r.tokens_per_s for r in group if not r.system.startswith(OURS)]
        best = max(peers) if peers else None
        for r in group:
            ratio = f"{r.tokens_per_s / best:.2f}x" if best else "-"
            lines.append(f"| {r.system} | {r.dtype} | {r.output_tokens} | {r.seconds:.2f} | {r.tokens_per_s:.1f} | {ratio} |")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hetero-infer bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-requests", type=int, default=32)
    p.add_argument("--min-prompt", type=int, default=32)
    p.add_argument("--max-prompt", type=int, default=256)
    p.add_argument("--output-len", type=int, default=None, help="fixed new tokens per request (default 128)")
    p.add_argument("--min-output", type=int, default=None)
    p.add_argument("--max-output", type=int, default=None)
    p.add_argument("--workload-seed", type=int, default=0)
    p.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated dtypes to run")
    p.add_argument("--peers", default="hf-generate,hf-cb",
                   help="comma-separated: hf-generate, hf-cb, llama-cpp (optional, needs llama-cpp-python), or none")
    p.add_argument("--contention", choices=MODES, default="none",
                   help="other work on the CPUs during every system's run: none, steady (one busy process), "
                        "bursty (every CPU busy --burst-on seconds, then idle --burst-off seconds)")
    p.add_argument("--burst-on", type=float, default=1.0)
    p.add_argument("--burst-off", type=float, default=1.0)
    p.add_argument("--scheduler-overhead", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--json", dest="json_path", help="also write the results here")
    add_engine_args(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    out_len = args.output_len or 128
    workload = Workload(args.num_requests, args.min_prompt, args.max_prompt,
                        args.min_output or out_len, args.max_output or out_len, args.workload_seed)
    peers = [] if args.peers == "none" else [p for p in args.peers.split(",") if p]
    unknown = set(peers) - {"hf-generate", "hf-cb", "llama-cpp"}
    if unknown:
        print(f"hetero-infer bench: unknown peer(s) {', '.join(sorted(unknown))}", file=sys.stderr)
        return 2
    from hetero_infer.model_source import ModelSourceError
    from hetero_infer.worker.runner.executor import resolve_device
    from hetero_infer.worker.runner.loader import load_hf_config, resolve_model

    try:
        base = engine_config_from_args(args)
    except ValueError as exc:
        print(f"hetero-infer bench: error: {exc}", file=sys.stderr)
        return 2
    try:
        folder, name = resolve_model(base.model, base.load_format)
    except (ModelSourceError, FileNotFoundError, ValueError) as exc:
        print(f"hetero-infer bench: error: {exc}", file=sys.stderr)
        return 2
    vocab = load_hf_config(folder).vocab_size
    prompts, outputs = workload.build(vocab)
    device = resolve_device(base.device)
    results: list[Result] = []
    report: dict = {"model": name, "device": _device_name(device), "torch": torch.__version__,
                    "workload": asdict(workload), "threads": base_threads(),
                    "contention": args.contention, "load_format": base.load_format}
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        peaks = measure_peaks(dtype, device)
        report.setdefault("peaks", {})[dtype_name] = {"matmul_gflops": peaks[0] / 1e9, "copy_gbs": peaks[1] / 1e9}
        config = EngineConfig.from_dict({**base.to_dict(), "dtype": dtype_name, "model": str(folder),
                                         "served_model_name": name})
        busy = functools.partial(contention, args.contention, args.burst_on, args.burst_off)
        with busy():
            ours = run_ours(config, prompts, outputs, peaks)
        _release_memory(device)  # the engine's weights and KV pool, before a peer loads its own
        ours.dtype = dtype_name
        results.append(ours)
        peer_weights = (base.load_format, base.seed)
        if "hf-generate" in peers:
            with busy():
                results.append(run_hf_generate(folder, dtype, device, prompts, outputs, *peer_weights))
            _release_memory(device)
        if "hf-cb" in peers:
            with busy():
                results.append(run_hf_continuous(folder, dtype, device, prompts, outputs, *peer_weights))
            _release_memory(device)
        if "llama-cpp" in peers and base.load_format == "dummy":
            print("llama-cpp: skipped (it reads the model's GGUF weights; --load-format dummy has none)",
                  file=sys.stderr)
        elif "llama-cpp" in peers:  # optional peer: skipped with a message when unavailable
            with busy():
                peer, why = run_llama_cpp(folder, dtype_name, prompts, outputs, base_threads())
            if peer is None:
                print(why, file=sys.stderr)
            else:
                results.append(peer)
        print(format_table(results), flush=True)
    report["results"] = [{**asdict(r), "tokens_per_s": r.tokens_per_s} for r in results]
    print()
    weights = " (dummy weights)" if base.load_format == "dummy" else ""
    print(f"model {name}{weights} on {report['device']}, torch {torch.__version__}, {base_threads()} threads; "
          f"{workload.num_requests} requests, prompts {workload.min_prompt}-{workload.max_prompt}, "
          f"outputs {workload.min_output}-{workload.max_output}, greedy, seed {workload.seed}; "
          f"contention {args.contention}")
    print(format_table(results))
    for r in results:
        if r.extra:
            bits = ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in r.extra.items()
                             if k != "cpu_paths")
            print(f"{r.system} [{r.dtype}]: {bits}")
        for layer, path in r.extra.get("cpu_paths", {}).items():
            print(f"  {r.dtype} {layer}: {path}")
    for dtype_name, pk in report.get("peaks", {}).items():
        print(f"measured peaks [{dtype_name}]: matmul {pk['matmul_gflops']:.0f} GFLOP/s, copy {pk['copy_gbs']:.1f} GB/s")
    if args.scheduler_overhead:
        report["scheduler"] = scheduler_overhead()
        s = report["scheduler"]
        print(f"scheduler at {s['running']} running sequences (mock executor): schedule() {s['schedule_ms']:.3f} ms, "
              f"whole engine step {s['engine_step_ms']:.3f} ms CPU time (median)")
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(report, f, indent=2)
    return 0


def _release_memory(device: torch.device) -> None:
    """Free what the last system's run left (its objects hold cycles), so the next one gets the device."""
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), name)
    except OSError:
        pass
    return f"{name} CPU ({os.cpu_count()} cores, {torch.get_num_threads()} threads)"

