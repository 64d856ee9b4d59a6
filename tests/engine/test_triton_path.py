"""The engine's kernel path (Triton, run by Triton's CPU interpreter) against Hugging Face."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from test_hf_equivalence import hf_greedy, random_prompts

SCRIPT = """
import json, sys
from hetero_infer import LLM, SamplingParams
llm = LLM(sys.argv[1], device="cpu", dtype="float32", block_size=4, max_num_batched_tokens=16)
assert llm.engine.executor.backend.name == "triton", "the kernel path is not in use"
prompts = json.loads(sys.argv[2])
outs = llm.generate(prompt_token_ids=prompts, sampling_params=SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
print(json.dumps([o.outputs[0].token_ids for o in outs]))
"""


@pytest.mark.parametrize("arch", [pytest.param("llama3-tied", marks=pytest.mark.slow), "qwen3"])  # ~20 s more
def test_kernel_path_matches_hf(tiny_model, arch):
    folder, hf = tiny_model(arch)
    # chunked prefill (budget 16) over a cached prefix, plus decodes of different lengths
    prompts = random_prompts([21, 3, 9], seed=11)
    env = {**os.environ, "TRITON_INTERPRET": "1", "HETERO_INFER_KERNELS": "triton"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(folder), json.dumps(prompts)], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ours = json.loads(proc.stdout.strip().splitlines()[-1])
    assert ours == [hf_greedy(hf, p, max_new=4) for p in prompts]
