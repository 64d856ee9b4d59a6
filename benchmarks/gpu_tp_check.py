"""The GPU check's tensor-parallel phase (`--phases tp`), what one GPU can run of issue 41:

1. the NCCL code path at world size 1 with CUDA graphs: the tensor-parallel executor forced at N = 1 (a NCCL
   process group of one rank, so every all-reduce and the logits' all-gather run, inside the captured decode
   graphs) gives the same greedy tokens as the plain executor, on a tiny random Llama and a tiny Qwen3-MoE;
2. TP=2 equivalence on gloo (the CPU ranks of tests/tp: the layers against their references, the engine against
   transformers and TP=1).

    python benchmarks/gpu_tp_check.py --json OUT/tp.json [--device cuda] [--skip-tests]

Owed on a machine with several GPUs: the Llama-3-8B shape at TP=2 against TP=1 (docs/tensor-parallel.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HETERO_INFER_LLM_ENGINE_PROCESS", "0")


def _tiny(folder: Path, arch: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3MoeConfig

    base = dict(vocab_size=1001, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6, initializer_range=0.15,
                tie_word_embeddings=False)
    config = (LlamaConfig(**base) if arch == "llama" else
              Qwen3MoeConfig(head_dim=32, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64, **base))
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(folder)


def nccl_world_size_one(device: str) -> dict:
    """Greedy tokens of the plain executor and of the tensor-parallel one at N = 1 (its group's collectives on)."""
    from hetero_infer import LLM, SamplingParams
    from hetero_infer.worker.runner import executors
    from hetero_infer.worker.runner.parallel.executor import TensorParallelExecutor

    plain = executors.executor_kind("torch")
    prompts = [[5, 17, 99, 300, 2], [7] * 40, [1, 2, 3], list(range(100, 160))]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for arch in ("llama", "qwen3_moe"):
            folder = Path(tmp) / arch
            _tiny(folder, arch)
            tokens = {}
            for mode in ("plain", "tp1"):
                kind = plain if mode == "plain" else executors.ExecutorKind(TensorParallelExecutor)
                executors.register_executor("torch", kind)
                try:
                    started = time.perf_counter()
                    llm = LLM(str(folder), device=device, dtype="float32", skip_tokenizer_init=True)
                    gen = llm.generate(prompt_token_ids=prompts, sampling_params=params)
                    tokens[mode] = [list(o.outputs[0].token_ids) for o in gen]
                    ex = llm.engine.executor
                    local = getattr(ex, "local", ex)
                    runner = local.decode_runner
                    out[f"{arch}/{mode}"] = {
                        "seconds": round(time.perf_counter() - started, 2),
                        "group": type(local.tp.group).__name__ if local.tp.group is not None else None,
                        "cuda_graphs": sorted(getattr(runner, "graphs", {}) or {}) if runner is not None else None}
                    if mode == "tp1":
                        ex.close()
                finally:
                    executors.register_executor("torch", plain)
            out[f"{arch}/same_tokens"] = tokens["plain"] == tokens["tp1"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--skip-tests", action="store_true")
    args = p.parse_args(argv)
    results: dict = {"nccl_world_size_1": nccl_world_size_one(args.device)}
    print(json.dumps(results, indent=2), flush=True)
    ok = all(v for k, v in results["nccl_world_size_1"].items() if k.endswith("same_tokens"))
    if not args.skip_tests:
        started = time.perf_counter()
        rc = subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow",
                              "tests/tp/test_parallel_layers.py", "tests/tp/test_tp_engine.py"], cwd=ROOT)
        results["tp2_gloo_tests"] = {"exit_code": rc, "seconds": round(time.perf_counter() - started, 1)}
        ok = ok and rc == 0
    results["ok"] = ok
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
