"""The engine's typed delta outputs (`LLMEngine.step_deltas`: one `RequestDelta` per request per step, what the
busy loop hands the frontends, whose `DeltaDetokenizer` adds the text): added up, after every step, they are
exactly the state of the request's sequences (tokens, the emittable text of those tokens decoded in one go,
logprobs, finish and stop reasons), with n > 1, stop strings and logprobs;
merged over several steps (`RequestDelta.merge`, what the busy loop and the output streams do) they add up to
the same; `step()`'s cumulative outputs and the engine client's stream (`OutputStream.next`) give it too."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.contracts.sampling_params import SamplingParams
from hetero_infer.worker.core.busy_loop import EngineRequest
from hetero_infer.worker.core.detokenizer import DeltaDetokenizer, IncrementalDetokenizer
from hetero_infer.worker.core.engine import LLMEngine
from hetero_infer.worker.core.outputs import RequestDelta
from hetero_infer.worker.frontend.inproc import InprocEngineClient

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


def _text(engine: LLMEngine, request: Any, seq: Any, ids: list[int]) -> str:
    """The emittable text of a sequence's known output tokens, decoded in one go (the frontend makes it token by
    token, delta by delta): a stop token's text is left out unless include_stop_str_in_output."""
    params = request.params
    if ids and seq.finish_reason == "stop" and not params.include_stop_str_in_output and (
            isinstance(seq.stop_reason, int) or seq.stop_reason is None and ids[-1] in engine.eos_token_ids):
        ids = ids[:-1]
    detok = IncrementalDetokenizer(engine.tokenizer, request.prompt_token_ids, params)
    for t in ids:
        detok.add_token(t)
    return detok.emittable_text(seq.is_finished)


def _truth(engine: LLMEngine, request: Any) -> list[tuple]:
    """What the request's sequences hold now, read from the engine's own state (not from any output)."""
    with_lp = request.params.logprobs is not None
    out = []
    for seq in request.seqs:
        ids = seq.token_ids[seq.num_prompt_tokens:seq.num_known_tokens]
        out.append((ids, _text(engine, request, seq, ids), None if seq.logprobs is None else list(seq.logprobs),
                    seq.cumulative_logprob if with_lp else None, seq.finish_reason, seq.stop_reason))
    return out


def _add_up(total: list[list], delta: RequestDelta) -> None:
    for i, d in enumerate(delta.samples):
        if i == len(total):
            total.append([[], "", None, None, None, None])
        t = total[i]
        t[0] = t[0] + d.token_ids
        t[1] = t[1] + d.text
        if d.logprobs is not None:
            t[2] = (t[2] or []) + d.logprobs
        t[3], t[4], t[5] = d.cumulative_logprob, d.finish_reason, d.stop_reason


def _add_requests(engine: LLMEngine, prompts: list[list[int]], params: list[SamplingParams], tag: str) -> dict:
    requests = {}
    for i, (ids, p) in enumerate(zip(prompts, params, strict=True)):
        engine.add_request(f"{tag}{i}", None, ids, p)
        requests[f"{tag}{i}"] = engine.requests[f"{tag}{i}"]
    return requests


def _check_deltas(engine: LLMEngine, prompts: list[list[int]], params: list[SamplingParams], merge_every: int) -> dict:
    """Step to the end; every `merge_every` steps, the merged deltas of those steps, added up, must be the
    requests' state. Returns the final totals."""
    requests = _add_requests(engine, prompts, params, f"m{merge_every}-")
    text = DeltaDetokenizer(engine.tokenizer)  # the frontend's: the engine's deltas carry token ids only
    for rid, request in requests.items():
        text.add(rid, request.prompt_token_ids, request.params)
    totals: dict[str, list[list]] = {rid: [] for rid in requests}
    pending: dict[str, RequestDelta] = {}
    steps = 0
    while engine.has_unfinished_requests():
        for delta in engine.step_deltas():
            assert len(delta.step_times) == 1
            if delta.request_id in pending:
                pending[delta.request_id].merge(delta)
            else:
                pending[delta.request_id] = delta
        steps += 1
        if steps % merge_every == 0 or not engine.has_unfinished_requests():
            for rid, delta in pending.items():
                text.fill(delta)
                _add_up(totals[rid], delta)
                assert [tuple(t) for t in totals[rid]] == _truth(engine, requests[rid])
                assert delta.finished == (rid not in engine.requests)
            pending = {}
    return {rid: [tuple(t) for t in total] for rid, total in totals.items()}


@pytest.fixture(scope="module")
def mock_engine() -> Iterator[LLMEngine]:
    yield LLMEngine(EngineConfig(executor="mock", max_model_len=256, enable_prefix_caching=False))


def _mock_prompts(engine: LLMEngine) -> list[list[int]]:
    return [engine.tokenizer.encode(f"prompt number {i} says hello") for i in range(len(MOCK_PARAMS))]


@pytest.mark.parametrize("merge_every", [1, 3])
def test_mock_deltas_add_up_to_the_sequences(mock_engine: LLMEngine, merge_every: int) -> None:
    final = _check_deltas(mock_engine, _mock_prompts(mock_engine), MOCK_PARAMS, merge_every)
    reasons = {s[4] for samples in final.values() for s in samples}
    assert {"stop", "length"} <= reasons  # the stop strings and ids did stop some samples
    assert [len(samples) for samples in final.values()] == [p.n for p in MOCK_PARAMS]


def test_torch_deltas_with_logprobs_add_up_to_the_sequences() -> None:
    engine = LLMEngine(EngineConfig(executor="torch", max_model_len=128, enable_prefix_caching=False))
    tok = engine.tokenizer
    prompts = [tok.encode("The capital of France is"), tok.encode("Once upon a time")]
    final = _check_deltas(engine, prompts, TORCH_PARAMS, 1)
    assert all(s[2] is not None and len(s[2]) == len(s[0]) for s in final["m1-0"])  # a logprobs entry per token


def test_step_gives_the_cumulative_outputs(mock_engine: LLMEngine) -> None:
    requests = _add_requests(mock_engine, _mock_prompts(mock_engine), MOCK_PARAMS, "c")
    while mock_engine.has_unfinished_requests():
        for out in mock_engine.step():
            got = [(c.token_ids, c.text, c.logprobs, c.cumulative_logprob, c.finish_reason, c.stop_reason)
                   for c in out.outputs]
            assert got == _truth(mock_engine, requests[out.request_id])
            assert [c.index for c in out.outputs] == list(range(len(out.outputs)))
            assert out.finished == (out.request_id not in mock_engine.requests)


async def test_engine_client_streams_the_cumulative_outputs(mock_engine: LLMEngine) -> None:
    """Through the engine thread (deltas merged per hand-over, added up per stream): the final output of each
    request is the engine's, and every intermediate one is a prefix of it."""
    prompts = _mock_prompts(mock_engine)
    expected = {rid[3:]: v for rid, v in _check_deltas(mock_engine, prompts, MOCK_PARAMS, 1).items()}
    client = InprocEngineClient(mock_engine, stream_interval=0.001)
    client.start()
    try:
        async def one(i: int) -> list[tuple]:
            stream = client.submit([EngineRequest(f"a{i}", None, prompts[i], MOCK_PARAMS[i])])
            last = None
            while outputs := await stream.next():
                snap = [(c.token_ids, c.text, c.logprobs, c.cumulative_logprob, c.finish_reason, c.stop_reason)
                        for c in outputs[-1].outputs]
                if last is not None:
                    for before, now in zip(last, snap):
                        assert now[1].startswith(before[1]) and now[0][:len(before[0])] == before[0]
                last = snap
            return last

        got = await asyncio.gather(*[one(i) for i in range(len(prompts))])
    finally:
        client.shutdown()
    assert {str(i): g for i, g in enumerate(got)} == expected


@pytest.mark.parametrize("mode", ["cumulative", "delta"])
def test_a_failed_step_ends_its_requests_with_an_error(mock_engine: LLMEngine, mode: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    ids = mock_engine.tokenizer.encode("doomed")
    mock_engine.add_request(f"fail-{mode}", None, ids, SamplingParams(n=2, max_tokens=10, temperature=1.0, seed=1))
    mock_engine.step()  # prefill: both samples exist

    def boom(sched: Any) -> Any:
        raise RuntimeError("injected")

    monkeypatch.setattr(mock_engine.executor, "execute", boom)
    if mode == "delta":
        [delta] = mock_engine.step_deltas()
        rid, finished, error, reasons = delta.request_id, delta.finished, delta.error, [
            s.finish_reason for s in delta.samples]
    else:
        [out] = mock_engine.step()
        rid, finished, error, reasons = out.request_id, out.finished, out.error, [c.finish_reason
                                                                                   for c in out.outputs]
    assert rid == f"fail-{mode}" and finished and "injected" in error and reasons == ["error", "error"]
    assert not mock_engine.has_unfinished_requests()


@pytest.mark.parametrize("mode", ["thread", "process"])
async def test_text_that_cannot_be_made_fails_only_its_own_request(mode: str) -> None:
    """The frontend makes the text; one request whose text raises ends with an error and is aborted in the
    engine (its KV blocks freed), while the other requests of the same hand-over go on and the engine stays
    healthy (in process mode a raise in the hand-over declared the whole engine dead)."""
    from hetero_infer.worker.frontend.client import RequestFailedError
    from hetero_infer.worker.frontend.process import EngineProcess, ProcessEngineClient

    class Ends:
        def __init__(self) -> None:
            self.reasons: dict[int, str] = {}

        def observe_request(self, timing: Any, now: float, reason: str) -> None:
            self.reasons[timing.prompt_tokens] = reason

    ends = Ends()
    config = EngineConfig(executor="mock", max_model_len=256, max_num_blocks=64, mock_step_latency_s=0.005)
    if mode == "thread":
        client: Any = InprocEngineClient(LLMEngine(config), stream_interval=0.01, timing_sink=ends)
    else:
        core = EngineProcess(config, 0.01)
        core.start()
        await asyncio.get_running_loop().run_in_executor(None, core.wait_ready)
        client = ProcessEngineClient(core, stream_interval=0.01, tokenizer=LLMEngine(config).tokenizer,
                                     timing_sink=ends)
    client.start()
    fill = client.detokenizer.fill

    def fill_or_raise(delta: RequestDelta) -> None:
        if delta.request_id == "bad" and any(s.token_ids for s in delta.samples):
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected")
        fill(delta)

    client.detokenizer.fill = fill_or_raise
    params = SamplingParams(max_tokens=60, ignore_eos=True)
    try:  # told apart in the timing sink by their prompt lengths
        bad = client.submit([EngineRequest("bad", None, [5, 6, 7, 9], SamplingParams(max_tokens=250, ignore_eos=True))])
        good = client.submit([EngineRequest("good", None, [5, 6, 8], params)])
        with pytest.raises(RequestFailedError, match="injected"):
            while await asyncio.wait_for(bad.next(), 30):
                pass
        last = None
        while out := await asyncio.wait_for(good.next(), 30):
            last = out
        assert last[0].finished and len(last[0].outputs[0].token_ids) == 60 and last[0].outputs[0].text
        assert client.healthy
        for _ in range(100):  # the abort reached the engine: nothing runs or waits there any more
            if client.stats().num_running == 0 and client.stats().num_waiting == 0:
                break
            await asyncio.sleep(0.05)
        assert client.stats().num_running == 0 and client.stats().num_waiting == 0
        assert ends.reasons == {4: "abort", 3: "length"}  # aborted, not run to its 250 tokens
        assert not client.detokenizer._requests
    finally:
        client.shutdown()
