"""The engine's delta outputs (`add_request(..., delta=True)`: what the server's engine thread uses; merged
straight into batches by `step_merged` in the engine process): accumulated, they give exactly the cumulative
outputs, step by step (tokens, text, logprobs, finish and stop reasons), with n > 1, stop strings and logprobs;
and the async layer's accumulation (`OutputStream`) gives them too."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from hetero_infer.worker.async_engine import AsyncEngine, EngineRequest, RequestState
from hetero_infer.worker.config import EngineConfig
from hetero_infer.worker.engine import LLMEngine
from hetero_infer.worker.outputs import take_entries
from hetero_infer.worker.sampling_params import SamplingParams

MOCK_PARAMS = [
    SamplingParams(max_tokens=40, ignore_eos=True),
    SamplingParams(n=3, max_tokens=30, ignore_eos=True),
    SamplingParams(n=2, max_tokens=60, stop=["e", "ab"], ignore_eos=True),
    SamplingParams(max_tokens=60, stop=["a"], include_stop_str_in_output=True, ignore_eos=True, min_tokens=3),
    SamplingParams(max_tokens=1),
    SamplingParams(max_tokens=25, stop_token_ids=[150, 151, 152]),
]
TORCH_PARAMS = [
    SamplingParams(n=2, max_tokens=12, temperature=0.8, seed=3, logprobs=3),
    SamplingParams(max_tokens=12, temperature=0.0, logprobs=0, stop=[" the", "."]),
]


def _snapshot(out: Any) -> tuple:
    return (out.finished, out.error, [(c.index, c.text, list(c.token_ids), None if c.logprobs is None else
                                       list(c.logprobs), c.cumulative_logprob, c.finish_reason, c.stop_reason)
                                      for c in out.outputs])


def _run(engine: LLMEngine, prompts: list[list[int]], params: list[SamplingParams], mode: str) -> dict[str, list]:
    """Every request's output after every step that touched it: "cumulative" outputs as they are; "delta"
    outputs (`step()`) and "merged" ones (`step_merged`) accumulated in a RequestState."""
    tag = mode[0]
    states = {}
    for i, (ids, p) in enumerate(zip(prompts, params, strict=True)):
        rid = f"{tag}{i}"
        engine.add_request(rid, None, ids, p, delta=mode != "cumulative")
        states[rid] = RequestState(rid, None, ids)
    seen: dict[str, list] = {rid: [] for rid in states}
    while engine.has_unfinished_requests():
        pending: dict[str, list] = {}
        if mode == "merged":
            engine.step_merged(pending)
        else:
            outputs = engine.step()
            for out in outputs:
                if mode == "delta":
                    state = states[out.request_id]
                    for c in out.outputs:
                        state.sample(c.index).add(c.token_ids, c.text, c.logprobs, c.cumulative_logprob,
                                                  c.finish_reason, c.stop_reason)
                    state.finished, state.error = out.finished, out.error
                    out = state.output()
                seen[out.request_id].append(_snapshot(out))
            continue
        for rid, finished, error, _metrics, samples, times in take_entries(pending):
            assert len(times) == 1
            state = states[rid]
            for index, sample in enumerate(samples):
                state.sample(index).add(*sample)
            state.finished, state.error = finished, error
            seen[rid].append(_snapshot(state.output()))
    return {rid[1:]: steps for rid, steps in seen.items()}


@pytest.fixture(scope="module")
def mock_engine() -> Iterator[LLMEngine]:
    yield LLMEngine(EngineConfig(executor="mock", max_model_len=256, enable_prefix_caching=False))


def test_mock_deltas_accumulate_to_the_cumulative_outputs(mock_engine: LLMEngine) -> None:
    tok = mock_engine.tokenizer
    prompts = [tok.encode(f"prompt number {i} says hello") for i in range(len(MOCK_PARAMS))]
    cumulative = _run(mock_engine, prompts, MOCK_PARAMS, "cumulative")
    assert _run(mock_engine, prompts, MOCK_PARAMS, "delta") == cumulative
    assert _run(mock_engine, prompts, MOCK_PARAMS, "merged") == cumulative
    reasons = {c[5] for steps in cumulative.values() for c in steps[-1][2]}
    assert {"stop", "length"} <= reasons  # the stop strings and ids did stop some samples
    assert all(len(steps[-1][2]) == p.n for steps, p in zip(cumulative.values(), MOCK_PARAMS, strict=True))


def test_torch_deltas_with_logprobs_accumulate_to_the_cumulative_outputs() -> None:
    engine = LLMEngine(EngineConfig(executor="torch", max_model_len=128, enable_prefix_caching=False))
    tok = engine.tokenizer
    prompts = [tok.encode("The capital of France is"), tok.encode("Once upon a time")]
    cumulative = _run(engine, prompts, TORCH_PARAMS, "cumulative")
    assert _run(engine, prompts, TORCH_PARAMS, "delta") == cumulative
    assert _run(engine, prompts, TORCH_PARAMS, "merged") == cumulative
    last = cumulative["0"][-1][2]
    assert all(c[3] is not None and len(c[3]) == len(c[2]) for c in last)  # a logprobs entry per token


async def test_async_engine_streams_the_cumulative_outputs(mock_engine: LLMEngine) -> None:
    """Through the engine thread (deltas merged per flush, accumulated per stream): the final output of each
    request is the engine's cumulative one, and every intermediate one is a prefix of it."""
    tok = mock_engine.tokenizer
    prompts = [tok.encode(f"prompt number {i} says hello") for i in range(len(MOCK_PARAMS))]
    expected = {rid: steps[-1] for rid, steps in _run(mock_engine, prompts, MOCK_PARAMS, "cumulative").items()}
    ae = AsyncEngine(mock_engine, stream_interval=0.001)
    ae.start()
    try:
        async def one(i: int) -> tuple:
            stream = ae.submit([EngineRequest(f"a{i}", None, prompts[i], MOCK_PARAMS[i])])
            last = None
            while outputs := await stream.next():
                snap = _snapshot(outputs[-1])
                if last is not None:
                    for before, now in zip(last[2], snap[2], strict=True):
                        assert now[1].startswith(before[1]) and now[2][:len(before[2])] == before[2]
                last = snap
            return last

        got = await asyncio.gather(*[one(i) for i in range(len(prompts))])
    finally:
        ae.shutdown()
    assert {str(i): g for i, g in enumerate(got)} == expected


@pytest.mark.parametrize("mode", ["cumulative", "merged"])
def test_a_failed_step_ends_its_requests_with_an_error(mock_engine: LLMEngine, mode: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    ids = mock_engine.tokenizer.encode("doomed")
    mock_engine.add_request(f"fail-{mode}", None, ids, SamplingParams(n=2, max_tokens=10, temperature=1.0, seed=1),
                            delta=mode == "merged")
    mock_engine.step()  # prefill: both samples exist

    def boom(sched: Any) -> Any:
        raise RuntimeError("injected")

    monkeypatch.setattr(mock_engine.executor, "execute", boom)
    if mode == "merged":
        pending: dict[str, list] = {}
        assert mock_engine.step_merged(pending) == 1
        [(rid, finished, error, _metrics, samples, _times)] = take_entries(pending)
        reasons = [s[4] for s in samples]
    else:
        [out] = mock_engine.step()
        rid, finished, error, reasons = out.request_id, out.finished, out.error, [c.finish_reason
                                                                                   for c in out.outputs]
    assert rid == f"fail-{mode}" and finished and "injected" in error and reasons == ["error", "error"]
    assert not mock_engine.has_unfinished_requests()
