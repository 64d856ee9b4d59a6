"""LoRA decode steps in the CUDA-graph decode runner, checked on the CPU (no GPU here; tests/lora/test_lora_gpu.py
replays the captured graphs on one): the forward a LoRA graph records (`LoRAModel.graph_step`: every target's
kernels, the static slot buffer's first rows as the token -> slot map) run by the decode runner eagerly through the
Triton kernels in Triton's interpreter decodes PEFT's tokens for adapters mixed with the base; the slot buffer's
padding rows are -1 whatever ran before; a step's `live` flags and map are back after a graph step; a slot's
projections its adapter leaves alone hold zeros (what makes every target's kernels in a graph add nothing there)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from lora_testing import peft_reference
from quant_testing import hf_greedy

from hetero_infer import LLM, LoRARequest
from hetero_infer.contracts.step import StepPlan


@pytest.fixture(scope="module")
def engine(tiny_model, adapter):
    folder, _ = tiny_model("llama")
    llm = LLM(str(folder), device="cpu", dtype="float32", enable_lora=True, max_loras=1, block_size=4,
              max_num_batched_tokens=32)
    lora = llm.engine.executor.lora
    for i, name in enumerate(("attn8", "all16")):
        lora.add(LoRARequest(name, i + 1, str(adapter("llama", name))))
    yield lora
    llm.shutdown()


def _step(lens: list[int], adapters: dict[int, str]) -> StepPlan:
    return StepPlan(seq_ids=list(range(len(lens))), token_ids=[[7] * n for n in lens], adapter_ids=adapters)


def _qkv(lora) -> list[bool]:
    """Whether each target is a fused q/k/v projection (the only ones `attn8`, on q and v, has weights for)."""
    return [t.slices[0][0] == "q_proj" for t in lora.targets]


def test_static_slot_map_padding_and_graph_step_state(engine):
    lora = engine
    with pytest.raises(ValueError, match="static_slots"):  # the CPU keeps no static map until a runner asks
        with lora.graph_step(4):
            pass
    with pytest.raises(ValueError, match="slot buffer"):
        lora.static_slots(33)  # more rows than a step has tokens
    lora.static_slots(8)
    buffer = lora._slot_buffer
    # a prefill of 12 tokens under the adapter, then a decode step of 3 rows: rows 3.. are -1 again up to 8
    assert lora.begin_step(_step([5, 7], {0: "all16", 1: "all16"}))
    assert buffer[:12].tolist() == [0] * 12
    lora.end_step()
    assert lora.begin_step(_step([1, 1, 1], {1: "attn8"}))  # one slot: attn8 replaces all16 in slot 0
    assert buffer[:8].tolist() == [-1, 0, -1, -1, -1, -1, -1, -1]
    assert lora._slots.tolist() == [-1, 0, -1] and lora._groups is None
    assert [t.live for t in lora.targets] == _qkv(lora)  # eagerly only q/k/v run the kernels
    with lora.graph_step(8):  # as a graph records it: every target, the buffer's first 8 rows
        assert lora.active and all(t.live for t in lora.targets)
        assert lora._slots.data_ptr() == buffer.data_ptr() and lora._slots.shape == (8,)
    assert lora.active and [t.live for t in lora.targets] == _qkv(lora)  # the step's own state is back
    assert lora._slots.tolist() == [-1, 0, -1]
    lora.end_step()
    assert not lora.active
    with pytest.raises(ValueError, match="graph_step"):
        with lora.graph_step(9):
            pass
    # attn8 took the slot all16 filled: every other projection's slot 0 was zeroed, so a graph that runs their
    # kernels too adds nothing there
    for target, qkv in zip(lora.targets, _qkv(lora)):
        assert (0 in target.filled) == qkv
        if not qkv:
            assert not target.a[0].any() and not target.b[0].any()
    assert not lora.begin_step(_step([1, 1], {}))  # the base model alone: no LoRA work, the map untouched
    assert buffer[:3].tolist() == [-1, 0, -1]


SCRIPT = """
import json, sys
from hetero_infer import LLM, LoRARequest, SamplingParams
from hetero_infer.worker.runner.cuda_graphs import DecodeRunner
folder, adapters, prompts, max_tokens, names = json.loads(sys.argv[1])
llm = LLM(folder, device="cpu", dtype="float32", enable_lora=True, max_loras=2, block_size=4, max_model_len=64,
          max_num_batched_tokens=32)
ex = llm.engine.executor
assert ex.backend.name == "triton" and ex.decode_runner is None  # the runner is CUDA-only: attach one by hand
ex.decode_runner = runner = DecodeRunner(ex.model, ex.backend, ex.kv_caches, max_batch=8, max_blocks_per_seq=16,
                                         device=ex.device, use_graphs=False)
runner.attach_lora(ex.lora)
reqs = {n: LoRARequest(n, i + 1, p) for i, (n, p) in enumerate(adapters.items())}
params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in max_tokens]
outs = llm.generate(prompt_token_ids=prompts, sampling_params=params,
                    lora_request=[reqs.get(n) for n in names])
print(json.dumps({"tokens": [o.outputs[0].token_ids for o in outs], "steps": runner.num_steps,
                  "lora_steps": runner.lora_steps}))
"""


@pytest.mark.timeout(900)
def test_lora_decode_steps_in_the_graph_runner_match_peft(tiny_model, adapter):
    folder, base = tiny_model("llama")
    adapters = {n: str(adapter("llama", n)) for n in ("attn8", "all16")}
    # 5 sequences finishing one by one (decode batches 5 in bucket 8, 4, 3 in bucket 4, 2, 1); the base sequences
    # last longest, so the last steps have no adapter (the base graph)
    names = ["attn8", None, "all16", "attn8", None]
    prompts = [[101 + 7 * i + j for j in range(n)] for i, n in enumerate([6, 1, 13, 4, 9])]
    max_tokens = [3, 6, 2, 4, 5]
    env = {**os.environ, "TRITON_INTERPRET": "1", "HETERO_INFER_KERNELS": "triton"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps([str(folder), adapters, prompts, max_tokens,
                                                                      names])],
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["lora_steps"] >= 3 and result["steps"] > result["lora_steps"]  # both kinds of decode step ran
    with torch.no_grad():
        expected = [hf_greedy(base if n is None else peft_reference(base, adapters[n]), p, m)
                    for n, p, m in zip(names, prompts, max_tokens)]
    assert result["tokens"] == expected
