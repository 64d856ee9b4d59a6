"""The overlap of host and device (issue 24): step N+1 is scheduled and launched before step N's tokens reach
the host, which applies them while the device runs N+1.

- The order of the calls: launch N+1, then the result of N (the mock executor models an asynchronous device).
- The outputs are those of the same engine without the overlap (`async_scheduling=False`), over every feature
  that reads tokens: n > 1, best_of, stop strings and stop tokens, EOS, logprobs and seeded sampling (the real
  sampler on the mock's logits), penalties (which count the token in flight where it is) and grammars (which
  need the host's tokens before the next step),
  chunked prefill, prefix caching, preemption, and aborts.
- A stop costs at most the one step already in flight: its token is dropped and every KV block comes back.
- The torch executor with the overlap forced on the CPU (the CUDA control flow: PLACEHOLDER inputs patched from
  the previous step's tokens where the logits are), with its inputs staged as on CUDA or not, is token-identical
  to Hugging Face.
"""

from __future__ import annotations

import pytest
from test_hf_equivalence import hf_greedy, random_prompts

from hetero_infer import LLM, SamplingParams
from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.worker.core.engine import LLMEngine
from hetero_infer.worker.runner.attention.torch_backend import TorchBackend
from hetero_infer.worker.runner.staging import StagingArea


def mock_llm(async_scheduling: bool, **overrides) -> LLM:
    config = dict(executor="mock", mock_logits=True, max_model_len=256, max_num_blocks=64, block_size=4,
                  max_num_seqs=6, max_num_batched_tokens=24, async_scheduling=async_scheduling)
    return LLM(**(config | overrides))


def _outputs(outs) -> list:
    return [[(c.index, c.token_ids, c.text, c.logprobs, c.cumulative_logprob, c.finish_reason, c.stop_reason)
             for c in o.outputs] for o in outs]


PROMPTS = [[100 + 3 * i + j for j in range(n)] for i, n in enumerate([5, 30, 9, 17, 2, 41, 12, 7])]
PARAMS = [
    SamplingParams(max_tokens=20, ignore_eos=True, seed=1),
    SamplingParams(n=3, max_tokens=12, temperature=0.9, seed=5, logprobs=2),
    SamplingParams(max_tokens=30, stop=["e", "ab"], ignore_eos=True, include_stop_str_in_output=True, seed=2),
    SamplingParams(max_tokens=25, stop_token_ids=[2050, 2100], temperature=0.0),
    SamplingParams(best_of=3, n=2, max_tokens=9, temperature=1.0, seed=7),
    SamplingParams(max_tokens=16, repetition_penalty=1.3, presence_penalty=0.5, temperature=0.0),
    SamplingParams(max_tokens=14, temperature=0.7, top_p=0.9, top_k=50, seed=11, logprobs=0, min_tokens=4),
    SamplingParams(max_tokens=18, ignore_eos=True, logprobs=1, temperature=0.0),
]


@pytest.mark.parametrize("pool", [64, 16], ids=["roomy", "preempting"])
def test_the_overlap_changes_no_output(pool):
    outs = {}
    for overlap in (False, True):
        llm = mock_llm(overlap, max_num_blocks=pool, memory_threshold=1.0)
        outs[overlap] = _outputs(llm.generate(prompt_token_ids=PROMPTS, sampling_params=PARAMS))
        engine = llm.engine
        assert engine.block_manager.num_free_blocks == pool  # every block came back
        if pool == 16:
            assert engine.scheduler.num_preemptions_total > 0
    assert outs[True] == outs[False]
    reasons = {s[5] for o in outs[True] for s in o}
    assert {"stop", "length"} <= reasons


def test_structured_output_and_prefix_cache_under_the_overlap():
    from hetero_infer.contracts.sampling_params import StructuredOutputsParams

    choice = SamplingParams(max_tokens=10, temperature=0.0, structured_outputs=StructuredOutputsParams(choice=["yes", "no", "maybe"]))
    shared = [500 + j for j in range(20)]
    prompts = [shared + [7], shared + [8], [9, 10, 11]]
    params = [choice, SamplingParams(max_tokens=8, ignore_eos=True, seed=3), choice]
    outs = {}
    for overlap in (False, True):
        llm = mock_llm(overlap)
        first = llm.generate(prompt_token_ids=prompts[:1], sampling_params=params[:1])
        rest = llm.generate(prompt_token_ids=prompts[1:], sampling_params=params[1:])  # the first's blocks cached
        outs[overlap] = _outputs(first + rest)
        assert llm.engine.block_manager.prefix_hits >= 20
    assert outs[True] == outs[False]
    assert outs[True][0][0][2] in ("yes", "no", "maybe")


def test_step_n_plus_1_is_launched_before_step_n_is_read():
    engine = LLMEngine(EngineConfig(executor="mock", max_model_len=128, async_scheduling=True))
    events: list[str] = []
    launch = engine.executor.execute_async

    class Recorded:
        def __init__(self, handle, k: int) -> None:
            self.handle, self.k = handle, k

        @property
        def prompt_logprobs(self):
            return self.handle.prompt_logprobs

        def result(self):
            events.append(f"result {self.k}")
            return self.handle.result()

    def recording_launch(sched, sampling):
        k = sum(e.startswith("launch") for e in events) + 1
        events.append(f"launch {k}")
        return Recorded(launch(sched, sampling), k)

    engine.executor.execute_async = recording_launch
    engine.add_request("r", None, [101, 102, 103], SamplingParams(max_tokens=4, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step_deltas()
    assert events[:6] == ["launch 1", "launch 2", "result 1", "launch 3", "result 2", "launch 4"]


def test_a_stop_costs_at_most_the_step_in_flight():
    """EOS at the 3rd output token (the mock's logits copy the prompt's second token after its first), then the
    step already launched is the only one that still computes the sequence, and its token is dropped."""
    engine = LLMEngine(EngineConfig(executor="mock", mock_logits=True, max_model_len=128, max_num_blocks=32,
                                    block_size=4, async_scheduling=True))
    rows: list[int] = []
    launch = engine.executor.execute_async

    def counting_launch(plan, sampling):
        rows.append(len(plan.seq_ids))  # (the one request's)
        return launch(plan, sampling)

    engine.executor.execute_async = counting_launch
    x = 2000  # FAVOURITES[0]: greedy decoding repeats it; after it, the prompt's second token (EOS) is favoured
    eos = engine.eos_token_ids[0]
    engine.add_request("r", None, [x, eos, 300, 301, 302], SamplingParams(max_tokens=50, temperature=0.0))
    deltas = []
    while engine.has_unfinished_requests():
        deltas += engine.step_deltas()
    tokens = [t for d in deltas for t in d.samples[0].token_ids]
    assert tokens == [x, eos] and deltas[-1].samples[0].finish_reason == "stop"
    assert len([n for n in rows if n]) <= len(tokens) + 1  # the prefill and one decode, plus the step in flight
    assert engine.block_manager.num_free_blocks == 32


def test_abort_while_a_step_is_in_flight_frees_everything():
    engine = LLMEngine(EngineConfig(executor="mock", max_model_len=128, max_num_blocks=32, block_size=4,
                                    async_scheduling=True))
    engine.add_request("a", None, list(range(100, 110)), SamplingParams(max_tokens=40, ignore_eos=True))
    engine.add_request("b", None, list(range(200, 207)), SamplingParams(max_tokens=6, ignore_eos=True))
    for _ in range(3):
        engine.step_deltas()
    assert engine._inflight is not None
    engine.abort_request("a")
    out = []
    while engine.has_unfinished_requests():
        out += engine.step_deltas()
    assert {d.request_id for d in out} == {"b"}
    assert sum(len(d.samples[0].token_ids) for d in out) <= 6
    engine.step_deltas()  # the step in flight at the end, if any, is collected without effect
    assert engine.block_manager.num_free_blocks == 32 and not engine.scheduler.has_unfinished()


@pytest.mark.parametrize("staged", [False, True], ids=["cpu-inputs", "staged-inputs"])
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_torch_executor_with_the_overlap_forced_matches_hf(tiny_model, arch, staged):
    """The CUDA control flow on the CPU: the sampled tokens stay a tensor, the next step's PLACEHOLDER inputs are
    patched from it, results read from the host buffers; chunked prefill and preemption included. `staged`: the
    CUDA path's inputs too, the PyTorch reference backend's, every step's packed and copied once through the
    staging area (worker/runner/staging.py; grown from too small a start)."""
    folder, hf = tiny_model(arch)
    llm = LLM(str(folder), device="cpu", dtype="float32", block_size=4, max_num_blocks=24, max_num_batched_tokens=32,
              memory_threshold=1.0)
    ex, engine = llm.engine.executor, llm.engine
    assert not ex.overlaps and not engine._overlap  # on the CPU the executor is synchronous
    assert not ex.staging.staged  # and uses its inputs where they are
    ex.overlaps = engine._overlap = True
    if staged:
        ex.backend = TorchBackend(ex.model.rotary_embedding(ex.dtype, ex.device), ex.device)
        ex.cpu_decode = None  # the fused C decode step reads the CPU backend's metadata
        ex.staging = StagingArea(ex.device, staged=True, nbytes=128)
    patched = []
    prepare = ex._prepare

    def recording_prepare(step):
        patched.append(len(step.placeholders))
        return prepare(step)
    ex._prepare = recording_prepare
    prompts = random_prompts([21, 3, 40, 9, 30], seed=4)
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=SamplingParams(temperature=0, max_tokens=10,
                                                                                 ignore_eos=True))
    assert [o.outputs[0].token_ids for o in outs] == [hf_greedy(hf, p) for p in prompts]
    assert sum(patched) > 0  # steps did read tokens their host had not seen yet
    assert ex.staging.copies == (len(patched) if staged else 0) and (ex.staging.grows >= 1) == staged
    assert engine.scheduler.num_preemptions_total > 0
    assert engine.block_manager.num_free_blocks == 24
