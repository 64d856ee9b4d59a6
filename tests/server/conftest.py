"""Fixtures: real `hetero-infer serve` processes (mock executor unless a test says otherwise)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from inproc_server import inproc_server
from server_proc import ServerProcess, http

from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.worker.core.engine import LLMEngine


@pytest.fixture(scope="session")
def server() -> Iterator[ServerProcess]:
    """The shared mock server: small context (512) and a 2 ms step, so streams last a little while."""
    s = ServerProcess("--max-model-len", "512", "--mock-step-latency-s", "0.002")
    yield s
    assert s.stop() == 0, s.log()


@pytest.fixture(scope="session")
def model_name(server: ServerProcess) -> str:
    return http("GET", server.base_url + "/models").json()["data"][0]["id"]


@pytest.fixture(scope="session")
def sampling_server() -> Iterator[ServerProcess]:
    """A mock server whose executor returns logits (`--mock-logits`), so the real sampler honours every
    sampling parameter; see `hetero_infer.worker.runner.mock_executor.mock_logits` for the distribution."""
    s = ServerProcess("--max-model-len", "512", "--mock-logits")
    yield s
    assert s.stop() == 0, s.log()


@pytest.fixture(scope="module")
def inproc_engine() -> LLMEngine:
    """A mock-executor engine (256-token context) for the in-process servers of one test module."""
    return LLMEngine(EngineConfig(executor="mock", max_model_len=256))


@pytest.fixture
async def inproc(inproc_engine: LLMEngine, request: pytest.FixtureRequest) -> AsyncIterator[tuple[str, LLMEngine]]:
    """(base URL, engine) of the app in this process around `inproc_engine`; parametrize it indirectly with
    ServerOptions fields."""
    async with inproc_server(inproc_engine, **getattr(request, "param", {})) as url:
        yield url, inproc_engine
