"""The engine with --quantization on random-weight models: greedy tokens equal Hugging Face's with the
dequantized weights; weight memory reported; the executor's prompt forward and memory profile step."""

from __future__ import annotations

import random

import pytest
import torch
from quant_testing import dequantized_hf, forced_greedy, hf_greedy

from hetero_infer import LLM, SamplingParams
from hetero_infer.worker.quant.calibration import CONVERSATIONS
from hetero_infer.worker.quant.quantize import QuantizedLinear, calibration_tokens

MAX_NEW = 8


def prompts(lengths, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(100, 49000) for _ in range(n)] for n in lengths]


@pytest.mark.parametrize("method", ["int8", "int4"])
@pytest.mark.parametrize("arch", [pytest.param("llama", marks=pytest.mark.slow), "qwen2"])  # llama: ~110 s more
def test_quantized_engine_matches_hf_with_dequantized_weights(tiny_model, arch, method):
    folder, hf = tiny_model(arch)
    batch = prompts([3, 17, 40, 1], seed=1)
    llm = LLM(str(folder), device="cpu", dtype="float32", quantization=method, block_size=8)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    ours = [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=batch, sampling_params=params)]
    reference = dequantized_hf(hf, llm)
    assert ours == [hf_greedy(reference, p, MAX_NEW) for p in batch]
    # the quantization is not a no-op: the weights moved; with INT4 the float model decodes differently somewhere
    # (INT8 after GPTQ is close enough to decode the same tokens)
    assert not torch.equal(reference.model.layers[0].mlp.down_proj.weight, hf.model.layers[0].mlp.down_proj.weight)
    if method == "int4":
        assert ours != [hf_greedy(hf, p, MAX_NEW) for p in batch]

    ex = llm.engine.executor
    dense = LLM(str(folder), device="cpu", dtype="float32", max_num_blocks=64).engine.executor
    assert ex.weight_bytes < dense.weight_bytes
    layers = ex.model.layers
    assert all(isinstance(layer.mlp.down_proj, QuantizedLinear) for layer in layers)
    # GPTQ-calibrated: the model folder's tokenizer renders the calibration conversations
    assert len(calibration_tokens(ex.model)) == len(CONVERSATIONS)


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


@pytest.mark.parametrize("method", [pytest.param("int8", marks=pytest.mark.slow), "int4"])  # int8: ~50 s more
def test_auto_dtype_of_quantized_models_on_cpu_runs_the_cpu_gemm(tiny_model, method):
    """`--dtype auto` stays float32 on the CPU, except for W8A16/W4A16 models where the CPU has their bfloat16
    GEMM: there the activations are bfloat16 and every projection runs it (not the slow float32 reference)."""
    from hetero_infer.kernels.cpu import linear as cpu_linear

    folder, _ = tiny_model("llama")
    here = cpu_linear.quantized_gemm_available()
    ex = LLM(str(folder), device="cpu", quantization=method, max_num_blocks=64).engine.executor
    assert ex.dtype == (torch.bfloat16 if here else torch.float32)
    projections = [m for m in ex.model.modules() if isinstance(m, QuantizedLinear)]
    assert projections and all((m.cpu_packed is not None) == here for m in projections)
    assert LLM(str(folder), device="cpu", max_num_blocks=64).engine.executor.dtype == torch.float32
    assert LLM(str(folder), device="cpu", dtype="float32", quantization=method,
               max_num_blocks=64).engine.executor.dtype == torch.float32
    out = LLM(str(folder), device="cpu", quantization=method, max_num_blocks=64).generate(
        prompt_token_ids=prompts([7, 3]), sampling_params=SamplingParams(temperature=0.0, max_tokens=5,
                                                                          ignore_eos=True))
    assert [len(o.outputs[0].token_ids) for o in out] == [5, 5]


@pytest.mark.parametrize("arch, method", [("qwen3-moe", "int4"), ("mixtral", "int8")])
def test_quantized_moe_engine_matches_hf_with_dequantized_weights(tiny_model, arch, method):
    """MoE models quantized (attention projections by GPTQ, every expert round to nearest, routers float):
    greedy tokens equal transformers' with the engine's dequantized weights."""
    import copy

    from hetero_infer.worker.quant.experts import QuantizedExperts

    folder, hf = tiny_model(arch)
    batch = prompts([3, 17, 40, 1], seed=2)
    llm = LLM(str(folder), device="cpu", dtype="float32", quantization=method, block_size=8)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    ours = [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=batch, sampling_params=params)]
    reference = copy.deepcopy(hf)
    with torch.no_grad():
        for layer, mine in zip(reference.model.layers, llm.engine.executor.model.layers, strict=True):
            attn = layer.self_attn
            qkv = mine.self_attn.qkv_proj.dequantized_weight()
            sizes = [attn.q_proj.out_features, attn.k_proj.out_features, attn.v_proj.out_features]
            for linear, w in zip((attn.q_proj, attn.k_proj, attn.v_proj), qkv.split(sizes), strict=True):
                linear.weight.copy_(w)
            attn.o_proj.weight.copy_(mine.self_attn.o_proj.dequantized_weight())
            assert isinstance(mine.mlp.experts, QuantizedExperts) and mine.mlp.experts.method == method
            gate_up, down = mine.mlp.experts.weights()
            layer.mlp.experts.gate_up_proj.copy_(gate_up.dequantized())
            layer.mlp.experts.down_proj.copy_(down.dequantized())
    assert ours == [hf_greedy(reference, p, MAX_NEW) for p in batch]
    assert not torch.equal(reference.model.layers[0].mlp.experts.down_proj, hf.model.layers[0].mlp.experts.down_proj)
