"""Overload and abandonment on a deliberately small server: 429 + Retry-After, timeouts, disconnects.

Nothing here depends on how fast a busy machine runs: held requests last far longer than any wait for a condition
(which has a generous deadline), and "aborted on disconnect" is read from the finish-reason counter, not from how
soon the KV cache empties.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from server_proc import ServerProcess, http, metric

from hetero_infer.worker.core.engine import LLMEngine
from hetero_infer.worker.server.app import create_app
from hetero_infer.worker.server.cli import build_parser, resolve_options
from hetero_infer.worker.server.state import ServerState

DEADLINE_S = 30.0  # generous: what is awaited happens within a second on a quiet machine
HOLD_TOKENS = 400  # 50 ms a step: a held request would run for 20 s, far beyond any wait below
ABORTED = "hetero_infer_requests_finished_total{finish_reason=abort}"


@pytest.fixture(scope="module")
def small() -> Iterator[ServerProcess]:
    # 2 running + 2 waiting sequences at most; 50 ms per step.
    s = ServerProcess("--max-num-seqs", "2", "--max-queue-len", "2", "--mock-step-latency-s", "0.05",
                      "--retry-after", "3", "--max-model-len", "512")
    yield s
    assert s.stop(DEADLINE_S) == 0, s.log()  # a clean exit, however long a busy machine takes


def _engine_idle(server: ServerProcess) -> bool:
    m = server.metrics()
    return (m["hetero_infer_num_requests_running"] == 0 and m["hetero_infer_num_requests_waiting"] == 0
            and m["hetero_infer_kv_cache_usage_ratio"] == 0)


async def _wait_for(condition: Callable[[], bool], what: Callable[[], object]) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, what()
        await asyncio.sleep(0.02)


async def _wait_idle(server: ServerProcess) -> None:
    await _wait_for(lambda: _engine_idle(server), server.metrics)


def _engine_holds(server: ServerProcess, running: int, waiting: int) -> bool:
    m = server.metrics()
    return m["hetero_infer_num_requests_running"] == running and m["hetero_infer_num_requests_waiting"] == waiting


async def _first_event(resp: aiohttp.ClientResponse) -> dict:
    async for raw in resp.content:
        line = raw.decode().strip()
        if line.startswith("data: "):
            return json.loads(line[6:])
    raise AssertionError("stream ended without an event")


async def test_queue_full_gives_429_with_retry_after(small: ServerProcess) -> None:
    body = {"prompt": "hold", "max_tokens": HOLD_TOKENS, "stream": True}
    async with aiohttp.ClientSession() as session:
        held = [await session.post(small.url + "/v1/completions", json=body) for _ in range(4)]
        try:
            for r in held:
                assert r.status == 200
            await _wait_for(lambda: _engine_holds(small, running=2, waiting=2), small.metrics)
            r = http("POST", small.url + "/v1/completions", {"prompt": "one more", "max_tokens": 2})
            assert r.status == 429
            assert r.headers["retry-after"] == "3"
            err = r.json()["error"]
            assert err["code"] == "rate_limit_exceeded" and err["type"] == "rate_limit_error"
            # n counts: two sequences do not fit either.
            assert http("POST", small.url + "/v1/chat/completions",
                        {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "n": 2}).status == 429
            assert _engine_holds(small, running=2, waiting=2)  # the held requests were all there throughout
        finally:
            for r in held:
                r.close()
    await _wait_idle(small)
    assert http("POST", small.url + "/v1/completions", {"prompt": "now", "max_tokens": 2}).status == 200
    m = small.metrics()
    assert m["hetero_infer_requests_rejected_total{reason=queue_full}"] >= 2


@pytest.fixture
async def timeout_server() -> AsyncIterator[str]:
    """The app in-process with the options of `serve --request-timeout 1.5` (a 50 ms step): a request's own
    timeout cannot be told apart from a slow machine's on a shared server, so this one serves only that test."""
    options, config = resolve_options(build_parser().parse_args(
        ["--executor", "mock", "--mock-step-latency-s", "0.05", "--request-timeout", "1.5", "--max-model-len", "512",
         "--no-access-log"]), environ={})
    engine = LLMEngine(config)
    state = ServerState(options)
    server = TestServer(create_app(state))
    await server.start_server()
    async_engine = state.start_engine(engine, max_num_seqs=config.max_num_seqs)
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        async_engine.shutdown()
        await server.close()


async def test_request_timeout(timeout_server: str) -> None:
    body = {"prompt": "slow", "max_tokens": HOLD_TOKENS}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(DEADLINE_S)) as session:
        t0 = time.monotonic()
        async with session.post(timeout_server + "/v1/completions", json=body) as resp:
            assert resp.status == 504, await resp.text()
            assert (await resp.json())["error"]["code"] == "request_timeout"
        assert time.monotonic() - t0 > 1.4  # not before its time (a busy machine only makes it later)
        async with session.post(timeout_server + "/v1/completions", json={**body, "stream": True}) as resp:
            assert resp.status == 200
            text = await resp.text()
    events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["code"] == "request_timeout"
    # Cut short, not run to its end: fewer tokens than asked for came before the error.
    streamed = sum(len(c["text"]) > 0 for e in events[:-2] for c in json.loads(e)["choices"])
    assert streamed < HOLD_TOKENS


async def test_stream_disconnect_frees_kv_at_once(small: ServerProcess) -> None:
    before = metric(small.metrics(), ABORTED)
    async with aiohttp.ClientSession() as session:
        resp = await session.post(small.url + "/v1/completions",
                                  json={"prompt": "disconnect me " * 20, "max_tokens": HOLD_TOKENS, "stream": True})
        assert resp.status == 200
        await _first_event(resp)
        m = small.metrics()
        assert m["hetero_infer_num_requests_running"] == 1
        assert m["hetero_infer_kv_cache_usage_ratio"] > 0
        resp.close()
    await _wait_idle(small)  # long before the request could have ended on its own (20 s)...
    assert metric(small.metrics(), ABORTED) == before + 1  # ...and it did not: it was aborted


async def test_non_stream_disconnect_aborts(small: ServerProcess) -> None:
    before = metric(small.metrics(), ABORTED)
    async with aiohttp.ClientSession() as session:
        task = asyncio.create_task(session.post(small.url + "/v1/completions",
                                                json={"prompt": "give up", "max_tokens": HOLD_TOKENS}))
        await _wait_for(lambda: _engine_holds(small, running=1, waiting=0), small.metrics)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    await _wait_idle(small)
    assert metric(small.metrics(), ABORTED) == before + 1
