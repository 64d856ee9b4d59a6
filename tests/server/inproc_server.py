"""The app around an already-loaded engine, in the test's own process, on a real socket: for tests that need
options or engine state a `hetero-infer serve` process would hide."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp.test_utils import TestServer

from hetero_infer.contracts.server_options import ServerOptions
from hetero_infer.worker.server.app import create_app
from hetero_infer.worker.server.state import ServerState


@asynccontextmanager
async def inproc_server(engine: Any, **options: Any) -> AsyncIterator[str]:
    """The server's base URL (no trailing slash); `options` are ServerOptions fields (access log off)."""
    state = ServerState(ServerOptions(**{"access_log": False, **options}))
    server = TestServer(create_app(state), host="127.0.0.1")
    await server.start_server()
    client = state.start_engine(engine, max_num_seqs=engine.config.max_num_seqs)
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        client.shutdown()
        await server.close()
