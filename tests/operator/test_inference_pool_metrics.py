"""What the InferencePool's endpoint picker (EPP) reads from the pods it selects: a worker serves it, on the pool's
target port, at the EPP's default path, under the EPP's default names.

The names are the EPP's defaults in kubernetes-sigs/gateway-api-inference-extension v1.5.0
(pkg/epp/server/options.go, NewOptions; the last release with the EPP in that repository, which then moved to
llm-d/llm-d-inference-scheduler) and the model-server protocol (docs/proposals/003-model-server-protocol). The EPP
tolerates a missing family (pkg/epp/backend/metrics: a partial update, logged at trace level): the LoRA one is
optional for a server without LoRA adapters, as ours is. EPP releases v1.0 to v1.2 defaulted KV usage to vLLM's
old `vllm:gpu_cache_usage_perc`, which workers do not serve: docs/kubernetes.md says which flag to pass there.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from prometheus_client.parser import text_string_to_metric_families

from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.contracts.server_options import ServerOptions
from hetero_infer.operator import constants as c
from hetero_infer.operator.manifests import Owner, children, worker_args
from hetero_infer.operator.spec import parse_spec
from hetero_infer.worker.core.engine import LLMEngine
from hetero_infer.worker.server.app import create_app
from hetero_infer.worker.server.state import ServerState

EPP_METRICS_PATH = "/metrics"  # ModelServerMetricsPath
EPP_GAUGES = {  # option -> default metric name, both gauges
    "TotalQueuedRequestsMetric": "vllm:num_requests_waiting",
    "TotalRunningRequestsMetric": "vllm:num_requests_running",
    "KVCacheUsagePercentageMetric": "vllm:kv_cache_usage_perc",
    "CacheInfoMetric": "vllm:cache_config_info",  # labels block_size and num_gpu_blocks, read as integers
}
EPP_OPTIONAL = {"LoRAInfoMetric": "vllm:lora_requests_info"}


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    return LLMEngine(EngineConfig(executor="mock", max_model_len=256, max_num_blocks=64))


@pytest.fixture
async def scraped(engine: LLMEngine) -> AsyncIterator[dict[str, Any]]:
    """The worker's exposition at the EPP's path, parsed by the Prometheus client's own text parser."""
    state = ServerState(ServerOptions(access_log=False))
    server = TestServer(create_app(state))
    await server.start_server()
    client = state.start_engine(engine, max_num_seqs=engine.config.max_num_seqs)
    try:
        async with aiohttp.ClientSession() as session, session.get(server.make_url(EPP_METRICS_PATH)) as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
            yield {f.name: f for f in text_string_to_metric_families(await r.text())}
    finally:
        client.shutdown()
        await server.close()


def test_the_pool_targets_the_port_the_worker_serves_on() -> None:
    spec = parse_spec({"model": {"name": "m"}, "router": {"inferencePool": {"endpointPicker": "epp"}}})
    pool = children(Owner("smol", "ns", "u"), spec).inference_pool
    assert pool is not None
    [port] = pool["spec"]["targetPorts"]
    args = worker_args(spec)
    assert int(args[args.index("--port") + 1]) == port["number"] == c.WORKER_PORT


async def test_the_worker_serves_what_the_endpoint_picker_reads(scraped: dict[str, Any]) -> None:
    for option, name in EPP_GAUGES.items():
        assert name in scraped, f"{option}: the EPP reads {name}, the worker does not serve it"
        family = scraped[name]
        assert family.type == "gauge" and family.samples, name
    usage = scraped["vllm:kv_cache_usage_perc"].samples[0].value
    assert 0.0 <= usage <= 1.0  # a fraction, as vLLM's (the EPP's scorers use 1 - usage)
    (info,) = scraped["vllm:cache_config_info"].samples
    assert int(info.labels["block_size"]) > 0 and int(info.labels["num_gpu_blocks"]) == 64
    for name in EPP_OPTIONAL.values():
        assert name not in scraped or scraped[name].type == "gauge", name
