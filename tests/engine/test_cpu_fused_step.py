"""The fused CPU decode step (kernels/cpu/decode_step.py, csrc/decode_step.c): bit for bit the per-op path's
logits where it engages (decode steps of 1 to more than 32 rows), the row limit that the linears' kernel plan
sets, and the per-op path wherever its preconditions do not hold."""

from __future__ import annotations

import os
import subprocess

import pytest
import torch

from hetero_infer import LLM, SamplingParams
from hetero_infer.kernels.cpu import decode_step, native

# Skipped only where the build target lacks the instructions: test_fused_step_is_built_wherever_the_build_target_
# has_them fails instead when a target that has them gets no fused step (a broken build must not read as a skip).
needs_fused = pytest.mark.skipif(not decode_step.available(),
                                 reason="no AVX512_BF16 or AVX2 + FMA in this CPU's kernel build")
needs_fused_f32 = pytest.mark.skipif(not decode_step.available(torch.float32),
                                     reason="no AVX-512F or AVX2 + FMA in this CPU's kernel build")


def _build_target_has(cpu_flags: set[str], *macros: str) -> bool:
    """Whether the kernel library's build target has an instruction set: for -march=native the CPU's own flags
    (so a build that leaves out what the CPU has fails the guards), for another target (HETERO_INFER_CPU_MARCH,
    or the level HETERO_INFER_CPU_ISA forces) what the compiler defines for that target."""
    march = native._march().removeprefix("-march=")
    if march == "native":
        return cpu_flags <= native.cpu_flags()
    defined = subprocess.run([native._compiler(), f"-march={march}", "-dM", "-E", "-x", "c", os.devnull],
                             capture_output=True, text=True, check=True).stdout
    return all(f"#define {m} 1" in defined for m in macros)


AVX2_FMA = ({"avx2", "fma"}, "__AVX2__", "__FMA__")


def test_fused_step_is_built_wherever_the_build_target_has_them():
    """bfloat16: AVX512_BF16 (VDPBF16PS) or AVX2 + FMA (widened to float32); float32: AVX-512F or AVX2 + FMA."""
    assert native.library() is not None, "the C kernels did not build"
    assert decode_step.available() == (
        _build_target_has({"avx512_bf16"}, "__AVX512F__", "__AVX512BW__", "__AVX512BF16__")
        or _build_target_has(*AVX2_FMA))
    assert decode_step.available(torch.float32) == (_build_target_has({"avx512f"}, "__AVX512F__")
                                                    or _build_target_has(*AVX2_FMA))


def _engine(folder, monkeypatch, fused: bool, dtype: str = "bfloat16", **kwargs):
    monkeypatch.setenv("HETERO_INFER_CPU_SELECT", "0")  # the default kernels: gemm_bf16 for every bfloat16 linear
    if dtype == "float32":  # onednn by default: gemm_f32 forced for every float32 linear
        monkeypatch.setenv("HETERO_INFER_CPU_LINEAR", "gemm_f32")
    else:
        monkeypatch.delenv("HETERO_INFER_CPU_LINEAR", raising=False)
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
        logits.append(out[0].clone())  # (logits, prompt logprobs)
        return out

    ex.execute = recording_execute
    if ex.cpu_decode is not None:
        run = ex.cpu_decode.run

        def recording_run(input_ids, meta, lora=None):
            fused_rows.append(input_ids.shape[0])
            return run(input_ids, meta, lora)

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


def _every_row_count(tiny_model, monkeypatch, tmp_path, arch, threads, dtype):
    folder = _with_random_biases(tiny_model, tmp_path, arch) if arch == "qwen2" else tiny_model(arch)[0]
    runs = [_prompts(rows, longest=40) for rows in ROW_COUNTS]  # contexts of up to 3 blocks of 16
    monkeypatch.setenv("HETERO_INFER_CPU_ADAPT", "0")  # the thread count stays as set
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        fused_rows = _same_steps(folder, monkeypatch, runs, dtype=dtype, max_num_seqs=40, max_num_blocks=160)
    finally:
        torch.set_num_threads(before)
    assert set(fused_rows) == set(ROW_COUNTS)


# llama-hd64: AVX-512 attention; llama: the portable attention; qwen2: biases; 3 threads split no panel count
ARCH_THREADS = [("llama-hd64", 2), ("llama", 2), ("qwen2", 2), ("llama-hd64", 1), ("llama-hd64", 3)]


@needs_fused
@pytest.mark.parametrize("arch,threads", ARCH_THREADS)
def test_fused_step_logits_equal_per_op_path_at_every_row_count(tiny_model, monkeypatch, tmp_path, arch, threads):
    _every_row_count(tiny_model, monkeypatch, tmp_path, arch, threads, "bfloat16")


@needs_fused_f32
@pytest.mark.parametrize("arch,threads", ARCH_THREADS)
def test_fused_f32_step_logits_equal_per_op_path_at_every_row_count(tiny_model, monkeypatch, tmp_path, arch,
                                                                    threads):
    _every_row_count(tiny_model, monkeypatch, tmp_path, arch, threads, "float32")


@needs_fused
def test_only_decode_steps_run_fused(tiny_model, monkeypatch):
    folder, _ = tiny_model("llama-hd64")
    llm = _engine(folder, monkeypatch, True)
    _, fused_rows = _record(llm)
    ref = _engine(folder, monkeypatch, False)
    prompt = [100, 101, 102, 103, 104]
    assert _generate(llm, [prompt], max_tokens=4) == _generate(ref, [prompt], max_tokens=4)
    assert fused_rows == [1, 1, 1]  # the 5-token prefill ran per op, each decode step fused


def test_covered_buckets_are_those_with_every_projection_on_the_gemm():
    on, off = ("gemm_bf16",) * 4, ("gemm_bf16", "gemm_bf16", "onednn", "another weight")
    assert decode_step.covered_buckets([on, on], "gemm_bf16") == (True, True, True, True)
    assert decode_step.covered_buckets([on, off], "gemm_bf16") == (True, True, False, False)
    assert decode_step.covered_buckets([("torch",) + on[1:], on], "gemm_bf16") == (False, True, True, True)
    assert decode_step.covered_buckets([on, off], "gemm_f32") == (False, False, False, False)


def test_rows_label_names_the_covered_row_counts():
    assert decode_step.rows_label((True, True, True, True)) == "any row count"
    assert decode_step.rows_label((True, True, True, False)) == "1-32 rows"
    assert decode_step.rows_label((True, False, False, False)) == "1 row"
    assert decode_step.rows_label((False, True, True, True)) == "2 rows and more"
    assert decode_step.rows_label((True, True, False, True)) == "1-8 rows, 33 rows and more"


# a projection's buckets moved to another kernel (as where oneDNN with AMX wins them) -> the decode row counts
# (of 1, 8, 9, 33) that still run fused, and the label
OFF_BUCKETS = [((3,), [1, 8, 9], "1-32 rows"), ((2,), [1, 8, 33], "1-8 rows, 33 rows and more"),
               ((0,), [8, 9, 33], "2 rows and more"), ((1, 2, 3), [1], "1 row")]


@needs_fused
@pytest.mark.parametrize("off,fused,label", OFF_BUCKETS)
def test_a_bucket_on_another_kernel_runs_its_steps_per_op(tiny_model, monkeypatch, off, fused, label):
    """The fused step takes only the decode steps of the buckets where every projection is on gemm_bf16; the
    rest run per op (their logits then come from the other kernel, as the plan says)."""
    from hetero_infer.kernels.cpu.linear import pack_as

    folder, _ = tiny_model("llama-hd64")
    llm = _engine(folder, monkeypatch, True, max_num_seqs=40, max_num_blocks=160)
    ex = llm.engine.executor
    assert ex.cpu_decode.covered == (True, True, True, True)
    assert ex.cpu_paths["decode_step"] == "fused (decode steps of any row count)"
    down = ex.model.layers[1].mlp.down_proj
    other = pack_as("torch", torch.empty(down.out_features, down.in_features, dtype=torch.bfloat16))
    down.by_bucket = tuple(other if i in off else p for i, p in enumerate(down.by_bucket))
    ex.cpu_decode = decode_step.FusedDecodeStack.build(ex.model, ex.backend, ex.kv_caches, ex.dtype)
    assert ex.cpu_decode.label == f"fused (decode steps of {label})"
    _, fused_rows = _record(llm)
    for rows in (1, 8, 9, 33):
        _generate(llm, _prompts(rows), max_tokens=3)
    assert sorted(set(fused_rows)) == fused


def _fake_timer(stack, fused_s: float, per_op_s: float):
    """A clock for select.measure that tells the fused step's calls (through `stack.run`) from the per-op ones."""
    ran: list[int] = []
    run = stack.run

    def recording_run(input_ids, meta, lora=None):
        ran.append(input_ids.shape[0])
        return run(input_ids, meta, lora)

    stack.run = recording_run

    def timer(call):
        before = len(ran)
        call()
        return fused_s if len(ran) > before else per_op_s

    return timer, ran


@needs_fused
@pytest.mark.parametrize("fused_faster", [True, False])
def test_a_bucket_off_the_gemm_is_taken_where_the_fused_step_measures_faster(tiny_model, monkeypatch, fused_faster):
    """The plan put one projection's one-row bucket on F.linear (timed alone, in cache); the fused step is timed
    against the per-op step on a probe: faster, it takes the bucket and the projection moves onto gemm_bf16
    there (the per-op path too); slower, nothing changes."""
    from hetero_infer.kernels.cpu.linear import pack_as

    folder, _ = tiny_model("llama-hd64")
    llm = _engine(folder, monkeypatch, True)  # HETERO_INFER_CPU_SELECT=0: build measures nothing
    ex = llm.engine.executor
    o = ex.model.layers[1].self_attn.o_proj
    gemm_weight = o.by_bucket[1]
    o.by_bucket = (pack_as("torch", torch.empty(o.out_features, o.in_features, dtype=torch.bfloat16)),) + o.by_bucket[1:]
    o.plan = ("torch",) + o.plan[1:]
    stack = decode_step.FusedDecodeStack.build(ex.model, ex.backend, ex.kv_caches, ex.dtype)
    assert stack.covered == (False, True, True, True)
    timer, probe_rows = _fake_timer(stack, 0.001, 0.002) if fused_faster else _fake_timer(stack, 0.002, 0.001)
    stack.measure_uncovered(timer=timer)
    assert probe_rows and set(probe_rows) == {1}  # the one-row bucket was probed with one row
    assert stack.covered == ((True,) if fused_faster else (False,)) + (True, True, True)
    assert (o.by_bucket[0] is gemm_weight) == fused_faster
    assert o.plan[0] == ("gemm_bf16" if fused_faster else "torch")


@needs_fused
def test_the_probes_outcome_is_cached_so_a_second_start_times_nothing(tiny_model, monkeypatch, tmp_path):
    from hetero_infer.kernels.cpu import select
    from hetero_infer.kernels.cpu.linear import pack_as

    folder, _ = tiny_model("llama-hd64")
    cache_key = select.MachineKey("AMD EPYC", "abc", 2, "2.13.0+cpu", "0.1.0", "deadbeef")

    def start(fused_s: float, per_op_s: float):
        ex = _engine(folder, monkeypatch, True).engine.executor
        o = ex.model.layers[1].self_attn.o_proj
        o.by_bucket = (pack_as("torch", torch.empty(o.out_features, o.in_features, dtype=torch.bfloat16)),) + o.by_bucket[1:]
        o.plan = ("torch",) + o.plan[1:]
        stack = decode_step.FusedDecodeStack.build(ex.model, ex.backend, ex.kv_caches, ex.dtype)
        timer, probe_rows = _fake_timer(stack, fused_s, per_op_s)

        def one_thread_timer(call):
            seen_threads.add(torch.get_num_threads())
            return timer(call)

        stack.measure_uncovered(timer=one_thread_timer, cache=select.ChoiceCache(tmp_path, cache_key), threads=1)
        return stack, probe_rows

    seen_threads: set[int] = set()
    torch.set_num_threads(2)
    threads_before = torch.get_num_threads()

    first, probed = start(0.001, 0.002)
    assert probed and first.covered[0]
    assert torch.get_num_threads() == threads_before  # the probe's one thread was given back
    assert seen_threads == {1}  # timed on one thread, as the kernel choice is
    again, probed = start(0.002, 0.001)  # the clock would now say per op: the cached outcome stands, untimed
    assert probed == [] and again.covered[0]
    other = select.MachineKey("AMD EPYC", "abc", 1, "2.13.0+cpu", "0.1.0", "deadbeef")  # another thread count
    ex = _engine(folder, monkeypatch, True).engine.executor
    o = ex.model.layers[1].self_attn.o_proj
    o.by_bucket = (pack_as("torch", torch.empty(o.out_features, o.in_features, dtype=torch.bfloat16)),) + o.by_bucket[1:]
    o.plan = ("torch",) + o.plan[1:]
    stack = decode_step.FusedDecodeStack.build(ex.model, ex.backend, ex.kv_caches, ex.dtype)
    timer, probed = _fake_timer(stack, 0.002, 0.001)
    stack.measure_uncovered(timer=timer, cache=select.ChoiceCache(tmp_path, other))
    assert probed and not stack.covered[0]


@needs_fused
def test_the_last_bucket_is_never_moved_by_the_probe(tiny_model, monkeypatch):
    """More than 32 rows also means prefill-sized calls, which a decode probe does not time."""
    from hetero_infer.kernels.cpu.linear import pack_as

    folder, _ = tiny_model("llama-hd64")
    ex = _engine(folder, monkeypatch, True).engine.executor
    o = ex.model.layers[0].self_attn.o_proj
    o.by_bucket = o.by_bucket[:3] + (pack_as("torch", torch.empty(o.out_features, o.in_features,
                                                                    dtype=torch.bfloat16)),)
    stack = decode_step.FusedDecodeStack.build(ex.model, ex.backend, ex.kv_caches, ex.dtype)
    stack.measure_uncovered(timer=_fake_timer(stack, 0.001, 0.002)[0])
    assert stack.covered == (True, True, True, False)
    assert o.by_bucket[3].kind == "torch"


@needs_fused
def test_the_same_weight_on_another_layout_ends_the_fused_rows(tiny_model, monkeypatch):
    """A bucket whose gemm_bf16 weight is another copy than the one the C step reads."""
    from hetero_infer.kernels.cpu.linear import pack_as

    folder, _ = tiny_model("llama-hd64")
    ex = _engine(folder, monkeypatch, True).engine.executor
    qkv = ex.model.layers[0].self_attn.qkv_proj
    copy = pack_as("gemm_bf16", torch.zeros(qkv.out_features, qkv.in_features, dtype=torch.bfloat16))
    qkv.by_bucket = qkv.by_bucket[:2] + (copy, copy)
    built = decode_step.FusedDecodeStack.build(ex.model, ex.backend, ex.kv_caches, ex.dtype)
    assert built.covered == (True, True, False, False)


def test_fused_stack_stays_off_where_its_preconditions_fail(tiny_model, monkeypatch):
    folder, _ = tiny_model("llama-hd64")
    assert _engine(folder, monkeypatch, False).engine.executor.cpu_decode is None
    assert _engine(folder, monkeypatch, False, dtype="float32").engine.executor.cpu_decode is None
    qwen3, _ = tiny_model("qwen3")
    assert _engine(qwen3, monkeypatch, True).engine.executor.cpu_decode is None
    assert _engine(qwen3, monkeypatch, True, dtype="float32").engine.executor.cpu_decode is None
    monkeypatch.setenv("HETERO_INFER_ONEDNN", "0")  # plain nn.Linear layers: nothing packed for gemm_bf16
    assert _engine(folder, monkeypatch, True).engine.executor.cpu_decode is None


@needs_fused_f32
def test_float32_linears_on_onednn_keep_the_per_op_path(tiny_model, monkeypatch):
    folder, _ = tiny_model("llama-hd64")
    assert _engine(folder, monkeypatch, True, dtype="float32").engine.executor.cpu_decode is not None
    monkeypatch.setenv("HETERO_INFER_CPU_LINEAR", "onednn")
    llm = LLM(str(folder), device="cpu", dtype="float32", max_num_blocks=64)
    assert llm.engine.executor.cpu_decode is None
    assert llm.engine.executor.cpu_paths["decode_step"] == "per op"


@needs_fused
def test_a_layer_on_another_kernel_everywhere_keeps_the_per_op_path(tiny_model, monkeypatch):
    from hetero_infer.kernels.cpu.linear import pack_as

    folder, _ = tiny_model("llama-hd64")
    llm = _engine(folder, monkeypatch, True)
    ex = llm.engine.executor
    down = ex.model.layers[1].mlp.down_proj
    weight = torch.empty(down.out_features, down.in_features, dtype=torch.bfloat16)
    down.by_bucket = (pack_as("torch", weight),) * 4
    assert decode_step.FusedDecodeStack.build(ex.model, ex.backend, ex.kv_caches, ex.dtype) is None
