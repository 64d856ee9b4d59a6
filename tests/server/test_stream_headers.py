"""When the headers of a streamed response leave: with its first events, in one write (a write and a wake-up of
the client fewer per request), unless those take long: then on their own, without waiting for the first token.

The app runs in-process around a real mock-executor engine, so that what is checked does not depend on how fast
a busy machine runs: the server's writes are recorded on its socket transport (one write, or two, is a count, not
a time), and the engine's steps can be held, so that "the first token has not been produced yet" is a fact.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.contracts.server_options import ServerOptions
from hetero_infer.worker.core.engine import LLMEngine
from hetero_infer.worker.server import sse
from hetero_infer.worker.server.app import create_app
from hetero_infer.worker.server.state import ServerState

DEADLINE_S = 30.0  # generous: what is awaited happens within milliseconds on a quiet machine


@dataclass
class Served:
    url: str
    writes: list[bytes] = field(default_factory=list)  # what the server handed its socket, write by write
    steps_released: threading.Event = field(default_factory=threading.Event)
    step_waiting: threading.Event = field(default_factory=threading.Event)


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    engine = LLMEngine(EngineConfig(executor="mock", max_model_len=256))
    state = ServerState(ServerOptions(access_log=False))
    app = create_app(state)
    out = Served("")
    out.steps_released.set()
    real_execute = engine.executor.execute

    def held_execute(sched: Any) -> Any:  # the engine thread waits here while a test holds the steps
        out.step_waiting.set()
        assert out.steps_released.wait(2 * DEADLINE_S), "engine steps held too long"
        return real_execute(sched)

    engine.executor.execute = held_execute  # type: ignore[method-assign]

    async def record_writes(request: web.Request, response: web.StreamResponse) -> None:
        transport = request.transport
        assert transport is not None
        write, writelines = transport.write, transport.writelines

        def recording_write(data: bytes) -> None:
            out.writes.append(bytes(data))
            write(data)

        def recording_writelines(chunks: Any) -> None:
            chunks = [bytes(c) for c in chunks]
            out.writes.append(b"".join(chunks))
            writelines(chunks)

        transport.write, transport.writelines = recording_write, recording_writelines  # type: ignore[method-assign]

    app.on_response_prepare.append(record_writes)
    server = TestServer(app)
    await server.start_server()
    async_engine = state.start_engine(engine, max_num_seqs=engine.config.max_num_seqs)
    out.url = str(server.make_url("")).rstrip("/")
    try:
        yield out
    finally:
        out.steps_released.set()
        async_engine.shutdown()
        await server.close()


def _session() -> aiohttp.ClientSession:
    # a connection per request: the write recorder is installed on the connection of each response
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))


def _requests() -> list[tuple[str, dict]]:
    return [
        ("/v1/completions", {"prompt": "hello", "max_tokens": 30, "stream": True}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 30,
                                  "stream": True}),
    ]


async def test_headers_leave_with_the_first_events(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    # However slow the machine, the first events come before this: the headers wait for them.
    monkeypatch.setattr(sse, "HEADERS_MAX_DELAY_S", 10 * DEADLINE_S)
    async with _session() as session:
        for path, body in _requests():
            served.writes.clear()
            async with session.post(served.url + path, json=body, timeout=aiohttp.ClientTimeout(DEADLINE_S)) as r:
                assert r.status == 200 and r.content_type == "text/event-stream"
                text = await r.text()
            assert text.count("data: [DONE]") == 1
            first = served.writes[0]
            head, sep, body_start = first.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200") and sep, served.writes[:2]
            assert b"data: {" in body_start, served.writes[:2]  # the first events went in the same write


async def test_headers_do_not_wait_for_a_first_token_that_is_not_coming(served: Served) -> None:
    """A request whose first token is held back (a queue, a long prefill) still learns soon that it was
    accepted: its headers leave on their own, while the engine has produced nothing for it."""
    async with _session() as session:
        for path, body in _requests():
            served.writes.clear()
            served.step_waiting.clear()
            served.steps_released.clear()  # no engine step completes until released below
            try:
                resp = await asyncio.wait_for(session.post(served.url + path, json=body), DEADLINE_S)
                assert resp.status == 200 and resp.content_type == "text/event-stream"
                assert served.step_waiting.is_set() or await asyncio.to_thread(served.step_waiting.wait, DEADLINE_S)
                # The headers arrived while the engine step that would produce the first token is still held.
                assert not served.steps_released.is_set()
                assert served.writes and served.writes[0].startswith(b"HTTP/1.1 200")
                assert b"data:" not in served.writes[0], served.writes[0]
            finally:
                served.steps_released.set()
            text = await asyncio.wait_for(resp.text(), DEADLINE_S)
            resp.release()
            assert text.startswith("data: {") and text.count("data: [DONE]") == 1

