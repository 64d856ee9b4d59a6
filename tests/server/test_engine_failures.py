"""Failures inside the engine, with the app in-process around a real mock-executor engine (so faults can be
injected): a failing step fails only its requests (500-shaped), a broken engine turns /readyz red."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.contracts.sampling_params import SamplingParams
from hetero_infer.contracts.server_options import ServerOptions
from hetero_infer.worker.core.busy_loop import EngineRequest
from hetero_infer.worker.core.engine import LLMEngine
from hetero_infer.worker.frontend.inproc import InprocEngineClient
from hetero_infer.worker.server.app import create_app
from hetero_infer.worker.server.state import ServerState


@pytest.fixture(scope="module")
def engine() -> Iterator[LLMEngine]:
    yield LLMEngine(EngineConfig(executor="mock", max_model_len=256, mock_step_latency_s=0.01))


@pytest.fixture
async def served(engine: LLMEngine) -> AsyncIterator[tuple[str, ServerState, LLMEngine]]:
    state = ServerState(ServerOptions(access_log=False))
    server = TestServer(create_app(state))
    await server.start_server()
    async_engine = state.start_engine(engine, max_num_seqs=engine.config.max_num_seqs)
    try:
        yield str(server.make_url("")).rstrip("/"), state, engine
    finally:
        async_engine.shutdown()
        await server.close()
        for request_id in list(engine.requests):  # what a broken engine thread left behind
            engine.abort_request(request_id)


async def _post(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with session.post(url, json=body) as r:
        return r.status, await r.json()


async def _stream_events(resp: aiohttp.ClientResponse) -> list[str]:
    return [line[6:] for line in (await resp.text()).splitlines() if line.startswith("data: ")]


async def test_failed_step_fails_only_its_requests(served: tuple[str, ServerState, LLMEngine],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    url, state, engine = served
    real_execute = engine.executor.execute
    fail = {"armed": False}

    def flaky_execute(sched: Any) -> Any:
        if fail["armed"]:
            fail["armed"] = False
            raise RuntimeError("injected executor fault")
        return real_execute(sched)

    monkeypatch.setattr(engine.executor, "execute", flaky_execute)
    async with aiohttp.ClientSession() as session:
        stream = await session.post(url + "/v1/completions", json={"prompt": "victim", "max_tokens": 100,
                                                                   "stream": True})
        assert stream.status == 200
        await stream.content.readline()  # the first event is out: the request is running
        fail["armed"] = True
        events = await _stream_events(stream)
        assert events[-1] == "[DONE]"
        err = json.loads(events[-2])["error"]
        assert err["code"] == "engine_error" and err["type"] == "server_error"
        assert "injected executor fault" in err["message"]

        fail["armed"] = True
        status, body = await _post(session, url + "/v1/completions", {"prompt": "victim 2", "max_tokens": 5})
        assert status == 500 and body["error"]["code"] == "engine_error"

        # The engine keeps serving.
        status, body = await _post(session, url + "/v1/completions", {"prompt": "survivor", "max_tokens": 5})
        assert status == 200 and body["usage"]["completion_tokens"] == 5
        async with session.get(url + "/readyz") as r:
            assert r.status == 200
    assert state.engine.healthy
    assert state.engine.num_open_requests == 0
    assert engine.stats().kv_cache_usage == 0


async def test_a_bug_mid_stream_ends_the_stream_cleanly(served: tuple[str, ServerState, LLMEngine],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """An exception while a stream is being written (its headers are out) ends it with an error event and
    [DONE], as engine errors do, and aborts its request; a second response (status line and headers) written
    into the chunked body made it unreadable for every HTTP client."""
    from hetero_infer.worker.server import completions

    url, state, engine = served
    real_chunk = completions.CompletionFormatter._chunk
    calls = {"n": 0}

    def buggy_chunk(self: Any, idx: int, d: Any, ch: Any) -> str:
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyError("injected formatter bug")
        return real_chunk(self, idx, d, ch)

    monkeypatch.setattr(completions.CompletionFormatter, "_chunk", buggy_chunk)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session:
        async with session.post(url + "/v1/completions", json={"prompt": "victim", "max_tokens": 100,
                                                               "ignore_eos": True, "stream": True}) as stream:
            assert stream.status == 200
            events = await _stream_events(stream)
        assert events[-1] == "[DONE]" and len(events) >= 3, events
        err = json.loads(events[-2])["error"]
        assert err["code"] == "internal_error" and err["type"] == "server_error"
        assert "injected" not in err["message"]  # internals stay in the log
        monkeypatch.setattr(completions.CompletionFormatter, "_chunk", real_chunk)
        status, body = await _post(session, url + "/v1/completions", {"prompt": "survivor", "max_tokens": 5})
        assert status == 200 and body["usage"]["completion_tokens"] == 5
    assert state.engine.num_open_requests == 0
    assert engine.stats().kv_cache_usage == 0


async def test_broken_engine_turns_readyz_red(served: tuple[str, ServerState, LLMEngine],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    url, state, engine = served
    real_step = engine.step_deltas  # what the busy loop calls
    broken = {"now": False}

    def step() -> Any:
        if broken["now"]:
            raise RuntimeError("scheduler invariant violated")
        return real_step()

    monkeypatch.setattr(engine, "step_deltas", step)
    async with aiohttp.ClientSession() as session:
        stream = await session.post(url + "/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100, "stream": True})
        await stream.content.readline()
        broken["now"] = True
        events = await _stream_events(stream)
        err = json.loads(events[-2])["error"]
        assert err["code"] == "engine_failed" and "scheduler invariant violated" in err["message"]

        async with session.get(url + "/readyz") as r:
            assert r.status == 503
            body = await r.json()
            assert body["status"] == "engine_failed" and "scheduler invariant violated" in body["error"]
        async with session.get(url + "/healthz") as r:  # liveness fails too: the kubelet restarts the pod
            assert r.status == 503 and (await r.json())["status"] == "engine_failed"
        status, body = await _post(session, url + "/v1/completions", {"prompt": "x", "max_tokens": 2})
        assert status == 503 and body["error"]["code"] == "engine_failed"
        async with session.get(url + "/metrics") as r:
            assert 'hetero_infer_engine_healthy{model_name="' in (text := await r.text())
            assert [line for line in text.splitlines() if line.startswith("hetero_infer_engine_healthy{")][0].endswith(
                " 0.0")
    assert not state.engine.healthy


async def test_async_engine_idles_without_spinning(engine: LLMEngine) -> None:
    """No work: the engine thread sleeps (no steps); work: outputs arrive; abort: blocks are freed at once."""
    ae = InprocEngineClient(engine)
    ae.start()
    try:
        await asyncio.sleep(0.2)
        assert ae.steps == 0
        ids = engine.tokenizer.encode("hello")
        stream = ae.submit([EngineRequest("idle-1", None, ids, SamplingParams(max_tokens=3))])
        last = None
        while outputs := await stream.next():
            last = outputs[-1]
        assert last is not None and last.finished and len(last.outputs[0].token_ids) == 3
        steps = ae.steps
        await asyncio.sleep(0.2)
        assert ae.steps == steps  # idle again

        stream = ae.submit([EngineRequest("abort-1", None, ids * 40, SamplingParams(max_tokens=200))])
        await stream.next()
        assert ae.stats().kv_cache_usage > 0
        ae.abort(stream)
        t0 = time.monotonic()
        while ae.stats().kv_cache_usage > 0 or ae.stats().num_running:
            assert time.monotonic() - t0 < 1.0
            await asyncio.sleep(0.005)
        assert ae.num_open_requests == 0
    finally:
        ae.shutdown()
    assert not ae.healthy
