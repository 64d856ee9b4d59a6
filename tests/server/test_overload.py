"""Overload and abandonment on a deliberately small server: 429 + Retry-After, timeouts, disconnects."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator

import aiohttp
import pytest
from server_proc import ServerProcess, http


@pytest.fixture(scope="module")
def small() -> Iterator[ServerProcess]:
    # 2 running + 2 waiting sequences at most; 50 ms per step; requests time out after 1.5 s.
    s = ServerProcess("--max-num-seqs", "2", "--max-queue-len", "2", "--mock-step-latency-s", "0.05",
                      "--request-timeout", "1.5", "--retry-after", "3", "--max-model-len", "512")
    yield s
    assert s.stop() == 0, s.log()


def _engine_idle(server: ServerProcess) -> bool:
    m = server.metrics()
    return (m["hetero_infer_num_requests_running"] == 0 and m["hetero_infer_num_requests_waiting"] == 0
            and m["hetero_infer_kv_cache_usage_ratio"] == 0)


async def _wait_idle(server: ServerProcess, timeout: float) -> float:
    t0 = time.monotonic()
    while not _engine_idle(server):
        assert time.monotonic() - t0 < timeout, server.metrics()
        await asyncio.sleep(0.02)
    return time.monotonic() - t0


async def _first_event(resp: aiohttp.ClientResponse) -> dict:
    async for raw in resp.content:
        line = raw.decode().strip()
        if line.startswith("data: "):
            return json.loads(line[6:])
    raise AssertionError("stream ended without an event")


async def test_queue_full_gives_429_with_retry_after(small: ServerProcess) -> None:
    body = {"prompt": "hold", "max_tokens": 10, "stream": True}
    async with aiohttp.ClientSession() as session:
        held = [await session.post(small.url + "/v1/completions", json=body) for _ in range(4)]
        try:
            for r in held:
                assert r.status == 200
            r = http("POST", small.url + "/v1/completions", {"prompt": "one more", "max_tokens": 2})
            assert r.status == 429
            assert r.headers["retry-after"] == "3"
            err = r.json()["error"]
            assert err["code"] == "rate_limit_exceeded" and err["type"] == "rate_limit_error"
            # n counts: two sequences do not fit either.
            assert http("POST", small.url + "/v1/chat/completions",
                        {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2, "n": 2}).status == 429
        finally:
            for r in held:
                await r.read()
                r.release()
    assert http("POST", small.url + "/v1/completions", {"prompt": "now", "max_tokens": 2}).status == 200
    m = small.metrics()
    assert m["hetero_infer_requests_rejected_total{reason=queue_full}"] >= 2


async def test_request_timeout(small: ServerProcess) -> None:
    t0 = time.monotonic()
    r = http("POST", small.url + "/v1/completions", {"prompt": "slow", "max_tokens": 400})
    assert r.status == 504, r.text
    assert r.json()["error"]["code"] == "request_timeout"
    assert 1.4 < time.monotonic() - t0 < 5
    async with aiohttp.ClientSession() as session:
        async with session.post(small.url + "/v1/completions",
                                json={"prompt": "slow", "max_tokens": 400, "stream": True}) as resp:
            assert resp.status == 200
            text = await resp.text()
    events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["code"] == "request_timeout"
    await _wait_idle(small, 2.0)


async def test_stream_disconnect_frees_kv_at_once(small: ServerProcess) -> None:
    async with aiohttp.ClientSession() as session:
        resp = await session.post(small.url + "/v1/completions",
                                  json={"prompt": "disconnect me " * 20, "max_tokens": 50, "stream": True})
        assert resp.status == 200
        await _first_event(resp)
        m = small.metrics()
        assert m["hetero_infer_num_requests_running"] == 1
        assert m["hetero_infer_kv_cache_usage_ratio"] > 0
        resp.close()
    freed_after = await _wait_idle(small, 2.0)
    assert freed_after < 0.5  # well before the 50-token request would have ended (~2.5 s)


async def test_non_stream_disconnect_aborts(small: ServerProcess) -> None:
    before = small.metrics().get("hetero_infer_requests_finished_total{finish_reason=abort}", 0.0)
    async with aiohttp.ClientSession() as session:
        task = asyncio.create_task(session.post(small.url + "/v1/completions",
                                                json={"prompt": "give up", "max_tokens": 50}))
        await asyncio.sleep(0.4)
        assert small.metrics()["hetero_infer_num_requests_running"] == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert await _wait_idle(small, 2.0) < 0.5
    after = small.metrics()["hetero_infer_requests_finished_total{finish_reason=abort}"]
    assert after == before + 1


async def test_stream_headers_do_not_wait_for_a_queued_first_token(small: ServerProcess) -> None:
    """Headers normally leave with the first events; a request that waits for the engine still gets them soon."""
    async with aiohttp.ClientSession() as session:
        running = [await session.post(small.url + "/v1/completions",
                                      json={"prompt": "hold", "max_tokens": 16, "stream": True}) for _ in range(2)]
        try:
            t0 = time.monotonic()
            async with session.post(small.url + "/v1/completions",  # both sequences taken for ~0.8 s
                                    json={"prompt": "queued", "max_tokens": 4, "stream": True}) as queued:
                headers_after = time.monotonic() - t0
                assert queued.status == 200
                await _first_event(queued)
                first_event_after = time.monotonic() - t0
                await queued.read()
        finally:
            for r in running:
                await r.read()
                r.release()
    assert headers_after < 0.4 < 0.5 < first_event_after, (headers_after, first_event_after)
