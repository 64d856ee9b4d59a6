"""Steps sampled where the logits are (`Sampler.sample_on_device`: temperature / top-k / top-p / min-p, penalties,
min_tokens, logit_bias, logprobs): the torch executor with the overlap forced on the CPU (the CUDA control flow)
never calls the host sampler for them, its tokens (and logprobs) reach the host through the step handle like
argmax's, and seeded requests through `LLM.generate` give the tokens and logprobs of the host path
(`samples_on_device` forced off). A sampled step's host inputs reach the device in ONE copy from the executor's
sampling staging (counted on a stand-in device, "meta"; and with the staging forced on the CPU, the same tokens);
no pinned memory is allocated after warm-up. On CUDA: no synchronisation in `execute_async`, one sampling copy a
sampled step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_hf_equivalence import random_prompts
from test_step_staging import OpLog
from torch.utils._python_dispatch import TorchDispatchMode

from hetero_infer import LLM, SamplingParams
from hetero_infer.worker.core.sequence import PLACEHOLDER
from hetero_infer.worker.runner import executor as executor_module
from hetero_infer.worker.runner import sampler as sampler_module
from hetero_infer.worker.runner.sampler import PendingTokens, Sampler, SamplingRow, sample_logits
from hetero_infer.worker.runner.staging import StagingArea
from hetero_infer.worker.runner.step_handle import DeviceStep, DoneStep

PARAMS = [
    SamplingParams(temperature=0.8, top_p=0.9, seed=11, max_tokens=8, ignore_eos=True),
    SamplingParams(temperature=1.2, top_k=20, seed=12, max_tokens=8, ignore_eos=True, n=2),
    SamplingParams(temperature=1.0, top_p=0.95, min_p=0.05, seed=13, max_tokens=8, ignore_eos=True),
    SamplingParams(temperature=0.6, seed=14, max_tokens=8, ignore_eos=True),
    SamplingParams(temperature=1.0, top_k=50, top_p=0.7, seed=15, max_tokens=8, ignore_eos=True),
]


class HostToDevice(TorchDispatchMode):
    """Counts host-to-device copies (`copy_` into a device tensor from a CPU one, `_to_copy` of a CPU tensor onto
    a device)."""

    def __init__(self) -> None:
        super().__init__()
        self.copies = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name == "copy_" and args[0].device.type != "cpu" and args[1].device.type == "cpu":
            self.copies += 1
        elif name == "_to_copy" and args[0].device.type == "cpu" and out.device.type != "cpu":
            self.copies += 1
        return out


def _assert_same_outputs(on_device: list, on_host: list) -> None:
    """The same tokens and cumulative logprobs, and the same logprob entries, the numbers within float32 rounding:
    with the overlap a finished request's row is still in the step already in flight, so later steps' matmuls
    may see another batch size than without it, and a CPU GEMM whose blocking follows the batch size (AMD EPYC
    without AVX-512, torch 2.13) rounds the other rows' logits a few ulps apart."""
    assert [[c[0] for c in o] for o in on_device] == [[c[0] for c in o] for o in on_host]
    for o_dev, o_host in zip(on_device, on_host, strict=True):
        for (_, lp_dev, cum_dev), (_, lp_host, cum_host) in zip(o_dev, o_host, strict=True):
            assert (lp_dev is None) == (lp_host is None) and (cum_dev is None) == (cum_host is None)
            if cum_dev is not None:
                assert cum_dev == pytest.approx(cum_host, rel=1e-5, abs=1e-5)
            for step_dev, step_host in zip(lp_dev or [], lp_host or [], strict=True):
                assert step_dev.keys() == step_host.keys()
                assert list(step_dev.values()) == pytest.approx(list(step_host.values()), rel=1e-5, abs=1e-5)


def _record(ex, monkeypatch, no_sync: bool = False) -> tuple[list[int], list[type]]:
    """The sizes of the batches the host sampler gets, and the type of each step handle `execute_async` returns
    (with `no_sync`, each launch runs under CUDA's sync debug mode "error")."""
    host_calls, handles = [], []
    host = Sampler.__call__
    monkeypatch.setattr(Sampler, "__call__", lambda self, logits, rows, pending=None: host_calls.append(len(rows))
                        or host(self, logits, rows, pending))
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


# penalties, min_tokens, logit_bias and logprobs, seeded or greedy, beside plain rows: with the overlap, each step's
# penalised rows count the previous step's token while it is still on the device (a PLACEHOLDER on the host)
PROCESSED = [
    SamplingParams(temperature=0.8, top_p=0.9, seed=21, max_tokens=10, repetition_penalty=1.3, logprobs=3),
    # two biased favourites, taking turns as the penalties count each one (the newest count from the device)
    SamplingParams(temperature=0, max_tokens=10, frequency_penalty=2.0, presence_penalty=2.0,
                   logit_bias={7: 30.0, 8: 30.0}, logprobs=0),
    SamplingParams(temperature=1.1, top_k=30, seed=22, max_tokens=10, min_tokens=6, logit_bias={7: 4.0, 40: -50.0},
                   n=2, stop_token_ids=[9]),
    SamplingParams(temperature=0, max_tokens=10, repetition_penalty=0.8, presence_penalty=-0.5),
    SamplingParams(temperature=0.7, seed=23, max_tokens=10, ignore_eos=True, logprobs=5),
    SamplingParams(temperature=0, max_tokens=10, ignore_eos=True),
]


def test_penalties_and_logprobs_steps_stay_on_device_and_equal_the_host_path(tiny_model, monkeypatch):
    """Penalties, min_tokens, logit_bias and logprobs with the overlap forced on the CPU: no host sampler call,
    every step a `DeviceStep`, no step finished before the next is launched for want of its tokens; token ids equal
    to the host sampler's without the overlap (every token on the host before the next step), logprobs (the
    numbers) and cumulative logprobs within float32 rounding of them (`_assert_same_outputs`)."""
    folder, _ = tiny_model("llama")
    # no prefix caching: a prompt prefilled from cached blocks gets logits a rounding apart (the logprobs show it)
    llm = LLM(str(folder), device="cpu", dtype="float32", block_size=4, max_num_blocks=96,
              max_num_batched_tokens=32, memory_threshold=1.0, enable_prefix_caching=False)
    ex, engine = llm.engine.executor, llm.engine
    ex.overlaps = engine._overlap = True
    host_calls, handles = _record(ex, monkeypatch)
    waits = []
    sampling_rows = engine._sampling_rows
    monkeypatch.setattr(engine, "_sampling_rows", lambda rows: (lambda out: waits.append(out[1]) or out)(
        sampling_rows(rows)))
    prompts = random_prompts([9, 3, 14, 6, 11, 5], seed=4)

    def run():
        outputs = llm.generate(prompt_token_ids=prompts, sampling_params=PROCESSED)
        return [[(c.token_ids, c.logprobs, c.cumulative_logprob) for c in o.outputs] for o in outputs]
    on_device = run()
    assert host_calls == [] and handles and set(handles) == {DeviceStep} and not any(waits)
    # the reference: the host sampler, each step finished before the next is built (the host knows every token)
    monkeypatch.setattr(sampler_module, "samples_on_device", lambda *args: False)
    engine._overlap = False
    handles.clear()
    on_host = run()
    assert host_calls and DoneStep in handles  # the host path did run (an all-greedy step still takes argmax's)
    _assert_same_outputs(on_device, on_host)
    with_logprobs = [i for i, p in enumerate(PROCESSED) if p.logprobs is not None]
    assert all(len(on_device[i][0][1]) == len(on_device[i][0][0]) for i in with_logprobs)
    assert len(on_device[0][0][1][0]) in (3, 4) and on_device[1][0][2] < 0
    assert set(on_device[1][0][0]) == {7, 8}
    assert all(len(t) >= 6 for t, _, _ in on_device[2])  # min_tokens
    assert engine.block_manager.num_free_blocks == 96


def test_the_executor_packs_each_sampled_step_into_its_sampling_staging(tiny_model):
    """The torch executor with its sampling staging forced on (the CUDA path, a CPU buffer standing in for the
    device's) and the overlap on: one sampling copy per step that samples rows (none for argmax-only steps), and
    the same token ids and logprobs as with each array on its own (the CPU's path)."""
    folder, _ = tiny_model("llama")
    llm = LLM(str(folder), device="cpu", dtype="float32", block_size=4, max_num_blocks=96,
              max_num_batched_tokens=32, memory_threshold=1.0, enable_prefix_caching=False)
    ex, engine = llm.engine.executor, llm.engine
    ex.overlaps = engine._overlap = True
    assert not ex.sample_staging.staged  # the CPU's default: nothing to copy
    sampled_steps = []
    launch = ex.execute_async
    ex.execute_async = lambda sched, sampling: sampled_steps.append(sampling is not None) or launch(sched, sampling)
    prompts = random_prompts([9, 3, 14, 6], seed=5)

    def run():
        outputs = llm.generate(prompt_token_ids=prompts, sampling_params=PROCESSED[:4])
        return [[(c.token_ids, c.logprobs) for c in o.outputs] for o in outputs]
    direct = run()
    ex.sample_staging = StagingArea(torch.device("cpu"), staged=True, nbytes=256)
    sampled_steps.clear()
    assert run() == direct
    assert ex.sample_staging.copies == sum(sampled_steps) > 5 and ex.sample_staging.grows > 0


def _sampling_step(vocab: int, device: torch.device) -> tuple[list[SamplingRow], PendingTokens]:
    """One row of each kind `PROCESSED` has (penalties, min_tokens, logit_bias, logprobs, seeds, top-k/top-p,
    greedy) plus a min-p row, the newest output token of most pending on `device` (the step in flight's)."""
    rows = []
    for i, p in enumerate(PROCESSED + [SamplingParams(temperature=1.0, min_p=0.05, max_tokens=10)]):
        output = [3 + i, 40 + i, PLACEHOLDER][: 1 if p.min_tokens else 3]  # under min_tokens where it has them
        generator = torch.Generator().manual_seed(p.seed) if p.seed is not None else None
        rows.append(SamplingRow(p, [(17 * i + j) % vocab for j in range(20 + 10 * i)], output, generator, [0, 1]))
    late = {i: len(rows) - 1 - i for i, r in enumerate(rows) if r.output_token_ids[-1] == PLACEHOLDER}
    return rows, PendingTokens(torch.zeros(len(rows), dtype=torch.long, device=device), late)


def test_a_sampled_step_copies_its_host_inputs_to_the_device_once(monkeypatch):
    """On a stand-in device ("meta"), a step with penalties, min_tokens, logit_bias, logprobs, seeds, top-k/top-p,
    min-p and pending tokens issues exactly ONE host-to-device copy for the sampler (the executor's sampling
    staging; the step's model inputs take their own one), pins nothing, reads nothing back and, once the first
    step has sized the staging, allocates no host buffer; without the staging the same step copies (and pins)
    each array on its own, so the count can fail. A seeded row's noise comes from its generator where the logits
    are (the engine makes it on the device), stood in for here by a draw on the device."""
    meta, vocab = torch.device("meta"), 3000
    seeded_draws = []
    monkeypatch.setattr(sampler_module, "_fill_seeded_noise",
                        lambda out, gen: seeded_draws.append(gen) or out.exponential_())
    pinned = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda t, *a: pinned.append(t.nbytes) or t)
    staging = StagingArea(meta, nbytes=256)
    sampler = Sampler(all_logprobs=False)

    def step(stage) -> list[tuple[str, tuple[str, ...]]]:
        rows, pending = _sampling_step(vocab, meta)
        logits = torch.empty(len(rows), vocab, dtype=torch.bfloat16, device=meta)
        with OpLog() as log:
            sample = sample_logits(sampler, logits, rows, pending, stage)
            sample.pack()
        assert sample.sampled is None and sample.logprobs.rows == [0, 1, 4]
        return log.ops

    def host_to_device(ops) -> list[tuple[str, ...]]:
        return [devices for name, devices in ops if name.startswith(("copy_", "_to_copy")) and "cpu" in devices]

    step(staging)  # warm-up: grows the staging to the step's size
    assert staging.grows > 0
    uploader, grows = staging.uploader, staging.grows
    for k in range(3):
        ops = step(staging)
        assert host_to_device(ops) == [("meta", "cpu", "meta")]  # dst, src, out: the step's one copy
        assert staging.copies == k + 2 and staging.uploader is uploader and staging.grows == grows
        assert not {name for name, _ in ops} & {"_local_scalar_dense.default", "_pin_memory.default"}  # no read-back
    assert pinned == [] and len(seeded_draws) == 3 * 4  # three seeded rows a step
    assert len(host_to_device(step(None))) > 10 and len(pinned) > 10  # each array on its own, as before the staging


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


@pytest.mark.gpu
def test_cuda_penalties_and_logprobs_steps_synchronise_only_in_result(monkeypatch):
    """On CUDA, steps with penalties, min_tokens, logit_bias and logprobs (seeded, unseeded and greedy, the
    previous step's tokens counted on the device) launch with no synchronisation (sync debug mode "error"
    around `execute_async`), never call the host sampler, return a `DeviceStep`, give every logprobs row its
    numbers, and a seeded or greedy request gives the same tokens and logprobs twice. Each sampled step's
    sampler issues exactly one host-to-device copy (its staging's) and pins nothing; the second run allocates
    no staging."""
    shape = Path(__file__).resolve().parents[2] / "benchmarks" / "shapes" / "tiny-qwen3"
    llm = LLM(str(shape), load_format="dummy", skip_tokenizer_init=True, device="cuda", dtype="bfloat16",
              max_num_blocks=256, max_num_seqs=16, max_num_batched_tokens=64)
    ex = llm.engine.executor
    host_calls, handles = _record(ex, monkeypatch, no_sync=True)
    copies, pinned = [], []
    sample = executor_module.sample_logits

    def counted_sample(sampler, logits, rows, pending=None, staging=None):
        with HostToDevice() as h2d:
            out = sample(sampler, logits, rows, pending, staging)
        if rows is not None:
            copies.append(h2d.copies)
        return out
    monkeypatch.setattr(executor_module, "sample_logits", counted_sample)
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda t, *a: pinned.append(t.nbytes) or t)
    prompts = [[(7 * i + 13 * j) % 4000 + 10 for j in range(n)] for i, n in enumerate([5, 70, 33, 1, 120, 17])]
    first = llm.generate(prompt_token_ids=prompts, sampling_params=PROCESSED)
    assert host_calls == [] and set(handles) == {DeviceStep}
    assert copies and set(copies) == {1} and ex.sample_staging.copies == len(copies) and pinned == []
    uploader = ex.sample_staging.uploader
    assert uploader._host[0].is_pinned()
    for o, p in zip(first, PROCESSED, strict=True):
        for c in o.outputs:
            assert len(c.token_ids) == 10 or c.finish_reason == "stop"
            if p.logprobs is not None:
                assert len(c.logprobs) == len(c.token_ids) and all(c.token_ids[k] in c.logprobs[k]
                                                                   for k in range(len(c.token_ids)))
    again = llm.generate(prompt_token_ids=prompts, sampling_params=PROCESSED)
    assert set(copies) == {1} and ex.sample_staging.uploader is uploader and pinned == []
    seeded = [i for i, p in enumerate(PROCESSED) if p.seed is not None or p.temperature == 0]
    assert [[(c.token_ids, c.logprobs) for c in first[i].outputs] for i in seeded] == \
        [[(c.token_ids, c.logprobs) for c in again[i].outputs] for i in seeded]
