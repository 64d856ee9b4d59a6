"""Temperature / top-k / top-p / min-p steps sampled where the logits are (`Sampler.sample_on_device`): the torch
executor with the overlap forced on the CPU (the CUDA control flow) never calls the host sampler for them, its
tokens reach the host through the step handle like argmax's, and seeded requests through `LLM.generate` give
the tokens of the host path (`samples_on_device` forced off). On CUDA: no synchronisation in `execute_async`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_hf_equivalence import random_prompts

from hetero_infer import LLM, SamplingParams
from hetero_infer.worker.runner import sampler as sampler_module
from hetero_infer.worker.runner.sampler import Sampler
from hetero_infer.worker.runner.step_handle import DeviceStep

PARAMS = [
    SamplingParams(temperature=0.8, top_p=0.9, seed=11, max_tokens=8, ignore_eos=True),
    SamplingParams(temperature=1.2, top_k=20, seed=12, max_tokens=8, ignore_eos=True, n=2),
    SamplingParams(temperature=1.0, top_p=0.95, min_p=0.05, seed=13, max_tokens=8, ignore_eos=True),
    SamplingParams(temperature=0.6, seed=14, max_tokens=8, ignore_eos=True),
    SamplingParams(temperature=1.0, top_k=50, top_p=0.7, seed=15, max_tokens=8, ignore_eos=True),
]


def _record(ex, monkeypatch, no_sync: bool = False) -> tuple[list[int], list[type]]:
    """The sizes of the batches the host sampler gets, and the type of each step handle `execute_async` returns
    (with `no_sync`, each launch runs under CUDA's sync debug mode "error")."""
    host_calls, handles = [], []
    host = Sampler.__call__
    monkeypatch.setattr(Sampler, "__call__", lambda self, logits, rows: host_calls.append(len(rows)) or host(
        self, logits, rows))
    launch = ex.execute_async

    def recording_launch(sched, sampling):
        if no_sync:
            torch.cuda.set_sync_debug_mode("error")
        try:
            handle = launch(sched, sampling)
        finally:
            if no_sync:
                torch.cuda.set_sync_debug_mode(0)
        handles.append(type(handle))
        return handle
    ex.execute_async = recording_launch
    return host_calls, handles


def test_seeded_temperature_steps_skip_the_host_sampler_and_keep_their_tokens(tiny_model, monkeypatch):
    folder, _ = tiny_model("llama")
    llm = LLM(str(folder), device="cpu", dtype="float32", block_size=4, max_num_blocks=64,
              max_num_batched_tokens=32, memory_threshold=1.0)
    ex, engine = llm.engine.executor, llm.engine
    ex.overlaps = engine._overlap = True  # tokens stay a tensor, the next step's PLACEHOLDERs patched from it
    host_calls, handles = _record(ex, monkeypatch)
    prompts = random_prompts([9, 3, 14, 6, 11], seed=2)

    def run():
        return [[c.token_ids for c in o.outputs] for o in llm.generate(prompt_token_ids=prompts,
                                                                        sampling_params=PARAMS)]
    on_device = run()
    assert host_calls == [] and handles and set(handles) == {DeviceStep}
    monkeypatch.setattr(sampler_module, "samples_on_device", lambda *args: False)
    handles.clear()
    on_host = run()
    assert host_calls and DeviceStep not in handles  # the host path did run, with its own handles
    assert on_device == on_host
    assert all(len(t) == 8 for o in on_device for t in o) and len({tuple(t) for o in on_device for t in o}) > 1
    assert engine.block_manager.num_free_blocks == 64


@pytest.mark.gpu
@pytest.mark.parametrize("eager", [False, True], ids=["graphs", "enforce-eager"])
def test_cuda_sampling_steps_synchronise_only_in_result(eager, monkeypatch):
    """On CUDA, temperature / top-k / top-p / min-p steps (seeded and not) are launched with no synchronisation
    (sync debug mode "error" around `execute_async`), never call the host sampler, return a `DeviceStep`, and a
    seeded request gives the same tokens twice."""
    shape = Path(__file__).resolve().parents[2] / "benchmarks" / "shapes" / "tiny-qwen3"
    llm = LLM(str(shape), load_format="dummy", skip_tokenizer_init=True, device="cuda", dtype="bfloat16",
              max_num_blocks=256, max_num_seqs=16, max_num_batched_tokens=64, enforce_eager=eager)
    ex = llm.engine.executor
    host_calls, handles = _record(ex, monkeypatch, no_sync=True)
    prompts = [[(7 * i + 13 * j) % 4000 + 10 for j in range(n)] for i, n in enumerate([5, 70, 33, 1, 120, 17])]
    params = [SamplingParams(temperature=0.8, top_p=0.9, seed=1, max_tokens=12, ignore_eos=True),
              SamplingParams(temperature=1.1, top_k=40, max_tokens=12, ignore_eos=True),
              SamplingParams(temperature=0.7, min_p=0.05, seed=2, max_tokens=12, ignore_eos=True),
              SamplingParams(temperature=1.0, top_k=100, top_p=0.8, seed=3, max_tokens=12, ignore_eos=True),
              SamplingParams(temperature=0.9, max_tokens=12, ignore_eos=True),
              SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)]
    first = llm.generate(prompt_token_ids=prompts, sampling_params=params)
    assert all(len(o.outputs[0].token_ids) == 12 for o in first)
    assert host_calls == [] and set(handles) == {DeviceStep}
    again = llm.generate(prompt_token_ids=prompts, sampling_params=params)
    seeded = [i for i, p in enumerate(params) if p.seed is not None or p.temperature == 0]
    assert [first[i].outputs[0].token_ids for i in seeded] == [again[i].outputs[0].token_ids for i in seeded]
