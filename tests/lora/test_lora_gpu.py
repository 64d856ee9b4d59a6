"""LoRA on CUDA (run by the GPU check's suite phase; peft is not on the GPU machine): the Triton shrink/expand
path decodes the same greedy float32 tokens as the CPU path (itself checked against peft in test_lora_peft.py)
for adapters mixed with the base in one batch, with CUDA graphs on for the base steps; bfloat16 runs."""

from __future__ import annotations

import random

import pytest
import torch

from hetero_infer import LLM, LoRARequest, SamplingParams
from hetero_infer.bench.lora import write_adapter

pytestmark = pytest.mark.gpu


def _run(folder, device, dtype, loras, batch, per_prompt):
    llm = LLM(str(folder), device=device, dtype=dtype, enable_lora=True, max_loras=2, block_size=16,
              max_num_blocks=256, gpu_memory_utilization=0.3)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    outs = llm.generate(prompt_token_ids=batch, sampling_params=params, lora_request=per_prompt)
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
