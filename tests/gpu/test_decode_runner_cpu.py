"""The CUDA decode path's padding, checked on the CPU: DecodeRunner (eager, no graphs) through the Triton
kernels in Triton's interpreter, against Hugging Face. Runs by default (no GPU needed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from quant_testing import hf_greedy

from hetero_infer.worker.runner.cuda_graphs import decode_buckets

SCRIPT = """
import json, sys
from hetero_infer import LLM, SamplingParams
from hetero_infer.worker.runner.cuda_graphs import DecodeRunner
llm = LLM(sys.argv[1], device="cpu", dtype="float32", block_size=4, max_model_len=64, max_num_batched_tokens=32)
ex = llm.engine.executor
assert ex.backend.name == "triton" and ex.decode_runner is None  # the runner is CUDA-only: attach one by hand
ex.decode_runner = runner = DecodeRunner(ex.model, ex.backend, ex.kv_caches, max_batch=8, max_blocks_per_seq=16,
                                         device=ex.device, use_graphs=False)
prompts, max_tokens = json.loads(sys.argv[2])
params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in max_tokens]
outs = llm.generate(prompt_token_ids=prompts, sampling_params=params)
import torch
with torch.inference_mode():  # the profiling step's prefill metadata on the kernel path
    hidden = ex.forward_prompts(prompts)
    last = torch.tensor([len(p) for p in prompts]).cumsum(0) - 1
    first = ex.model.compute_logits(hidden[last]).argmax(-1).tolist()
print(json.dumps({"tokens": [o.outputs[0].token_ids for o in outs], "steps": runner.num_steps, "first": first}))
"""


def test_decode_buckets():
    assert decode_buckets(1) == [1]
    assert decode_buckets(8) == [1, 2, 4, 8]
    assert decode_buckets(48) == [1, 2, 4, 8, 16, 32, 48]
    # finer steps where padding rows cost GEMM work: at most 1/8 padding from 129 rows on, 20 graphs for 256
    big = decode_buckets(256)
    assert big[:7] == [1, 2, 4, 8, 16, 32, 48] and big[-1] == 256 and len(big) == 20
    assert all(next(b for b in big if b >= n) - n <= n / 8 for n in range(129, 257))
    assert decode_buckets(200)[-2:] == [192, 200] and decode_buckets(512)[-2:] == [480, 512]


@pytest.mark.timeout(900)
def test_padded_decode_matches_hf(tiny_model):
    folder, hf = tiny_model("qwen2")
    # 5 sequences finishing one by one: decode batches 5 (bucket 8, 3 padding rows), 4, 3 (bucket 4), 2, 1
    prompts = [[101 + 7 * i + j for j in range(n)] for i, n in enumerate([6, 1, 13, 4, 9])]
    max_tokens = [2, 3, 4, 5, 6]
    env = {**os.environ, "TRITON_INTERPRET": "1", "HETERO_INFER_KERNELS": "triton"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(folder), json.dumps([prompts, max_tokens])], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["steps"] >= 4  # decode-only steps went through the padded runner
    expected = [hf_greedy(hf, p, m) for p, m in zip(prompts, max_tokens)]
    assert result["tokens"] == expected
    assert result["first"] == [e[0] for e in expected]
