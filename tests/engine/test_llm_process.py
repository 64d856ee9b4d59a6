"""`LLM` with its engine core in its own process (the default where two CPUs are usable; the test suite's other
files run it in process, `HETERO_INFER_LLM_ENGINE_PROCESS=0` in tests/conftest.py, to look inside the engine):
token-identical to transformers, the same outputs as the in-process engine for every sampling option, the text
made in the caller's process, errors as in process, and a clean stop."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest
from test_hf_equivalence import hf_greedy, random_prompts, run_engine

from hetero_infer import LLM, SamplingParams
from hetero_infer.worker.core.detokenizer import DeltaDetokenizer
from hetero_infer.worker.frontend.llm import ENGINE_PROCESS_ENV, default_engine_process

MOCK = dict(executor="mock", mock_logits=True, max_model_len=256, max_num_blocks=256)


def _fields(outs):
    return [(o.request_id != "", o.prompt, o.prompt_token_ids, o.finished, o.error, o.num_cached_tokens,
             o.prompt_logprobs, o.prompt_logprob_ranks,
             [(c.index, c.text, c.token_ids, c.cumulative_logprob, c.logprobs, c.finish_reason, c.stop_reason)
              for c in o.outputs]) for o in outs]


@pytest.fixture(scope="module")
def pair():
    """The mock executor's logits (so every sampling option applies), in its own process and in this one."""
    remote = LLM(engine_process=True, **MOCK)
    local = LLM(engine_process=False, **MOCK)
    yield remote, local
    remote.shutdown()


def test_greedy_float32_matches_transformers_under_preemption(tiny_model):
    folder, hf = tiny_model("llama")
    prompts = random_prompts([20, 25, 18, 30, 22, 27], seed=2)
    llm, ours = run_engine(folder, prompts, block_size=16, max_num_blocks=10, memory_threshold=1.0,
                           engine_process=True)
    try:
        assert llm.engine_pid is not None and llm.engine_pid != os.getpid()
        assert ours == [hf_greedy(hf, p) for p in prompts]
        assert llm.generate(prompt_token_ids=prompts[:2], sampling_params=SamplingParams(
            temperature=0.0, max_tokens=10, ignore_eos=True))[1].outputs[0].token_ids == ours[1]  # a second batch
    finally:
        llm.shutdown()


def test_every_sampling_option_gives_the_in_process_outputs(pair):
    remote, local = pair
    texts = ["The capital of France is", "Once upon a time", "1, 2, 3,", "Hello"]
    params = [
        SamplingParams(max_tokens=12, temperature=0.0, logprobs=2, prompt_logprobs=1),
        SamplingParams(max_tokens=10, temperature=0.8, top_p=0.9, seed=7, n=2),
        SamplingParams(max_tokens=10, temperature=1.0, seed=3, n=1, best_of=3, logprobs=1),
        SamplingParams(max_tokens=16, temperature=0.7, top_k=5, seed=11, stop=["a", "e"], min_tokens=2,
                       repetition_penalty=1.3, presence_penalty=0.5),
    ]
    ours, theirs = remote.generate(texts, params), local.generate(texts, params)
    assert _fields(ours) == _fields(theirs)
    assert all(c.text for o in ours for c in o.outputs)  # text made (in this process: see below)
    chat = [{"role": "user", "content": "Say hi"}]
    assert _fields(remote.chat(chat, params[0])) == _fields(local.chat(chat, params[0]))


def test_the_text_is_made_in_the_callers_process(pair, monkeypatch):
    """The engine process hands token ids out; their text is made here, off the engine's loop."""
    remote, _ = pair
    filled = []
    real = DeltaDetokenizer.fill
    monkeypatch.setattr(DeltaDetokenizer, "fill", lambda self, delta: (filled.append(delta.request_id),
                                                                       real(self, delta))[1])
    out = remote.generate("Hello there", SamplingParams(max_tokens=5, temperature=0.0))
    assert filled == [out[0].request_id] and out[0].outputs[0].text


def test_bad_input_fails_before_any_work_and_the_engine_goes_on(pair):
    remote, _ = pair
    with pytest.raises(ValueError, match="maximum context length is 256"):
        remote.generate(prompt_token_ids=[[5, 6], list(range(100, 400))])
    with pytest.raises(ValueError, match="empty"):
        remote.generate(prompt_token_ids=[[]])
    with pytest.raises(ValueError, match="engine_process=False"):
        remote.generate("hi", SamplingParams(logits_processors=[lambda ids, row: row]))
    with pytest.raises(AttributeError, match="engine_process=False"):
        remote.engine  # noqa: B018
    out = remote.generate(prompt_token_ids=[5, 6, 7], sampling_params=SamplingParams(max_tokens=3, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 3


async def test_generate_from_a_thread_that_runs_an_event_loop(pair):
    """A notebook's cell runs inside an event loop: generate still returns (its loop runs on a helper thread)."""
    remote, local = pair
    ids = [[5, 6, 7], [8, 9]]
    params = SamplingParams(max_tokens=4, temperature=0.0)
    assert _fields(remote.generate(prompt_token_ids=ids, sampling_params=params)) == \
        _fields(local.generate(prompt_token_ids=ids, sampling_params=params))
    await asyncio.sleep(0)


def test_a_load_error_is_the_engines_own(tiny_model):
    folder, _ = tiny_model("llama")
    with pytest.raises(ValueError, match="exceeds the model's context length"):
        LLM(str(folder), device="cpu", max_model_len=10**6, engine_process=True)


def test_shutdown_stops_the_engine_process():
    llm = LLM(engine_process=True, **MOCK)
    pid = llm.engine_pid
    with llm:
        assert llm.generate(prompt_token_ids=[5, 6], sampling_params=SamplingParams(max_tokens=2))[0].finished
    with pytest.raises(RuntimeError, match="shut down"):
        llm.generate(prompt_token_ids=[5, 6])
    llm.shutdown()  # again: nothing
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_script_without_a_main_guard(tmp_path):
    """`spawn` would run the script again in the engine process (starting an engine in the engine's start-up): the
    child is not told of the parent's main script."""
    script = tmp_path / "plain.py"
    script.write_text("from hetero_infer import LLM, SamplingParams\n"
                      "llm = LLM(executor='mock', max_model_len=64, engine_process=True)\n"
                      "out = llm.generate(prompt_token_ids=[5, 6, 7], sampling_params=SamplingParams(max_tokens=3))\n"
                      "print('tokens', len(out[0].outputs[0].token_ids))\n")
    env = {k: v for k, v in os.environ.items() if k != ENGINE_PROCESS_ENV}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180, env=env,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "tokens 3"


def test_the_default():
    from hetero_infer.contracts.server_options import ENGINE_PROCESS_MIN_CPUS
    from hetero_infer.cpu_quota import usable_cpus

    assert default_engine_process({}) == (usable_cpus() >= ENGINE_PROCESS_MIN_CPUS)
    assert default_engine_process({ENGINE_PROCESS_ENV: "auto"}) == default_engine_process({})
    assert default_engine_process({ENGINE_PROCESS_ENV: "1"}) and not default_engine_process({ENGINE_PROCESS_ENV: "0"})
    with pytest.raises(ValueError, match=ENGINE_PROCESS_ENV):
        default_engine_process({ENGINE_PROCESS_ENV: "maybe"})
