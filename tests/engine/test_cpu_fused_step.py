"""The fused CPU decode step (kernels/cpu/decode_step.py, csrc/decode_step.c): bit for bit the per-op path's
logits where it engages (decode steps of 1 to more than 32 rows), the row limit that the linears' kernel plan
sets, and the per-op path wherever its preconditions do not hold."""

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
    kwargs.setdefault("max_num_blocks", 64)
    return LLM(str(folder), device="cpu", dtype=dtype, **kwargs)


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


def _prompts(count: int, longest: int = 5) -> list[list[int]]:
    """`count` prompts of 1..`longest` tokens (contexts over one to a few KV blocks)"""
    return [[100 + 7 * i + j for j in range(1 + (7 * i) % longest)] for i in range(count)]


# 11 sequences: 11-row decode steps
PROMPTS = _prompts(11)
# decode steps of these many rows: one and two a thread (attention split by KV heads, then by rows), the tile
# tails of the GEMM (6 + 2, 6 + 6 + 1), the default workload's 32, and past the 9-32-row bucket
ROW_COUNTS = [1, 3, 5, 8, 13, 32, 37]


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


def _same_steps(folder, monkeypatch, runs: list[list[list[int]]], **kwargs):
    """Every step's logits of the fused and the per-op engine over `runs` (one generate call each), asserted
    equal bit for bit; returns the row counts of the steps that ran fused."""
    results = {}
    for fused in (True, False):
        llm = _engine(folder, monkeypatch, fused, **kwargs)
        assert (llm.engine.executor.cpu_decode is not None) == fused
        logits, fused_rows = _record(llm)
        tokens = [_generate(llm, prompts) for prompts in runs]
        results[fused] = (tokens, logits, fused_rows)
    tokens, logits, fused_rows = results[True]
    ref_tokens, ref_logits, _ = results[False]
    assert tokens == ref_tokens
    assert len(logits) == len(ref_logits)
    for a, b in zip(logits, ref_logits):
        assert torch.equal(a, b)
    return fused_rows


@needs_fused
@pytest.mark.parametrize("arch", ["llama-hd64", "llama", "qwen2"])  # AVX-512 / portable attention; qkv bias
def test_fused_step_logits_equal_per_op_path(tiny_model, monkeypatch, tmp_path, arch):
    folder = _with_random_biases(tiny_model, tmp_path, arch) if arch == "qwen2" else tiny_model(arch)[0]
    fused_rows = _same_steps(folder, monkeypatch, [PROMPTS[:3], [PROMPTS[4]]], max_num_seqs=3)
    assert 1 in fused_rows and 3 in fused_rows  # one- and three-row steps ran fused


@needs_fused
@pytest.mark.parametrize("arch,threads", [("llama-hd64", 2), ("llama", 2), ("qwen2", 2), ("llama-hd64", 1),
                                          ("llama-hd64", 3)])  # 3: a thread count that splits no panel count
def test_fused_step_logits_equal_per_op_path_at_every_row_count(tiny_model, monkeypatch, tmp_path, arch, threads):
    folder = _with_random_biases(tiny_model, tmp_path, arch) if arch == "qwen2" else tiny_model(arch)[0]
    runs = [_prompts(rows, longest=40) for rows in ROW_COUNTS]  # contexts of up to 3 blocks of 16
    monkeypatch.setenv("HETERO_INFER_CPU_ADAPT", "0")  # the thread count stays as set
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        fused_rows = _same_steps(folder, monkeypatch, runs, max_num_seqs=40, max_num_blocks=160)
    finally:
        torch.set_num_threads(before)
    assert set(fused_rows) == set(ROW_COUNTS)


@needs_fused
def test_only_decode_steps_run_fused(tiny_model, monkeypatch):
    folder, _ = tiny_model("llama-hd64")
    llm = _engine(folder, monkeypatch, True)
    _, fused_rows = _record(llm)
    ref = _engine(folder, monkeypatch, False)
    prompt = [100, 101, 102, 103, 104]
    assert _generate(llm, [prompt], max_tokens=4) == _generate(ref, [prompt], max_tokens=4)
    assert fused_rows == [1, 1, 1]  # the 5-token prefill ran per op, each decode step fused


def _plan_rows(kinds_by_bucket: list[str]) -> list[tuple[str, ...]]:
    return [tuple(kinds_by_bucket)] * 4


def test_rows_limit_stops_below_the_first_bucket_off_the_gemm():
    assert decode_step.rows_limit(_plan_rows(["gemm_bf16"] * 4), "gemm_bf16") == (4, None)
    assert decode_step.rows_limit(_plan_rows(["gemm_bf16"] * 3 + ["onednn"]), "gemm_bf16") == (3, 32)
    assert decode_step.rows_limit(_plan_rows(["gemm_bf16", "gemm_bf16", "onednn", "gemm_bf16"]),
                                  "gemm_bf16") == (2, 8)
    one_off = [("gemm_bf16",) * 4] * 3 + [("gemm_bf16", "torch", "gemm_bf16", "gemm_bf16")]
    assert decode_step.rows_limit(one_off, "gemm_bf16") == (1, 1)
    assert decode_step.rows_limit(_plan_rows(["onednn"] + ["gemm_bf16"] * 3), "gemm_bf16") is None


@needs_fused
@pytest.mark.parametrize("bucket,max_rows", [(3, 32), (2, 8), (1, 1)])
def test_a_bucket_on_another_kernel_ends_the_fused_rows_below_it(tiny_model, monkeypatch, bucket, max_rows):
    """As where oneDNN (AMX) wins a bucket: the fused step takes only the row counts below that bucket, and the
    steps beyond it run per op."""
    from hetero_infer.kernels.cpu.linear import pack_as

    folder, _ = tiny_model("llama-hd64")
    llm = _engine(folder, monkeypatch, True, max_num_seqs=40, max_num_blocks=160)
    ex = llm.engine.executor
    assert ex.cpu_decode.max_rows is None  # every bucket on gemm_bf16
    down = ex.model.layers[1].mlp.down_proj
    weight = torch.empty(down.out_features, down.in_features, dtype=torch.bfloat16)
    other = pack_as("torch", weight)
    down.by_bucket = down.by_bucket[:bucket] + (other,) * (4 - bucket)
    ex.cpu_decode = decode_step.FusedDecodeStack.build(ex.model, ex.backend, ex.kv_caches, ex.dtype)
    assert ex.cpu_decode.max_rows == max_rows
    assert ex.cpu_decode.label == f"fused (1-{max_rows} rows)"
    _, fused_rows = _record(llm)
    for rows in (1, 8, 9, 33):
        _generate(llm, _prompts(rows), max_tokens=3)
    assert sorted(set(fused_rows)) == [r for r in (1, 8, 9, 33) if r <= max_rows]


@needs_fused
def test_the_same_weight_on_another_layout_ends_the_fused_rows(tiny_model, monkeypatch):
    """A bucket whose gemm_bf16 weight is another copy than the one the C step reads (by_bucket[0])."""
    from hetero_infer.kernels.cpu.linear import pack_as

    folder, _ = tiny_model("llama-hd64")
    ex = _engine(folder, monkeypatch, True).engine.executor
    qkv = ex.model.layers[0].self_attn.qkv_proj
    copy = pack_as("gemm_bf16", torch.zeros(qkv.out_features, qkv.in_features, dtype=torch.bfloat16))
    qkv.by_bucket = qkv.by_bucket[:2] + (copy, copy)
    assert decode_step.FusedDecodeStack.build(ex.model, ex.backend, ex.kv_caches, ex.dtype).max_rows == 8


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
