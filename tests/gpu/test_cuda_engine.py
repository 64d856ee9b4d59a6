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
BF16_MIN_AGREEMENT = 0.9  # greedy tokens matched before the first mismatch, over all prompts


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


@pytest.mark.parametrize("arch", ARCHS)
def test_float32_is_token_identical_to_hf(tiny_model, arch):
    folder, hf = tiny_model(arch)
    batch = prompts([3, 17, 40, 1, 29, 64], seed=1)
    llm = cuda_llm(folder, dtype="float32")
    assert llm.engine.executor.backend.name == "triton" and llm.engine.executor.decode_runner.graphs
    reference = hf_on_cuda(hf, torch.float32)
    assert engine_greedy(llm, batch) == [hf_greedy(reference, p, MAX_NEW) for p in batch]


@pytest.mark.parametrize("arch", ARCHS)
def test_bfloat16_agrees_with_hf(tiny_model, arch):
    folder, hf = tiny_model(arch)
    batch = prompts([3, 17, 40, 1, 29, 64, 100, 7], seed=2)
    ours = engine_greedy(cuda_llm(folder, dtype="bfloat16"), batch)
    reference = hf_on_cuda(hf, torch.bfloat16)
    theirs = [hf_greedy(reference, p, MAX_NEW) for p in batch]
    agreement = prefix_agreement(theirs, ours)
    print(f"\n{arch} bf16: greedy agreement with HF {agreement:.3f} (until the first mismatch), "
          f"{position_agreement(theirs, ours):.3f} position-wise")
    assert agreement >= BF16_MIN_AGREEMENT


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
