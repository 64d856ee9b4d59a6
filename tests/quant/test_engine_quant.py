"""The engine with --quantization on random-weight models: greedy tokens equal Hugging Face's with the
dequantized weights; weight memory reported; the executor's prompt forward and memory profile step."""

from __future__ import annotations

import random

import pytest
import torch
from quant_testing import forced_greedy, hf_greedy

from hetero_infer import LLM, SamplingParams
from hetero_infer.worker.quantization import QuantizedLinear

MAX_NEW = 8
HF_PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def prompts(lengths, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(100, 49000) for _ in range(n)] for n in lengths]


def dequantized_hf(hf, method: str):
    """A copy of the HF model whose projection weights went through QuantizedLinear and back."""
    import copy

    model = copy.deepcopy(hf)
    for name, module in list(model.named_modules()):
        if name.rsplit(".", 1)[-1] in HF_PROJ:
            with torch.no_grad():
                module.weight.copy_(QuantizedLinear.from_linear(module, method).dequantized_weight())
    return model


@pytest.mark.parametrize("method", ["int8", "int4"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_quantized_engine_matches_hf_with_dequantized_weights(tiny_model, arch, method):
    folder, hf = tiny_model(arch)
    batch = prompts([3, 17, 40, 1], seed=1)
    llm = LLM(str(folder), device="cpu", dtype="float32", quantization=method, block_size=8)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    ours = [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=batch, sampling_params=params)]
    reference = dequantized_hf(hf, method)
    assert ours == [hf_greedy(reference, p, MAX_NEW) for p in batch]
    # the quantization is not a no-op: the float model decodes differently somewhere
    assert ours != [hf_greedy(hf, p, MAX_NEW) for p in batch]

    ex = llm.engine.executor
    dense = LLM(str(folder), device="cpu", dtype="float32", max_num_blocks=64).engine.executor
    assert ex.weight_bytes < dense.weight_bytes
    layers = ex.model.layers
    assert all(isinstance(layer.mlp.down_proj, QuantizedLinear) for layer in layers)


def test_forward_prompts_matches_decoding(tiny_model):
    folder, hf = tiny_model("llama")
    batch = prompts([5, 20, 2], seed=3)
    llm = LLM(str(folder), device="cpu", dtype="float32", block_size=4)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    outs = [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=batch, sampling_params=params)]
    assert forced_greedy(llm, batch, outs) == outs  # teacher forcing with its own greedy output


def test_profile_run_covers_the_largest_step(tiny_model):
    folder, _ = tiny_model("qwen2")
    # 300 tokens over max_model_len 128: three dummy sequences in one step
    llm = LLM(str(folder), device="cpu", dtype="float32", max_model_len=128, max_num_batched_tokens=300,
              max_num_seqs=4)
    ex = llm.engine.executor
    before = ex.kv_cache.clone()
    ex.profile_run()
    assert torch.equal(ex.kv_cache, before)  # a temporary cache: the engine's is untouched
    hidden = ex.forward_prompts([[1] * 128, [1] * 128, [1] * 44])
    assert hidden.shape == (300, 128) and bool(torch.isfinite(hidden).all())
    # the three sequences are independent prompts: equal prefixes give equal states
    torch.testing.assert_close(hidden[128:172], hidden[256:300])
