"""LoRA adapters mixed in one batch against the base model alone, in one run (docs/benchmarks.md, "LoRA adapters").

`python -m hetero_infer.bench.lora`: one engine (`enable_lora`, `max_loras` = the adapters), N random adapters of
rank R on every attention and MLP projection (PEFT folders written here), a batch of S sequences (greedy, fixed
lengths) run alternately by the base model alone and with the adapters spread over it (sequence i under adapter
i mod N); prints each run's tokens/s, the best of each system and their ratio, each round's ratio (the LoRA run
against the base run just before it, which shared the machine's load) and their median, and the time to read a rank-R
adapter from its folder and copy it into a device slot. `--load-format dummy --model benchmarks/shapes/<shape>`
runs any shape on random weights (the GPU check's LoRA phase).
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

import torch

from hetero_infer import LLM, LoRARequest, SamplingParams

PROJECTIONS = {"self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"), "mlp": ("gate_proj", "up_proj", "down_proj")}


def write_adapter(folder: Path, config, rank: int, seed: int, moe: bool = False, b_std: float = 0.01,
                  targets: tuple[str, ...] | None = None) -> Path:
    """A PEFT LoRA folder for a model of `config` on `targets` (None: every projection; attention only for MoE),
    random A and B."""
    from safetensors.torch import save_file

    from hetero_infer.worker.runner.lora.adapter import ModelShapes

    shapes = ModelShapes.of(config, moe)
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(config.num_hidden_layers):
        for part, names in PROJECTIONS.items():
            for name in names:
                if name not in shapes.projections or (targets and name not in targets):
                    continue
                n_in, n_out = shapes.projections[name]
                key = f"base_model.model.model.layers.{layer}.{part}.{name}"
                tensors[f"{key}.lora_A.weight"] = torch.randn(rank, n_in, generator=g) * n_in**-0.5
                tensors[f"{key}.lora_B.weight"] = torch.randn(n_out, rank, generator=g) * b_std
    folder.mkdir(parents=True, exist_ok=True)
    targets = sorted({k.split(".")[-3] for k in tensors})
    (folder / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": targets, "bias": "none"}))
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    return folder


PROBE_REPS = 15


def fused_step_probe(executor, names: list[str]) -> dict[str, float] | None:
    """Where the CPU runs decode steps in the fused C step: one decode step of one row per entry of `names` (the
    adapter of that row, all resident after the runs), timed alone with and without the adapters (ms, medians);
    None elsewhere."""
    import numpy as np

    stack, lora = executor.cpu_decode, executor.lora
    rows = len(names)
    if stack is None or not stack.accepts(rows, rows):
        return None
    input_ids, meta = stack.probe_step(rows)
    mapping, loads = lora.slots.assign(names)
    for name, slot in loads:
        lora.load_slot(slot, name)

    def median_ms(adapters: bool) -> float:
        times = []
        for _ in range(PROBE_REPS + 1):
            start = time.perf_counter()
            stack.run(input_ids, meta, lora.c_step() if adapters else None)
            times.append(time.perf_counter() - start)
        return 1e3 * sorted(times[1:])[PROBE_REPS // 2]

    with torch.inference_mode():
        lora.activate(np.array([mapping[n] for n in names], dtype=np.int32))
        try:
            timings = {"base": median_ms(False), "lora": median_ms(True)}
        finally:
            lora.end_step()
    return timings


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="default: the default model (SmolLM2-135M-Instruct)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--load-format", default="auto")
    p.add_argument("--adapters", type=int, default=8)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--targets", default="all", help="all: every attention and MLP projection; or a comma-separated "
                   "list, e.g. q_proj,v_proj (PEFT's default for Llama)")
    p.add_argument("--seqs", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2, help="base and LoRA runs alternate this many times each")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    p.add_argument("--enforce-eager", action="store_true", help="CUDA: no CUDA graphs (base and LoRA decode steps "
                   "eager), to measure what the graphs bring")
    p.add_argument("--json", default=None, help="also write the results here")
    return p


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)

    dummy = args.load_format == "dummy"
    llm = LLM(args.model, device=args.device, dtype=args.dtype, load_format=args.load_format,
              skip_tokenizer_init=dummy, enable_lora=True, max_loras=args.adapters, max_lora_rank=args.rank,
              max_num_seqs=max(args.seqs, 1), gpu_memory_utilization=args.gpu_memory_utilization,
              enforce_eager=args.enforce_eager, engine_process=False)
    engine = llm.engine
    executor = engine.executor
    from hetero_infer.worker.runner.loader import model_family

    moe = model_family(executor.model.config).supports.moe
    rng = random.Random(0)
    prompts = [[rng.randrange(100, 30000) for _ in range(args.prompt_len)] for _ in range(args.seqs)]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    with tempfile.TemporaryDirectory() as tmp:
        targets = None if args.targets == "all" else tuple(t.strip() for t in args.targets.split(","))
        folders = [write_adapter(Path(tmp) / f"a{i}", executor.model.config, args.rank, i, moe, targets=targets)
                   for i in range(args.adapters)]
        loras = [LoRARequest(f"a{i}", i + 1, str(f)) for i, f in enumerate(folders)]
        # one adapter from its folder into a slot: read and checked (host), then copied into a device slot
        t0 = time.perf_counter()
        llm.add_lora(loras[0])
        t1 = time.perf_counter()
        executor.lora.load_slot(0, loras[0].lora_name)
        if executor.device.type == "cuda":
            torch.cuda.synchronize()
        t2 = time.perf_counter()
        per_seq = [loras[i % args.adapters] for i in range(args.seqs)]
        llm.generate(prompt_token_ids=prompts[:2], sampling_params=params)  # warm both paths
        llm.generate(prompt_token_ids=prompts, sampling_params=params, lora_request=per_seq)
        runs: dict[str, list[float]] = {"base": [], "lora": []}
        for _ in range(args.rounds):
            for system, lora in (("base", None), ("lora", per_seq)):
                start = time.perf_counter()
                outs = llm.generate(prompt_token_ids=prompts, sampling_params=params, lora_request=lora)
                seconds = time.perf_counter() - start
                runs[system].append(sum(len(o.outputs[0].token_ids) for o in outs) / seconds)
    best = {k: max(v) for k, v in runs.items()}
    step_probe = fused_step_probe(executor, [lora.lora_name for lora in per_seq])
    runner = executor.decode_runner
    # each LoRA run against the base run just before it: on a loaded machine the pairs share its load
    pair_ratios = sorted(lora / base for base, lora in zip(runs["base"], runs["lora"]))
    result = {"model": engine.model_name, "device": str(executor.device), "dtype": str(executor.dtype),
              "adapters": args.adapters, "rank": args.rank, "targets": args.targets, "seqs": args.seqs, "prompt_len": args.prompt_len,
              "max_tokens": args.max_tokens, "runs": runs, "base_tok_s": best["base"], "lora_tok_s": best["lora"],
              "ratio": best["lora"] / best["base"],
              "median_pair_ratio": pair_ratios[len(pair_ratios) // 2], "adapter_read_s": t1 - t0, "slot_copy_s": t2 - t1,
              "adapter_mib": executor.lora.host[loras[0].lora_name].weights.nbytes / 2**20, "fused_step_ms": step_probe,
              # CUDA: whether decode steps replay CUDA graphs, and how many decode steps with adapters did
              "cuda_graphs": bool(runner and runner.graphs), "lora_graph_steps": runner.lora_steps if runner and runner.graphs else 0}
    print(f"{engine.model_name} on {executor.device} ({result['dtype']}): {args.seqs} sequences, prompts of "
          f"{args.prompt_len}, {args.max_tokens} new tokens each (greedy); {args.adapters} adapters of rank "
          f"{args.rank} on {'every projection' if args.targets == 'all' else args.targets}"
          f"{' (attention: MoE)' if moe else ''}")
    print("| system | runs (tok/s) | best (tok/s) |")
    print("|---|---|---:|")
    for system, label in (("base", "base model alone"), ("lora", f"{args.adapters} adapters mixed")):
        print(f"| {label} | {', '.join(f'{x:.1f}' for x in runs[system])} | {best[system]:.1f} |")
    if runner is not None:
        print(f"CUDA graphs {'on' if result['cuda_graphs'] else 'off (enforce_eager)'}: {runner.lora_steps} decode "
              f"steps with adapters in the decode runner")
    print(f"LoRA / base: {result['ratio']:.2f} (best runs); per round {', '.join(f'{r:.2f}' for r in pair_ratios)}, "
          f"median {result['median_pair_ratio']:.2f}")
    print(f"One adapter ({result['adapter_mib']:.1f} MiB) read from its folder "
          f"in {result['adapter_read_s']:.3f} s, copied into a slot in {result['slot_copy_s']:.3f} s")
    if step_probe:
        print(f"The fused CPU decode step alone, {args.seqs} rows (median of {PROBE_REPS}): base "
              f"{step_probe['base']:.1f} ms, with the adapters {step_probe['lora']:.1f} ms "
              f"({step_probe['base'] / step_probe['lora']:.2f})")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
