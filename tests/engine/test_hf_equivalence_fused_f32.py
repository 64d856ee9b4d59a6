"""Greedy float32 decoding through the fused CPU decode step (kernels/cpu/decode_step.py; every linear forced onto
the project's float32 GEMM, which the fused step needs) is token-identical to Hugging Face transformers, with the
decode steps of one to six rows run fused."""

from __future__ import annotations

import pytest
import torch
from test_hf_equivalence import hf_greedy, random_prompts, run_engine

from hetero_infer.kernels.cpu import decode_step

# Skipped only without AVX-512F: tests/engine/test_cpu_fused_step.py::test_fused_f32_step_is_built_wherever_the_build_target_has_avx512f
# fails where the build target has it and the fused step is missing.
pytestmark = pytest.mark.skipif(not decode_step.available(torch.float32),
                                reason="no AVX-512F build of the C kernels")


@pytest.mark.parametrize("arch", ["llama-hd64", "qwen2"])
def test_fused_f32_decode_matches_hf(tiny_model, arch, monkeypatch):
    monkeypatch.setenv("HETERO_INFER_CPU_LINEAR", "gemm_f32")
    monkeypatch.setenv("HETERO_INFER_CPU_FUSED", "1")
    fused_rows: list[int] = []
    run = decode_step.FusedDecodeStack.run

    def recording_run(self, input_ids, meta, lora=None):
        fused_rows.append(input_ids.shape[0])
        return run(self, input_ids, meta, lora)

    monkeypatch.setattr(decode_step.FusedDecodeStack, "run", recording_run)
    folder, hf = tiny_model(arch)
    prompts = random_prompts([3, 17, 40, 1, 29, 9], seed=5)
    llm, ours = run_engine(folder, prompts, block_size=16)
    assert llm.engine.executor.cpu_paths["decode_step"].startswith("fused")
    assert 6 in fused_rows  # the six sequences' decode steps ran fused
    assert ours == [hf_greedy(hf, p) for p in prompts]
