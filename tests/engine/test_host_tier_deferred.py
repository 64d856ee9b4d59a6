"""A request restored from the host tier behind another step (the scheduler's `defer_restored`, what the CUDA
executor's asynchronous tier copies turn on) through the real engine (mock executor): it computes from the next
step, and a step that fails while restoring its blocks fails it too (the copy may never have been made), while
the engine goes on."""

from __future__ import annotations

from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.contracts.sampling_params import SamplingParams
from hetero_infer.worker.core.engine import LLMEngine

FIRST = list(range(100, 120))  # 20 tokens: 5 blocks of 4


def engine() -> LLMEngine:
    eng = LLMEngine(EngineConfig(executor="mock", block_size=4, max_num_blocks=12, max_num_seqs=4, max_model_len=64,
                                 kv_offloading_size=0.01, async_scheduling=False))
    eng.scheduler.defer_restored = True  # as the CUDA executor's tier copies set it
    return eng


def run(eng: LLMEngine, rid: str, prompt: list[int], max_tokens: int = 1) -> None:
    eng.add_request(rid, None, prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
    while rid in eng.requests:
        eng.step()


def start(eng: LLMEngine) -> None:
    """FIRST cached, then evicted into the tier; a decoder running; FIRST asked again."""
    run(eng, "a", FIRST)
    run(eng, "b", list(range(300, 340)))  # 10 blocks: FIRST's go to the tier
    eng.add_request("d", None, [7, 8, 9, 10], SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True))
    eng.step()
    eng.add_request("a2", None, FIRST + [5], SamplingParams(max_tokens=1, temperature=0.0))


def test_a_restored_request_computes_from_the_step_after_its_restore() -> None:
    eng = engine()
    start(eng)
    outs = {o.request_id: o for o in eng.step()}
    sched = eng.last_schedule
    assert sched.block_moves.restores and [item.seq.request_id for item in sched.scheduled] == ["d"]
    assert "a2" not in outs
    outs = {o.request_id: o for o in eng.step()}
    assert outs["a2"].finished and outs["a2"].num_cached_tokens == 20
    assert eng.block_manager.host_hits == 20


def test_a_failed_step_fails_the_request_restored_behind_it(monkeypatch) -> None:
    eng = engine()
    start(eng)
    real = eng.executor.execute_async

    def broken(*args, **kwargs):
        monkeypatch.setattr(eng.executor, "execute_async", real)  # once
        raise RuntimeError("the device fell over")

    monkeypatch.setattr(eng.executor, "execute_async", broken)
    outs = {o.request_id: o for o in eng.step()}
    assert eng.last_schedule.block_moves.restores
    assert set(outs) == {"d", "a2"} and all(o.finished for o in outs.values())
    assert "device fell over" in str(outs["a2"].error)
    assert not eng.has_unfinished_requests()
    run(eng, "again", FIRST + [6])  # the engine goes on; what the failed step named is not trusted
