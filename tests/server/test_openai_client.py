"""The official `openai` client against a real mock-executor server: sync, async and streaming."""

from __future__ import annotations

import asyncio

import openai
import pytest
from server_proc import ServerProcess, http


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=30)


MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."}]


def test_models(client: openai.OpenAI, model_name: str) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [model_name]
    assert client.models.retrieve(model_name).id == model_name
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_completion(client: openai.OpenAI, model_name: str) -> None:
    r = client.completions.create(model=model_name, prompt="The capital of France is", max_tokens=7)
    assert r.object == "text_completion" and r.model == model_name
    assert len(r.choices) == 1
    choice = r.choices[0]
    assert choice.finish_reason == "length" and choice.text
    assert r.usage is not None
    assert r.usage.completion_tokens == 7
    assert r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + 7


def test_completion_stream_matches_non_stream(client: openai.OpenAI, model_name: str) -> None:
    full = client.completions.create(model=model_name, prompt="Once upon a time", max_tokens=12)
    stream = client.completions.create(model=model_name, prompt="Once upon a time", max_tokens=12, stream=True,
                                       stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == full.choices[0].text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 12
    assert all(c.usage is None for c in chunks[:-1])


def test_chat(client: openai.OpenAI, model_name: str) -> None:
    r = client.chat.completions.create(model=model_name, messages=MESSAGES, max_completion_tokens=6)
    assert r.object == "chat.completion"
    msg = r.choices[0].message
    assert msg.role == "assistant" and msg.content
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 6
    # max_tokens (deprecated) works too, and max_completion_tokens wins when both are given.
    r2 = client.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=3)
    assert r2.usage.completion_tokens == 3
    r3 = client.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=3, max_completion_tokens=5)
    assert r3.usage.completion_tokens == 5


def test_chat_stream(client: openai.OpenAI, model_name: str) -> None:
    full = client.chat.completions.create(model=model_name, messages=MESSAGES, max_completion_tokens=10)
    chunks = list(client.chat.completions.create(model=model_name, messages=MESSAGES, max_completion_tokens=10,
                                                 stream=True, stream_options={"include_usage": True}))
    content = [c for c in chunks if c.choices]
    assert content[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in content) == full.choices[0].message.content
    assert content[-1].choices[0].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == 10
    assert len({c.id for c in chunks}) == 1


def test_chat_stream_without_usage(client: openai.OpenAI, model_name: str) -> None:
    chunks = list(client.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=4, stream=True))
    assert all(c.choices for c in chunks) and chunks[-1].choices[0].finish_reason == "length"


async def test_async_client_concurrent(server: ServerProcess, model_name: str) -> None:
    client = openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=30)
    async with client:
        async def one(i: int) -> str:
            r = await client.chat.completions.create(
                model=model_name, messages=[{"role": "user", "content": f"Count to {i}"}], max_tokens=5)
            return r.choices[0].message.content or ""

        async def streamed(i: int) -> str:
            stream = await client.completions.create(model=model_name, prompt=f"item {i}", max_tokens=8, stream=True)
            return "".join([c.choices[0].text async for c in stream])

        results = await asyncio.gather(*[one(i) for i in range(16)], *[streamed(i) for i in range(16)])
    assert all(results)


def test_n_choices(client: openai.OpenAI, model_name: str) -> None:
    r = client.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=5, n=3)
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    assert r.usage.completion_tokens == 15
    chunks = list(client.completions.create(model=model_name, prompt="abc", max_tokens=5, n=3, stream=True))
    texts = {i: "".join(c.choices[0].text for c in chunks if c.choices[0].index == i) for i in range(3)}
    finished = {c.choices[0].index for c in chunks if c.choices[0].finish_reason}
    assert finished == {0, 1, 2} and all(texts.values())


def test_multiple_prompts_and_token_ids(client: openai.OpenAI, model_name: str) -> None:
    r = client.completions.create(model=model_name, prompt=["first prompt", "second prompt"], max_tokens=4, n=2)
    assert sorted(c.index for c in r.choices) == [0, 1, 2, 3]
    assert r.usage.completion_tokens == 16
    ids = client.completions.create(model=model_name, prompt=[1000, 2000, 3000], max_tokens=3)
    assert ids.usage.prompt_tokens == 3 and ids.usage.completion_tokens == 3
    batch = client.completions.create(model=model_name, prompt=[[1000, 2000], [3000]], max_tokens=2)
    assert batch.usage.prompt_tokens == 3 and len(batch.choices) == 2


def test_stop_string(client: openai.OpenAI, model_name: str) -> None:
    full = client.completions.create(model=model_name, prompt="stop test", max_tokens=30).choices[0].text
    assert len(full) > 6
    stop = full[3:6]
    r = client.completions.create(model=model_name, prompt="stop test", max_tokens=30, stop=[stop])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == full[: full.index(stop)]
    streamed = list(client.completions.create(model=model_name, prompt="stop test", max_tokens=30, stop=stop,
                                              stream=True))
    assert "".join(c.choices[0].text for c in streamed) == full[: full.index(stop)]
    assert streamed[-1].choices[0].finish_reason == "stop"


def test_echo(client: openai.OpenAI, model_name: str) -> None:
    plain = client.completions.create(model=model_name, prompt="Echo me", max_tokens=3).choices[0].text
    echoed = client.completions.create(model=model_name, prompt="Echo me", max_tokens=3, echo=True).choices[0].text
    assert echoed == "Echo me" + plain


def test_sampling_options_accepted(client: openai.OpenAI, model_name: str) -> None:
    r = client.chat.completions.create(
        model=model_name, messages=MESSAGES, max_tokens=4, temperature=0.7, top_p=0.9, seed=1234,
        presence_penalty=0.5, frequency_penalty=0.3, stop=["\n\n"], user="test",
        extra_body={"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1, "min_tokens": 2},
    )
    assert r.usage.completion_tokens == 4
    again = client.chat.completions.create(
        model=model_name, messages=MESSAGES, max_tokens=4, temperature=0.7, top_p=0.9, seed=1234,
        presence_penalty=0.5, frequency_penalty=0.3, stop=["\n\n"], user="test",
        extra_body={"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1, "min_tokens": 2},
    )
    assert again.choices[0].message.content == r.choices[0].message.content


def test_logprobs_fields_are_accepted(client: openai.OpenAI, model_name: str) -> None:
    # Logprob values themselves are checked with the real model (test_real_model.py): the mock samples none.
    r = client.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=3, logprobs=True,
                                       top_logprobs=2)
    assert r.choices[0].logprobs is not None and isinstance(r.choices[0].logprobs.content, list)
    c = client.completions.create(model=model_name, prompt="logprobs", max_tokens=3, logprobs=2)
    assert c.choices[0].logprobs is not None
    plain = client.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=3)
    assert plain.choices[0].logprobs is None


def test_health_endpoints(server: ServerProcess) -> None:
    assert http("GET", server.url + "/healthz").json() == {"status": "ok"}
    assert http("GET", server.url + "/readyz").json() == {"status": "ready"}
    spec = http("GET", server.url + "/openapi.json").json()
    assert {"/v1/completions", "/v1/chat/completions", "/v1/models", "/healthz", "/readyz", "/metrics"} <= set(
        spec["paths"])
