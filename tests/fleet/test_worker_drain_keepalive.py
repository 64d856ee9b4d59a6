"""A rollout without the router: the Service sends clients straight to the workers (router.enabled false, the
default). A client of the official `openai` SDK (its default retries) keeps its connection to the old worker
alive; the old worker leaves the Service, gets SIGTERM and drains a long stream; the client's next request, sent
on its kept-alive connection, is refused with 503 and `Connection: close`, so the SDK's retry opens a new
connection, which the Service sends to the new worker. Without `Connection: close` every retry went back to the
draining worker on the same connection and the request failed."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import openai
import pytest
from fleet import Service, running_requests, start_all, start_worker

pytestmark = pytest.mark.slow  # two worker processes and a 10 s stream


async def test_a_kept_alive_sdk_client_is_moved_off_a_draining_worker() -> None:
    old, new = await start_all([lambda: start_worker(0.05, 60.0)] * 2)
    service = Service()
    await service.start()
    try:
        service.add(old)
        client = openai.OpenAI(base_url=service.url + "/v1", api_key="unused", timeout=60)
        first = await asyncio.to_thread(client.completions.create, model="mock", prompt="hello", max_tokens=2)
        assert first.usage.completion_tokens == 2  # the SDK's pooled connection now goes to the old worker

        async with aiohttp.ClientSession() as session:
            # A long stream keeps the old worker draining (on its own connection, made before it left).
            async with session.post(service.url + "/v1/completions", json={
                    "model": "mock", "prompt": "long", "max_tokens": 200, "ignore_eos": True, "stream": True}) as r:
                assert r.status == 200 and await running_requests(old) == 1
                service.add(new)  # the rollout: the new pod is Ready, the old one leaves the Service
                service.remove(old)
                old.terminate()
                for _ in range(100):  # draining: /readyz fails
                    async with session.get(old.url + "/readyz") as ready:
                        if ready.status == 503:
                            break
                    await asyncio.sleep(0.05)
                else:
                    raise AssertionError("the old worker did not start draining")

                second = await asyncio.to_thread(client.completions.create, model="mock", prompt="hello again",
                                                 max_tokens=2)
                assert second.usage.completion_tokens == 2
                events = [line[6:].strip() async for line in r.content if line.startswith(b"data: ")]
            assert events[-1] == b"[DONE]" and json.loads(events[-2])["choices"][0]["finish_reason"] == "length"
        assert await asyncio.wait_for(asyncio.to_thread(old.proc.wait), 60) == 0
        client.close()
    finally:
        await service.stop()
        await asyncio.gather(*(asyncio.to_thread(p.stop) for p in (old, new)))
