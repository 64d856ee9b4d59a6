"""LoRA adapters on the torch executor against transformers + peft (`PeftModel`): greedy float32 tokens identical
for random, non-zero adapters of two ranks on different target sets (both PEFT scalings), each alone and all of
them mixed with the base model in one batch, under preemption and prefix reuse, on dense and MoE families and on
INT8 / INT4 base weights."""

from __future__ import annotations

import random

import pytest
from lora_testing import peft_reference
from quant_testing import dequantized_hf, hf_greedy

from hetero_infer import LLM, LoRARequest, SamplingParams
from hetero_infer.contracts.lora import LoRAAdapterError

MAX_NEW = 8
GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
ADAPTERS = ("attn8", "all16", "mlp8rs")


def prompts(lengths, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(100, 49000) for _ in range(n)] for n in lengths]


def loras(adapter, arch, names):
    return {n: LoRARequest(n, i + 1, str(adapter(arch, n))) for i, n in enumerate(names)}


def engine(folder, **kw) -> LLM:
    return LLM(str(folder), device="cpu", dtype="float32", enable_lora=True, block_size=4, **kw)


def expected(base, adapter_folder, prompt):
    model = base if adapter_folder is None else peft_reference(base, adapter_folder)
    return hf_greedy(model, prompt, MAX_NEW)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_each_adapter_alone_and_all_mixed_with_the_base(tiny_model, adapter, arch):
    folder, base = tiny_model(arch)
    reqs = loras(adapter, arch, ADAPTERS)
    batch = prompts([5, 19, 11, 3, 26, 9, 14, 7], seed=1)
    per_prompt = [None, reqs["attn8"], reqs["all16"], reqs["mlp8rs"], reqs["all16"], None, reqs["attn8"],
                  reqs["mlp8rs"]]
    want = [expected(base, None if r is None else r.lora_path, p) for p, r in zip(batch, per_prompt)]
    assert len({tuple(w) for w in want[:4]}) == 4  # each adapter changes the model's tokens
    llm = engine(folder, max_loras=3)
    for name, req in reqs.items():  # each alone
        got = llm.generate(prompt_token_ids=[batch[1]], sampling_params=GREEDY, lora_request=req)[0]
        assert got.outputs[0].token_ids == expected(base, req.lora_path, batch[1]), name
    mixed = llm.generate(prompt_token_ids=batch, sampling_params=GREEDY, lora_request=per_prompt)
    assert [o.outputs[0].token_ids for o in mixed] == want


def test_more_adapters_than_slots_under_preemption(tiny_model, adapter):
    """Three adapters and the base over two slots, a KV pool that forces preemptions and chunked prefills: every
    request still decodes PEFT's tokens, slots are reloaded as adapters come and go, and no block stays held."""
    folder, base = tiny_model("llama")
    reqs = list(loras(adapter, "llama", ADAPTERS).values())
    batch = prompts([13, 9, 17, 6, 11, 15, 8, 10], seed=2)
    per_prompt = [reqs[i % 3] if i % 4 else None for i in range(8)]
    llm = engine(folder, max_loras=2, max_cpu_loras=2, max_num_blocks=16, max_num_batched_tokens=12)
    outs = llm.generate(prompt_token_ids=batch, sampling_params=GREEDY, lora_request=per_prompt)
    assert [o.outputs[0].token_ids for o in outs] == [
        expected(base, None if r is None else r.lora_path, p) for p, r in zip(batch, per_prompt)]
    e = llm.engine
    assert e.scheduler.num_preemptions_total > 0 and e.executor.lora.slot_loads >= 3
    assert e.block_manager.num_free_blocks == e.block_manager.num_blocks


def test_prefix_reuse_only_under_the_same_adapter(tiny_model, adapter):
    folder, base = tiny_model("llama")
    reqs = loras(adapter, "llama", ("attn8", "all16"))
    (prompt,) = prompts([18], seed=3)
    llm = engine(folder, max_loras=2)
    runs = []
    for lora in (reqs["attn8"], reqs["all16"], None, reqs["attn8"], reqs["all16"]):
        out = llm.generate(prompt_token_ids=[prompt], sampling_params=GREEDY, lora_request=lora)[0]
        runs.append((out.num_cached_tokens, out.outputs[0].token_ids))
        assert out.outputs[0].token_ids == expected(base, None if lora is None else lora.lora_path, prompt)
    # first time under each adapter (and the base): nothing cached; again under the same adapter: its blocks
    assert [c for c, _ in runs] == [0, 0, 0, 16, 16]


def test_moe_family_attention_adapters(tiny_model, adapter):
    folder, base = tiny_model("qwen3-moe")
    req = LoRARequest("attn", 1, str(adapter("qwen3-moe", "attn8", targets=["q_proj", "k_proj", "v_proj", "o_proj"])))
    batch = prompts([7, 12], seed=4)
    llm = engine(folder)
    outs = llm.generate(prompt_token_ids=batch, sampling_params=GREEDY, lora_request=[req, None])
    assert [o.outputs[0].token_ids for o in outs] == [expected(base, req.lora_path, batch[0]),
                                                      expected(base, None, batch[1])]
    mlp = LoRARequest("mlp", 2, str(adapter("qwen3-moe", "all16")))
    with pytest.raises(LoRAAdapterError, match="mixture-of-experts"):
        llm.add_lora(mlp)
    assert llm.list_loras() == [req]


@pytest.mark.parametrize("method", ["int8", "int4"])
def test_quantized_base_weights(tiny_model, adapter, method):
    """INT8 / INT4 base weights: the adapter's update applies on the activations; PEFT on the dequantized base."""
    folder, hf = tiny_model("qwen2")
    req = LoRARequest("all", 1, str(adapter("qwen2", "all16")))
    batch = prompts([9, 15], seed=5)
    llm = engine(folder, quantization=method)
    outs = llm.generate(prompt_token_ids=batch, sampling_params=GREEDY, lora_request=[req, None])
    base = dequantized_hf(hf, llm)
    assert [o.outputs[0].token_ids for o in outs] == [expected(base, req.lora_path, batch[0]),
                                                      expected(base, None, batch[1])]


def test_bad_adapters_change_nothing(tiny_model, adapter, tmp_path):
    import shutil

    folder, _ = tiny_model("llama")
    good = LoRARequest("good", 1, str(adapter("llama", "attn8")))
    llm = engine(folder, max_lora_rank=8)
    llm.add_lora(good)
    big = LoRARequest("big", 2, str(adapter("llama", "all16")))
    with pytest.raises(LoRAAdapterError, match="rank 16 .*> max_lora_rank 8"):
        llm.add_lora(big)
    broken = tmp_path / "broken"
    shutil.copytree(good.lora_path, broken)
    (broken / "adapter_model.safetensors").unlink()
    with pytest.raises(LoRAAdapterError, match="no weights"):
        llm.generate(prompt_token_ids=[[1, 2, 3]], sampling_params=GREEDY,
                     lora_request=LoRARequest("broken", 3, str(broken)))
    assert llm.list_loras() == [good] and set(llm.engine.executor.lora.host) == {"good"}
    assert not llm.engine.requests
