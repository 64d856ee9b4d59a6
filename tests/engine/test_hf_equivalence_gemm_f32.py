"""Greedy float32 decoding with every linear layer on the project's float32 GEMM (candidate "gemm_f32",
forced with HETERO_INFER_CPU_LINEAR) is token-identical to Hugging Face transformers: prefill (many rows) and
decode (one to a few rows) of mixed-length prompts; a head dim of 64 (the default model's) and qwen2's tied LM
head. (The tiny models' biases are zero: the bias is checked in tests/kernels/test_kernel_gemm_f32.py.)"""

from __future__ import annotations

import pytest
from test_hf_equivalence import hf_greedy, random_prompts, run_engine

from hetero_infer.kernels.cpu import linear as cpu_linear
from hetero_infer.kernels.cpu import select

# Skipped only without AVX-512F: tests/kernels/test_kernel_gemm_f32.py::test_gemm_f32_runs_where_the_build_has_avx512f
# fails where the CPU has it and the kernel is missing.
pytestmark = pytest.mark.skipif(cpu_linear._gemm_f32() is None or not cpu_linear.available(),
                                reason="no AVX-512F build of the C kernels (or CPU packing off)")


@pytest.mark.parametrize("arch", ["llama-hd64", "qwen2"])
def test_gemm_f32_engine_matches_hf(tiny_model, arch, monkeypatch):
    monkeypatch.setenv("HETERO_INFER_CPU_LINEAR", "gemm_f32")
    folder, hf = tiny_model(arch)
    prompts = random_prompts([3, 17, 40, 1, 29, 9], seed=5)
    llm, ours = run_engine(folder, prompts, block_size=16)
    paths = llm.engine.executor.cpu_paths
    linears = {layer: path for layer, path in paths.items() if layer not in ("attention", "prefill_attention", "decode_step")}
    assert linears and all(set(p.split()) == {f"{b}:gemm_f32" for b in select.BUCKETS} for p in linears.values())
    assert ours == [hf_greedy(hf, p) for p in prompts]
