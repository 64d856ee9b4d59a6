"""Engine behaviour through the public API: validation, aborts, stops, seeds, n > 1, logits processors,
admission."""

from __future__ import annotations

import random

import pytest

from hetero_infer import LLM, SamplingParams
from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.worker.core.engine import LLMEngine


@pytest.fixture(scope="module")
def llm(tiny_model):
    folder, _ = tiny_model("llama")
    return LLM(str(folder), device="cpu", dtype="float32", block_size=4, max_num_blocks=64, max_model_len=128)


def prompt(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, 49000) for _ in range(n)]


def test_too_long_prompt_is_rejected_up_front_and_changes_nothing(llm):
    engine = llm.engine
    with pytest.raises(ValueError, match="maximum context length is 128"):
        engine.add_request("long", None, prompt(128), SamplingParams())
    with pytest.raises(ValueError, match=r"120 in the prompt, 16 for the completion"):
        engine.add_request("long2", None, prompt(120), SamplingParams(max_tokens=16))
    for bad in ([10**9], [5, -1], [5, 2.0], [5, "7"], [None]):
        with pytest.raises(ValueError, match="token ids must be integers"):
            engine.add_request("bad", None, bad, SamplingParams())
    with pytest.raises(ValueError, match="empty"):
        llm.generate(prompt_token_ids=[[]])
    assert not engine.has_unfinished_requests()
    assert engine.block_manager.num_free_blocks == 64


def test_request_that_can_never_fit_the_pool_is_rejected(tiny_model):
    folder, _ = tiny_model("llama")
    small = LLM(str(folder), device="cpu", dtype="float32", block_size=4, max_num_blocks=3)
    with pytest.raises(ValueError, match="KV-cache blocks"):
        small.generate(prompt_token_ids=[prompt(10)], sampling_params=SamplingParams(max_tokens=8))


def test_abort_frees_blocks_at_once(llm):
    engine = llm.engine
    engine.add_request("a", None, prompt(30), SamplingParams(max_tokens=50, ignore_eos=True))
    engine.add_request("b", None, prompt(9), SamplingParams(max_tokens=50, ignore_eos=True))
    engine.step()
    engine.step()
    assert engine.block_manager.num_free_blocks < 64
    engine.abort_request("a")
    engine.abort_request("b")
    engine.abort_request("unknown")  # no-op
    assert engine.block_manager.num_free_blocks == 64
    assert not engine.has_unfinished_requests()
    assert engine.step() == []


def test_same_seed_same_output_whatever_the_batch(llm):
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=42, max_tokens=12, ignore_eos=True)
    alone = llm.generate(prompt_token_ids=[prompt(7, 1)], sampling_params=params)[0].outputs[0].token_ids
    others = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True)
    batch = llm.generate(prompt_token_ids=[prompt(20, 2), prompt(7, 1), prompt(3, 3)],
                         sampling_params=[others, params, others])
    assert batch[1].outputs[0].token_ids == alone


def test_n_seeded_samples_differ_and_reproduce(llm):
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=10, ignore_eos=True)
    a = llm.generate(prompt_token_ids=[prompt(11, 4)], sampling_params=params)[0]
    b = llm.generate(prompt_token_ids=[prompt(11, 4)], sampling_params=params)[0]
    assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
    assert len({tuple(c.token_ids) for c in a.outputs}) == 3
    assert llm.engine.block_manager.num_free_blocks == 64


def test_stop_token_ids_and_max_tokens(llm):
    greedy = llm.generate(prompt_token_ids=[prompt(9, 5)],
                          sampling_params=SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))[0]
    tokens = greedy.outputs[0].token_ids
    assert greedy.outputs[0].finish_reason == "length" and len(tokens) == 8
    stop_at = tokens[3]
    out = llm.generate(prompt_token_ids=[prompt(9, 5)], sampling_params=SamplingParams(
        temperature=0, max_tokens=8, ignore_eos=True, stop_token_ids=[stop_at]))[0].outputs[0]
    first = tokens.index(stop_at)
    assert out.token_ids == tokens[: first + 1]
    assert out.finish_reason == "stop" and out.stop_reason == stop_at


def test_stop_string_is_cut_and_never_emitted(llm):
    base = llm.generate(prompt_token_ids=[prompt(6, 6)],
                        sampling_params=SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    text = base.outputs[0].text
    assert len(text) > 6
    stop = text[3:6]
    out = llm.generate(prompt_token_ids=[prompt(6, 6)], sampling_params=SamplingParams(
        temperature=0, max_tokens=12, ignore_eos=True, stop=[stop]))[0].outputs[0]
    assert out.text == text[: text.index(stop)]
    assert out.finish_reason == "stop" and out.stop_reason == stop


def test_logprobs_returned(llm):
    out = llm.generate(prompt_token_ids=[prompt(5, 8)], sampling_params=SamplingParams(
        temperature=0, max_tokens=4, logprobs=3, ignore_eos=True))[0].outputs[0]
    assert len(out.logprobs) == 4
    for tok, entry in zip(out.token_ids, out.logprobs):
        assert tok in entry and len(entry) >= 3
        assert entry[tok] == max(entry.values())  # greedy picks the most likely token


def test_logits_processors_steer_only_their_own_request(llm):
    """The per-request hook: a processor that allows one token per step (from a fixed schedule) is obeyed by
    its request, sees the request's tokens so far, and leaves a batch neighbour's greedy output as it is."""
    schedule = [1234, 777, 4321, 888, 99]
    seen: list[list[int]] = []

    def force(generated: list[int], row):
        seen.append(list(generated))
        forced = row.new_full(row.shape, float("-inf"))
        forced[schedule[len(generated)]] = 0.0
        return forced

    plain = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    alone = llm.generate(prompt_token_ids=[prompt(8, 9)], sampling_params=plain)[0].outputs[0].token_ids
    steered = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True, logits_processors=[force])
    outs = llm.generate(prompt_token_ids=[prompt(8, 9), prompt(8, 9)], sampling_params=[steered, plain])
    assert outs[0].outputs[0].token_ids == schedule
    assert seen == [schedule[:i] for i in range(5)]
    assert outs[1].outputs[0].token_ids == alone != schedule


def test_all_greedy_steps_take_the_argmax_others_the_full_sampler(llm, monkeypatch):
    """A step whose rows are all plain greedy skips the sampler's processing (`Sampler.argmax_tokens`); one row
    that needs more (logprobs here) sends the whole step through the sampler (`Sampler.sample_on_device`, no
    grammar row), with the same greedy tokens."""
    from hetero_infer.worker.runner.sampler import Sampler

    calls: list[str] = []
    argmax, full = Sampler.argmax_tokens, Sampler.sample_on_device
    monkeypatch.setattr(Sampler, "argmax_tokens", lambda self, *a: calls.append("argmax") or argmax(self, *a))
    monkeypatch.setattr(Sampler, "sample_on_device", lambda self, *a, **k: calls.append("full") or full(self, *a, **k))
    greedy = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    plain = llm.generate(prompt_token_ids=[prompt(7, 10), prompt(5, 11)], sampling_params=greedy)
    assert calls == ["argmax"] * 4
    calls.clear()
    with_logprobs = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=1)
    mixed = llm.generate(prompt_token_ids=[prompt(7, 10), prompt(5, 11)], sampling_params=[greedy, with_logprobs])
    assert calls == ["full"] * 4
    assert [o.outputs[0].token_ids for o in mixed] == [o.outputs[0].token_ids for o in plain]


def test_admission_stops_above_memory_threshold(tiny_model):
    folder, _ = tiny_model("llama")
    engine = LLMEngine(EngineConfig(model=str(folder), device="cpu", dtype="float32", block_size=4,
                                    max_num_blocks=20, memory_threshold=0.5))
    engine.add_request("big", None, prompt(44), SamplingParams(max_tokens=4, ignore_eos=True))  # 12 blocks
    engine.add_request("next", None, prompt(4), SamplingParams(max_tokens=4, ignore_eos=True))
    engine.step()
    assert engine.block_manager.usage > 0.5
    assert [s.request_id for s in engine.scheduler.running] == ["big"]
    assert [s.request_id for s in engine.scheduler.waiting] == ["next"]
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.block_manager.num_free_blocks == 20


def test_executor_failure_fails_only_that_step(tiny_model, monkeypatch):
    folder, _ = tiny_model("llama")
    engine = LLMEngine(EngineConfig(model=str(folder), device="cpu", dtype="float32", block_size=4, max_num_blocks=32))
    engine.add_request("doomed", None, prompt(5), SamplingParams(max_tokens=3, ignore_eos=True))
    real = engine.executor.execute
    monkeypatch.setattr(engine.executor, "execute", lambda sched: (_ for _ in ()).throw(RuntimeError("boom")))
    outs = engine.step()
    assert outs[0].finished and outs[0].error and "boom" in outs[0].error
    assert outs[0].outputs[0].finish_reason == "error"
    assert engine.block_manager.num_free_blocks == 32
    monkeypatch.setattr(engine.executor, "execute", real)
    engine.add_request("fine", None, prompt(5), SamplingParams(max_tokens=3, ignore_eos=True))
    done = []
    while engine.has_unfinished_requests():
        done += [o for o in engine.step() if o.finished]
    assert done[0].request_id == "fine" and len(done[0].outputs[0].token_ids) == 3


def test_mock_executor_does_real_kv_accounting():
    engine = LLMEngine(EngineConfig(executor="mock", max_num_blocks=10, block_size=16, max_num_seqs=8))
    for i in range(4):
        engine.add_request(f"m{i}", None, prompt(40, i), SamplingParams(max_tokens=30, ignore_eos=True))
    engine.step()
    assert engine.stats().kv_cache_usage > 0
    seen_preemption = False
    outs = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            outs[o.request_id] = o
        seen_preemption |= engine.stats().num_preemptions_total > 0
    assert seen_preemption  # 4 x 70 tokens need 20 blocks of 16; the pool holds 10
    assert all(len(o.outputs[0].token_ids) == 30 for o in outs.values())
    assert engine.stats().kv_cache_usage == 0
