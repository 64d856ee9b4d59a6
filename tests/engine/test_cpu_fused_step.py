"""The fused CPU decode step (kernels/cpu/decode_step.py, csrc/decode_step.c): bit for bit the per-op path's
logits where it engages, and the per-op path wherever its preconditions do not hold."""

from __future__ import annotations

import os

import pytest
import torch

from hetero_infer import LLM, SamplingParams
from hetero_infer.kernels.cpu import decode_step, native

# Skipped only where the CPU lacks the instructions: test_fused_step_is_built_wherever_the_cpu_has_avx512_bf16
# fails instead when a CPU that has them gets no fused step (a broken build must not read as a skip).
needs_fused = pytest.mark.skipif(not decode_step.available(), reason="no AVX512_BF16 in this CPU's kernel build")


def test_fused_step_is_built_wherever_the_cpu_has_avx512_bf16():
    if os.environ.get("HETERO_INFER_CPU_MARCH", "native") != "native":
        pytest.skip("a cross-target build (HETERO_INFER_CPU_MARCH) may leave out what this CPU has")
    assert native.library() is not None, "the C kernels did not build"
    assert decode_step.available() == ("avx512_bf16" in native.cpu_flags())


def _engine(folder, monkeypatch, fused: bool, dtype: str = "bfloat16", **kwargs):
    monkeypatch.setenv("HETERO_INFER_CPU_SELECT", "0")  # the default kernels: gemm_bf16 for every bfloat16 linear
    monkeypatch.setenv("HETERO_INFER_CPU_FUSED", "1" if fused else "0")
    return LLM(str(folder), device="cpu", dtype=dtype, max_num_blocks=64, **kwargs)


def _record(llm):
    """Wrap the executor: every step's logits, and the row counts of the steps the fused stack ran."""
    ex = llm.engine.executor
    logits: list[torch.Tensor] = []
    fused_rows: list[int] = []
    execute = ex.execute

    def recording_execute(sched):
        out = execute(sched)
        logits.append(out.clone())
        return out

    ex.execute = recording_execute
    if ex.cpu_decode is not None:
        run = ex.cpu_decode.run

        def recording_run(input_ids, meta):
            fused_rows.append(input_ids.shape[0])
            return run(input_ids, meta)

        ex.cpu_decode.run = recording_run
    return logits, fused_rows


def _generate(llm, prompts, max_tokens=6):
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=prompts, sampling_params=params)]


# prompts of 1..5 tokens: a short prompt's prefill rows fit the fused stack too; 11 sequences: steps of more
# rows than it takes run the per-op path
PROMPTS = [[100 + 7 * i + j for j in range(1 + i % 5)] for i in range(11)]


def _with_random_biases(tiny_model, tmp_path, arch: str):
    """`arch`'s tiny model with nonzero biases (transformers initializes them to zero)."""
    import copy
    import shutil

    folder, model = tiny_model(arch)
    model = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.copy_(torch.randn(param.shape, generator=gen) * 0.5)
    model.save_pretrained(tmp_path, safe_serialization=True)
    for f in folder.iterdir():
        if not (tmp_path / f.name).exists():
            shutil.copy(f, tmp_path / f.name)
    return tmp_path


@needs_fused
@pytest.mark.parametrize("arch", ["llama-hd64", "llama", "qwen2"])  # AVX-512 / portable attention; qkv bias
def test_fused_step_logits_equal_per_op_path(tiny_model, monkeypatch, tmp_path, arch):
    folder = _with_random_biases(tiny_model, tmp_path, arch) if arch == "qwen2" else tiny_model(arch)[0]
    results = {}
    for fused in (True, False):
        llm = _engine(folder, monkeypatch, fused, max_num_seqs=3)
        assert (llm.engine.executor.cpu_decode is not None) == fused
        logits, fused_rows = _record(llm)
        tokens = _generate(llm, PROMPTS[:3]) + _generate(llm, [PROMPTS[4]])
        results[fused] = (tokens, logits, fused_rows)
    tokens, logits, fused_rows = results[True]
    ref_tokens, ref_logits, _ = results[False]
    assert fused_rows and 1 in fused_rows and 3 in fused_rows  # one- and three-row steps ran fused
    assert tokens == ref_tokens
    assert len(logits) == len(ref_logits)
    for a, b in zip(logits, ref_logits):
        assert torch.equal(a, b)


@needs_fused
def test_steps_larger_than_the_fused_stack_take_the_per_op_path(tiny_model, monkeypatch):
    folder, _ = tiny_model("llama-hd64")
    llm = _engine(folder, monkeypatch, True)
    _, fused_rows = _record(llm)
    ref = _engine(folder, monkeypatch, False)
    # 11 sequences: a 33-row prefill step, then 11-row decode steps, more than the fused stack takes
    assert _generate(llm, PROMPTS) == _generate(ref, PROMPTS)
    assert fused_rows == []
    assert _generate(llm, PROMPTS[:1]) == _generate(ref, PROMPTS[:1])
    assert fused_rows  # the same engine runs one sequence's steps fused


def test_fused_stack_stays_off_where_its_preconditions_fail(tiny_model, monkeypatch):
    folder, _ = tiny_model("llama-hd64")
    assert _engine(folder, monkeypatch, True, dtype="float32").engine.executor.cpu_decode is None
    assert _engine(folder, monkeypatch, False).engine.executor.cpu_decode is None
    qwen3, _ = tiny_model("qwen3")
    assert _engine(qwen3, monkeypatch, True).engine.executor.cpu_decode is None
    monkeypatch.setenv("HETERO_INFER_ONEDNN", "0")  # plain nn.Linear layers: nothing packed for gemm_bf16
    assert _engine(folder, monkeypatch, True).engine.executor.cpu_decode is None


@needs_fused
def test_a_layer_on_another_kernel_keeps_the_per_op_path(tiny_model, monkeypatch):
    from hetero_infer.kernels.cpu.linear import pack_as

    folder, _ = tiny_model("llama-hd64")
    llm = _engine(folder, monkeypatch, True)
    ex = llm.engine.executor
    down = ex.model.layers[1].mlp.down_proj
    weight = torch.empty(down.out_features, down.in_features, dtype=torch.bfloat16)
    down.by_bucket = (pack_as("torch", weight),) + down.by_bucket[1:]
    assert decode_step.FusedDecodeStack.build(ex.model, ex.backend, ex.kv_caches, ex.dtype) is None
