"""The engine on CUDA (run on a GPU machine: `python -m pytest -m gpu tests/gpu -s`).

Random-weight models against Hugging Face transformers on the same GPU (float32 token-identical,
bfloat16 agreement rate printed and bounded), CUDA-graph decode against eager (identical tokens,
also with quantized weights), the KV pool sized from the memory profile, and the INT8/INT4
agreement of tests/quant on the GPU kernels.
"""

from __future__ import annotations

import copy
import random

import pytest
import torch
from quant_testing import PROMPTS, forced_greedy, hf_greedy, position_agreement, prefix_agreement

from hetero_infer import LLM, SamplingParams

pytestmark = pytest.mark.gpu

ARCHS = ["llama", "qwen2"]
MAX_NEW = 16


def prompts(lengths, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(100, 49000) for _ in range(n)] for n in lengths]


def engine_greedy(llm, batch, max_new=MAX_NEW):
    params = SamplingParams(temperature=0.0, max_tokens=max_new, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=batch, sampling_params=params)]


def cuda_llm(folder, **kwargs) -> LLM:
    kwargs = {"device": "cuda", "max_num_blocks": 512, "max_num_seqs": 64, **kwargs}
    return LLM(str(folder) if folder else None, **kwargs)


def hf_on_cuda(hf, dtype):
    return copy.deepcopy(hf).to("cuda", dtype)


@pytest.mark.parametrize("arch", [*ARCHS, "qwen3", "qwen3-moe", "mixtral"])  # MoE: the Triton fused_moe in graphs
def test_float32_is_token_identical_to_hf(tiny_model, arch):
    folder, hf = tiny_model(arch)
    batch = prompts([3, 17, 40, 1, 29, 64], seed=1)
    llm = cuda_llm(folder, dtype="float32")
    assert llm.engine.executor.backend.name == "triton" and llm.engine.executor.decode_runner.graphs
    reference = hf_on_cuda(hf, torch.float32)
    assert engine_greedy(llm, batch) == [hf_greedy(reference, p, MAX_NEW) for p in batch]


def float64_logits(hf, seqs):
    """The float64 reference: transformers' model in float64 on the CPU, logits of every position."""
    model = copy.deepcopy(hf).to("cpu", torch.float64)
    with torch.inference_mode():
        return [model(torch.tensor([s])).logits[0] for s in seqs]


def relative_rms(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    diff = sum(float(((g.double().cpu() - w) ** 2).sum()) for g, w in zip(got, want, strict=True))
    return (diff / sum(float((w**2).sum()) for w in want)) ** 0.5


@pytest.mark.parametrize("arch", ARCHS)
def test_bfloat16_is_as_close_to_float64_as_transformers(tiny_model, arch):
    """bfloat16 against a float64 reference, beside transformers' own bfloat16 on the same GPU.

    Comparing our bf16 greedy tokens with transformers' bf16 tokens compares two roundings of a chaotic
    random model: on the tiny llama, transformers' bf16 agrees with its own float32 on only ~0.7 of the
    free-running tokens (measured on CPU and GPU; docs/kernels.md). What bf16 must not do is lose more
    accuracy than transformers' bf16 does: the logits' relative RMS error against float64, and the
    teacher-forced greedy tokens against float64's, over the same prompts and continuations."""
    folder, hf = tiny_model(arch)
    batch = prompts([3, 17, 40, 1, 29, 64, 100, 7], seed=2)
    hf32 = hf_on_cuda(hf, torch.float32)
    continuations = [hf_greedy(hf32, p, MAX_NEW) for p in batch]
    seqs = [p + c[:-1] for p, c in zip(batch, continuations, strict=True)]
    want = float64_logits(hf, seqs)
    llm = cuda_llm(folder, dtype="bfloat16")
    ex = llm.engine.executor
    with torch.inference_mode():
        hidden = ex.forward_prompts(seqs)
        ours, row = [], 0
        for s in seqs:
            ours.append(ex.model.compute_logits(hidden[row : row + len(s)]).float())
            row += len(s)
        hf16 = hf_on_cuda(hf, torch.bfloat16)
        theirs = [hf16(torch.tensor([s], device="cuda")).logits[0].float() for s in seqs]
    err_ours, err_theirs = relative_rms(ours, want), relative_rms(theirs, want)
    top = [w.argmax(-1).tolist() for w in want]
    agree_ours = position_agreement(top, [o.argmax(-1).tolist() for o in ours])
    agree_theirs = position_agreement(top, [t.argmax(-1).tolist() for t in theirs])
    free_ours = engine_greedy(llm, batch)
    free_theirs = [hf_greedy(hf16, p, MAX_NEW) for p in batch]
    print(f"\n{arch} bf16 vs float64: logits relative RMS error ours {err_ours:.4f}, transformers {err_theirs:.4f}; "
          f"greedy tokens equal to float64's (teacher-forced) ours {agree_ours:.3f}, transformers {agree_theirs:.3f}; "
          f"free-running agreement with float32: ours {prefix_agreement(continuations, free_ours):.3f}, "
          f"transformers {prefix_agreement(continuations, free_theirs):.3f}")
    assert err_ours <= 1.25 * err_theirs
    assert agree_ours >= agree_theirs - 0.03
    assert agree_ours >= 0.9


@pytest.mark.parametrize("quantization", [None, "int8", "int4"])
def test_cuda_graphs_and_eager_give_identical_tokens(tiny_model, quantization):
    folder, _ = tiny_model("llama")
    # 11 sequences of different lengths finish at different steps: decode batches of 11 down to 1
    # run through the buckets 16, 8, 4, 2, 1 (padding rows included)
    batch = prompts([5, 30, 1, 17, 64, 9, 2, 40, 23, 11, 3], seed=3)
    params = [SamplingParams(temperature=0.0, max_tokens=4 + 3 * i, ignore_eos=True) for i in range(len(batch))]
    runs = {}
    for eager in (False, True):
        llm = cuda_llm(folder, dtype="bfloat16", quantization=quantization, enforce_eager=eager)
        runner = llm.engine.executor.decode_runner
        assert bool(runner.graphs) != eager
        runs[eager] = [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=batch, sampling_params=params)]
        if not eager:
            assert runner.num_steps >= 30  # every bucket has a graph: all replays
        del llm
    assert runs[False] == runs[True]


@pytest.mark.xdist_group("gpu-memory")  # reads the free memory: not beside the 16 GB shape of test_dummy_weights_gpu
@pytest.mark.parametrize("utilization", [0.3, 0.6])
def test_kv_pool_sized_from_the_memory_profile(tiny_model, utilization):
    folder, _ = tiny_model("llama")
    free_before, total = torch.cuda.mem_get_info()
    torch.cuda.reset_peak_memory_stats()
    # 256-token blocks: the tiny model's 8 KiB per 16 tokens would make millions of blocks
    llm = cuda_llm(folder, dtype="bfloat16", max_num_blocks=None, gpu_memory_utilization=utilization,
                   enforce_eager=True, block_size=256)
    ex = llm.engine.executor
    kv_bytes = ex.num_blocks * ex.block_bytes
    budget = utilization * total
    # everything torch holds stays within the budget, and the pool takes most of what is left
    assert torch.cuda.memory_allocated() <= budget
    assert kv_bytes >= 0.8 * (min(budget, free_before) - ex.weight_bytes - (1 << 30))
    assert engine_greedy(llm, prompts([10, 20], seed=4), max_new=4)


@pytest.mark.parametrize("method", ["int8", "int4"])
def test_quantized_agreement_on_gpu(method):
    """tests/quant/test_agreement.py with the Triton W8A16 / W4A16 kernels."""
    from test_agreement import BOUNDS
    from test_agreement import MAX_NEW as N

    bf16 = cuda_llm(None, dtype="bfloat16")
    tok = bf16.get_tokenizer()
    chat = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True) for p in PROMPTS]
    ref = engine_greedy(bf16, chat, max_new=N)
    ref_forced = forced_greedy(bf16, chat, ref)
    bf16_bytes = bf16.engine.executor.weight_bytes
    del bf16
    llm = cuda_llm(None, dtype="bfloat16", quantization=method)
    agreement = position_agreement(ref_forced, forced_greedy(llm, chat, ref))
    free = prefix_agreement(ref, engine_greedy(llm, chat, max_new=N))
    ex = llm.engine.executor
    print(f"\n{method} on {torch.cuda.get_device_name()}: teacher-forced {agreement:.3f}, free-running {free:.3f}; "
          f"weights {ex.weight_bytes / 2**20:.1f} MiB (bf16 {bf16_bytes / 2**20:.1f} MiB)")
    assert agreement > BOUNDS[method]
