"""LoRA on CUDA (run by the GPU check's suite phase; peft is not on the GPU machine): the Triton shrink/expand
path decodes the same greedy float32 tokens as the CPU path (itself checked against peft in test_lora_peft.py)
for adapters mixed with the base in one batch, with CUDA graphs on (decode steps with adapters replay the LoRA
graphs); the captured LoRA decode steps give the eager ones' tokens, and are faster; bfloat16 runs."""

from __future__ import annotations

import random
import time

import pytest
import torch

from hetero_infer import LLM, LoRARequest, SamplingParams
from hetero_infer.bench.lora import write_adapter

pytestmark = pytest.mark.gpu


def _run(folder, device, dtype, loras, batch, per_prompt):
    llm = LLM(str(folder), device=device, dtype=dtype, enable_lora=True, max_loras=2, block_size=16,
              max_num_blocks=256, gpu_memory_utilization=0.3)
    if device == "cuda":  # decode steps with adapters went through the LoRA graphs
        runner = llm.engine.executor.decode_runner
        assert runner.lora_graphs.keys() == runner.graphs.keys()
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    outs = llm.generate(prompt_token_ids=batch, sampling_params=params, lora_request=per_prompt)
    assert device != "cuda" or llm.engine.executor.decode_runner.lora_steps > 0
    slot_loads = llm.engine.executor.lora.slot_loads
    llm.shutdown()
    return [o.outputs[0].token_ids for o in outs], slot_loads


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_lora_matches_the_cpu_path(tiny_model, tmp_path):
    folder, hf = tiny_model("llama")
    loras = [LoRARequest(f"a{i}", i + 1, str(write_adapter(tmp_path / f"a{i}", hf.config, 8, i, b_std=0.5))) for i in range(3)]
    rng = random.Random(0)
    batch = [[rng.randrange(100, 40000) for _ in range(n)] for n in (5, 17, 9, 30, 12, 3)]
    per_prompt = [None, loras[0], loras[1], loras[2], None, loras[0]]
    cpu, _ = _run(folder, "cpu", "float32", loras, batch, per_prompt)
    cuda, loads = _run(folder, "cuda", "float32", loras, batch, per_prompt)
    assert cuda == cpu and loads >= 3  # three adapters through two slots
    base_only, _ = _run(folder, "cpu", "float32", loras, batch, [None] * len(batch))
    assert [c != b for c, b in zip(cpu, base_only)] == [r is not None for r in per_prompt]
    bf16, _ = _run(folder, "cuda", "bfloat16", loras, batch, per_prompt)
    assert len(bf16) == len(batch) and all(len(t) == 12 for t in bf16)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_captured_lora_decode_steps_match_eager(tiny_model, tmp_path):
    """The same engine with CUDA graphs and with enforce_eager (the same padded forward, run eagerly): identical
    float32 tokens for three adapters over two slots mixed with the base (every replay runs another adapter mix
    than the capture's), and the graphs' LoRA decode is faster (printed: the GPU check's log keeps it)."""
    folder, hf = tiny_model("llama")
    loras = [LoRARequest(f"a{i}", i + 1, str(write_adapter(tmp_path / f"a{i}", hf.config, 8 * (i + 1), i, b_std=0.5)))
             for i in range(3)]
    rng = random.Random(1)
    batch = [[rng.randrange(100, 40000) for _ in range(rng.randrange(3, 40))] for _ in range(24)]
    per_prompt = [None if i % 4 == 0 else loras[i % 3] for i in range(len(batch))]
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    got, tok_s = {}, {}
    for eager in (True, False):
        llm = LLM(str(folder), device="cuda", dtype="float32", enable_lora=True, max_loras=2, max_lora_rank=24,
                  block_size=16, max_num_blocks=512, max_num_seqs=32, gpu_memory_utilization=0.3,
                  enforce_eager=eager)
        runner = llm.engine.executor.decode_runner
        assert bool(runner.lora_graphs) == (not eager)
        llm.generate(prompt_token_ids=batch[:2], sampling_params=params, lora_request=per_prompt[:2])  # warm-up
        before = runner.lora_steps
        torch.cuda.synchronize()
        start = time.perf_counter()
        outs = llm.generate(prompt_token_ids=batch, sampling_params=params, lora_request=per_prompt)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        assert runner.lora_steps - before >= 20  # the decode steps with adapters took the runner
        got[eager] = [o.outputs[0].token_ids for o in outs]
        tok_s[eager] = sum(map(len, got[eager])) / seconds
        llm.shutdown()
    print(f"LoRA decode (tiny llama, 24 sequences, 3 adapters / 2 slots): graphs {tok_s[False]:.0f} tok/s, "
          f"eager {tok_s[True]:.0f} tok/s ({tok_s[False] / tok_s[True]:.2f}x)")
    assert got[False] == got[True]
    assert tok_s[False] > tok_s[True]
