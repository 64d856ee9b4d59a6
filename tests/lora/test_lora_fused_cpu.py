"""LoRA adapters inside the fused CPU decode step (kernels/cpu/csrc/decode_step.c with lora.c; every linear forced
onto the project's GEMM, which the fused step needs): greedy float32 tokens identical to transformers + peft with
adapters of two ranks and the base model mixed in one batch, and, in float32 and bfloat16, each fused LoRA step's
hidden states those of the per-op path with the LoRA hooks (kernels/lora.py) on the same step."""

from __future__ import annotations

import ctypes

import pytest
import torch
from test_lora_peft import GREEDY, engine, expected, loras, prompts

from hetero_infer import LLM
from hetero_infer.kernels.cpu import decode_step

# Skipped only without AVX-512F / AVX2: tests/engine/test_cpu_fused_step.py checks the fused step is built wherever
# the build target has them.
pytestmark = pytest.mark.skipif(not decode_step.available(torch.float32), reason="no fused step in this build")


@pytest.fixture
def fused_only(monkeypatch):
    monkeypatch.setenv("HETERO_INFER_CPU_LINEAR", "gemm_f32,gemm_bf16")
    monkeypatch.setenv("HETERO_INFER_CPU_FUSED", "1")


def _recording(monkeypatch) -> list[tuple[int, tuple[int, ...]]]:
    """(rows, the rows' slots) of every fused step that ran adapters."""
    steps = []
    run = decode_step.FusedDecodeStack.run

    def recording_run(self, input_ids, meta, lora=None):
        if lora is not None:
            rows = input_ids.shape[0]
            steps.append((rows, tuple((ctypes.c_int32 * rows).from_address(lora.slots))))
        return run(self, input_ids, meta, lora)

    monkeypatch.setattr(decode_step.FusedDecodeStack, "run", recording_run)
    return steps


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_fused_lora_decode_matches_peft(tiny_model, adapter, arch, fused_only, monkeypatch):
    steps = _recording(monkeypatch)
    folder, base = tiny_model(arch)
    reqs = loras(adapter, arch, ("attn8", "all16", "mlp8rs"))
    batch = prompts([5, 19, 11, 3, 26, 9], seed=7)
    per_prompt = [None, reqs["attn8"], reqs["all16"], reqs["mlp8rs"], reqs["all16"], None]
    llm = engine(folder, max_loras=3)
    assert llm.engine.executor.cpu_decode is not None
    outs = llm.generate(prompt_token_ids=batch, sampling_params=GREEDY, lora_request=per_prompt)
    assert [o.outputs[0].token_ids for o in outs] == [
        expected(base, None if r is None else r.lora_path, p) for p, r in zip(batch, per_prompt)]
    # the six sequences' decode steps ran fused with their adapters, base rows (-1) among them
    mixed = [slots for rows, slots in steps if rows == 6]
    assert mixed and all(-1 in s and len({x for x in s if x >= 0}) == 3 for s in mixed)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_lora_step_is_the_per_op_step(tiny_model, adapter, dtype, fused_only, monkeypatch):
    """Per fused LoRA step: its hidden states against the per-op forward with the hooks (same step, same cache),
    closer than to the base model's (so the adapters' update is in them)."""
    if dtype == "bfloat16" and not decode_step.available(torch.bfloat16):
        pytest.skip("no bfloat16 fused step in this build")
    gaps = []
    run = decode_step.FusedDecodeStack.run

    def checking_run(self, input_ids, meta, lora=None):
        if lora is None:
            return run(self, input_ids, meta)
        base = run(self, input_ids, meta).float()
        per_op = self.model(input_ids, self.backend, meta, self.kv_caches).float()  # the hooks are active
        fused = run(self, input_ids, meta, lora)  # last: the cache holds this step's K/V under the adapters
        scale = per_op.abs().max().item()  # gaps relative to the largest hidden value
        gaps.append(((fused.float() - per_op).abs().max().item() / scale, (fused.float() - base).abs().max().item() / scale))
        return fused

    monkeypatch.setattr(decode_step.FusedDecodeStack, "run", checking_run)
    folder, _ = tiny_model("llama")
    reqs = loras(adapter, "llama", ("attn8", "all16"))
    llm = LLM(str(folder), device="cpu", dtype=dtype, enable_lora=True, block_size=4, max_loras=2)
    batch = prompts([4, 9, 13, 6], seed=8)
    llm.generate(prompt_token_ids=batch, sampling_params=GREEDY,
                 lora_request=[reqs["attn8"], None, reqs["all16"], reqs["attn8"]])
    assert gaps
    # bfloat16: the per-op path rounds y = A x and B y to bfloat16, the C step keeps both in float32 (~2% seen)
    tol = 1e-5 if dtype == "float32" else 3e-2
    for to_per_op, to_base in gaps:
        assert to_per_op <= tol < to_base, (to_per_op, to_base)
