"""Per-request timing in both async engines (what the latency histograms observe): one inter-token gap per output
step after the first, every token counted, the right finish reason, aborted requests ended as "abort"."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.contracts.sampling_params import SamplingParams
from hetero_infer.worker.core.busy_loop import EngineRequest
from hetero_infer.worker.core.engine import LLMEngine
from hetero_infer.worker.frontend.client import EngineClient
from hetero_infer.worker.frontend.inproc import InprocEngineClient
from hetero_infer.worker.frontend.process import EngineProcess, ProcessEngineClient
from hetero_infer.worker.frontend.timing import RequestTiming

CONFIG = EngineConfig(executor="mock", max_model_len=256, mock_step_latency_s=0.002)


class Sink:
    """Keeps what it observes by prompt length (the tests give every request its own)."""

    def __init__(self) -> None:
        self.seen: dict[int, tuple[RequestTiming, float, str]] = {}

    def observe_request(self, timing: RequestTiming, finished_at: float, finish_reason: str) -> None:
        self.seen[timing.prompt_tokens] = (timing, finished_at, finish_reason)


@pytest.fixture(params=["thread", "process"])
async def engine(request: pytest.FixtureRequest) -> AsyncIterator[tuple[EngineClient, Sink]]:
    sink = Sink()
    if request.param == "thread":
        ae = InprocEngineClient(LLMEngine(CONFIG), timing_sink=sink, stream_interval=0.005)
    else:
        core = EngineProcess(CONFIG, 0.005)
        core.start()
        await asyncio.get_running_loop().run_in_executor(None, core.wait_ready)
        ae = ProcessEngineClient(core, timing_sink=sink, stream_interval=0.005)
    ae.start()
    try:
        yield ae, sink
    finally:
        ae.shutdown()


async def _drain(stream) -> int:
    tokens = 0
    while outs := await stream.next():
        tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
    return tokens


async def test_timing_of_finished_and_aborted_requests(engine: tuple[EngineClient, Sink]) -> None:
    ae, sink = engine

    def prompt(length: int) -> list[int]:
        return [100 + i for i in range(length)]

    lengths = {1: 11, 7: 12, 30: 13}
    finished = [(ae.submit([EngineRequest(f"done-{n}", None, prompt(lengths[n]), SamplingParams(
        max_tokens=n, ignore_eos=True))]), n) for n in lengths]
    two = ae.submit([EngineRequest("two", None, prompt(14), SamplingParams(n=2, max_tokens=9, ignore_eos=True,
                                                                            temperature=1.0, seed=1))])
    long = ae.submit([EngineRequest("long", None, prompt(15), SamplingParams(max_tokens=200, ignore_eos=True))])
    for stream, n in finished:
        assert await _drain(stream) == n
    assert await _drain(two) == 18
    await long.next()
    ae.abort(long)
    deadline = time.monotonic() + 60  # generous: the sink has all five within milliseconds on a quiet machine
    while len(sink.seen) < 5 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert len(sink.seen) == 5, sink.seen
    got = {length: (len(t.inter_token), t.num_tokens, reason, t.first_token is not None, end >= t.arrival)
           for length, (t, end, reason) in sink.seen.items()}
    for n, length in lengths.items():
        # One output step per token (the mock engine gives every running request a token per step).
        assert got[length] == (n - 1, n, "length", True, True)
    assert got[14] == (8, 18, "length", True, True)
    gaps, tokens, reason, started, _ = got[15]
    assert reason == "abort" and started and 1 <= tokens < 200 and gaps == tokens - 1
    timing = sink.seen[13][0]
    assert all(g > 0 for g in timing.inter_token)
    assert timing.arrival <= timing.first_scheduled <= timing.first_token <= timing.last_token
