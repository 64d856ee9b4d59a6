"""What inference-perf (and aiperf) read from a vLLM server, served the same way: the per-request phase times,
request parameters, tokens per engine step and prefix-cache series under vLLM's names, types and buckets
(vllm/v1/metrics/loggers.py), and `usage.prompt_tokens_details.cached_tokens` in responses (vLLM's
`--enable-prompt-tokens-details`, on by default here). A real server (the shared mock: 512-token context) and
the official `openai` client; the values are checked against the responses' own usage."""

from __future__ import annotations

import itertools
import math
from collections.abc import AsyncIterator

import openai
import pytest
from inproc_server import inproc_server
from prometheus_client.parser import text_string_to_metric_families
from server_proc import ServerProcess, http

from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.worker.core.engine import LLMEngine

VLLM_LATENCY = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
                960.0, 1920.0, 7680.0]
TOKENS_TO_512 = [1, 2, 5, 10, 20, 50, 100, 200, 500]  # vLLM's build_1_2_5_buckets(max_model_len=512)
EXPECTED = {  # vLLM name: (type, buckets, our name)
    "vllm:request_inference_time_seconds": ("histogram", VLLM_LATENCY, "hetero_infer_request_inference_time_seconds"),
    "vllm:request_prefill_time_seconds": ("histogram", VLLM_LATENCY, "hetero_infer_request_prefill_time_seconds"),
    "vllm:request_decode_time_seconds": ("histogram", VLLM_LATENCY, "hetero_infer_request_decode_time_seconds"),
    "vllm:request_max_num_generation_tokens": ("histogram", TOKENS_TO_512,
                                               "hetero_infer_request_max_num_generation_tokens"),
    "vllm:request_params_n": ("histogram", [1, 2, 5, 10, 20], "hetero_infer_request_params_n"),
    "vllm:request_params_max_tokens": ("histogram", TOKENS_TO_512, "hetero_infer_request_params_max_tokens"),
    "vllm:request_prefill_kv_computed_tokens": ("histogram", TOKENS_TO_512,
                                                "hetero_infer_request_prefill_kv_computed_tokens"),
    "vllm:iteration_tokens_total": ("histogram", [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384],
                                    "hetero_infer_iteration_tokens"),
    "vllm:prompt_tokens_cached": ("counter", None, "hetero_infer_prompt_tokens_cached"),
}
_fresh = itertools.count()


def _families(server: ServerProcess) -> dict:
    return {f.name: f for f in text_string_to_metric_families(http("GET", server.url + "/metrics").text)}


def test_names_types_and_buckets_are_vllms(server: ServerProcess, model_name: str) -> None:
    assert http("POST", server.url + "/v1/completions", {"prompt": "x " * 30, "max_tokens": 3}).status == 200
    families = _families(server)
    for name, (kind, buckets, ours) in EXPECTED.items():
        family = families[name]
        assert family.type == kind, name
        assert family.samples and all(s.labels["model_name"] == model_name for s in family.samples), name
        if buckets is not None:
            bounds = [float(s.labels["le"]) for s in family.samples if s.name.endswith("_bucket")]
            assert bounds == [*map(float, buckets), math.inf], name
        theirs = {(s.name.replace(name, ""), tuple(sorted(s.labels.items())), s.value) for s in family.samples}
        mine = {(s.name.replace(ours, ""), tuple(sorted(s.labels.items())), s.value) for s in families[ours].samples}
        assert theirs == mine, name  # one measurement, two names


def test_values_follow_the_responses(server: ServerProcess, model_name: str) -> None:
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    prompt = f"a prompt of many tokens {next(_fresh)} " + "cache me " * 60
    before = server.metrics()
    first = client.completions.create(model=model_name, prompt=prompt, max_tokens=5, n=2,
                                      extra_body={"ignore_eos": True})
    stream = client.completions.create(model=model_name, prompt=prompt, max_tokens=5, n=2, stream=True,
                                       stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    second = [c for c in stream if c.usage is not None][-1]
    after = server.metrics()

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    p = first.usage.prompt_tokens
    cached = [first.usage.prompt_tokens_details.cached_tokens, second.usage.prompt_tokens_details.cached_tokens]
    assert cached[0] == 0 and 0 < cached[1] < p and cached[1] % 16 == 0, cached  # whole 16-token blocks, again
    assert delta("vllm:prompt_tokens_cached_total") == sum(cached)
    assert delta("vllm:request_prefill_kv_computed_tokens_sum") == 2 * p - sum(cached)
    assert delta("vllm:request_prefill_kv_computed_tokens_count") == 2
    assert delta("vllm:request_params_n_sum") == 4 and delta("vllm:request_params_n_count") == 2
    assert delta("vllm:request_params_max_tokens_sum") == 10
    assert delta("vllm:request_max_num_generation_tokens_sum") == 10  # the longer sample of each: 5 tokens
    for phase in ("inference", "prefill", "decode"):
        assert delta(f"vllm:request_{phase}_time_seconds_count") == 2, phase
    assert delta("vllm:request_inference_time_seconds_sum") == pytest.approx(
        delta("vllm:request_prefill_time_seconds_sum") + delta("vllm:request_decode_time_seconds_sum"), abs=1e-6)
    assert delta("vllm:request_decode_time_seconds_sum") > 0
    assert delta("vllm:iteration_tokens_total_count") >= 5  # at least a step per token
    assert delta("vllm:iteration_tokens_total_sum") >= 2 * p - sum(cached) + 4 * 4  # prefills, then decodes


@pytest.fixture
async def no_details_url() -> AsyncIterator[str]:
    async with inproc_server(LLMEngine(EngineConfig(executor="mock", max_model_len=256)),
                             enable_prompt_tokens_details=False) as url:
        yield url


async def test_prompt_tokens_details_can_be_turned_off(no_details_url: str) -> None:
    client = openai.AsyncOpenAI(base_url=no_details_url + "/v1", api_key="unused", max_retries=0)
    model = (await client.models.list()).data[0].id
    r = await client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert r.usage is not None and r.usage.prompt_tokens_details is None


def test_cached_tokens_in_a_whole_response(server: ServerProcess, model_name: str) -> None:
    """Not streamed: the second request's prompt is served from the cache, and its usage says so (the same number
    a stream's usage chunk gives and the counter adds)."""
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    prompt = f"a whole response {next(_fresh)} " + "cache me " * 60
    client.completions.create(model=model_name, prompt=prompt, max_tokens=2)
    before = server.metrics()
    again = client.completions.create(model=model_name, prompt=prompt, max_tokens=2)
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached < again.usage.prompt_tokens and cached % 16 == 0, cached
    assert server.metrics()["vllm:prompt_tokens_cached_total"] - before.get("vllm:prompt_tokens_cached_total", 0) \
        == cached
