"""The prefix policy on real engines: two CPU workers with the default model (torch executor, one thread each)
behind `hetero-infer router --tokenizer default`. Chats sharing a system prompt all go to one worker, which
serves the prompt from its prefix cache (its own hit counter), exactly as much as the router predicted."""

from __future__ import annotations

import openai
import pytest
from router_proc import Proc, samples, start_router, wait_index_synced

pytestmark = pytest.mark.slow  # two real models load and prefill on one thread each

SYSTEM = "You are a helpful assistant for a hardware store. Answer briefly and politely, in one sentence. " * 10


def hits(url: str) -> float:
    return sum(samples(url, "hetero_infer_prefix_cache_hits_total").values())


def test_a_shared_system_prompt_hits_one_real_workers_cache(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    workers: list[Proc] = []
    try:
        for _ in range(2):
            workers.append(Proc("serve", "--port", "0", "--executor", "torch", "--max-model-len", "512",
                                "--no-engine-process", "--log-format", "json", "--no-access-log",
                                start_timeout=300))
        for w in workers:
            w.wait_ready(300)
        router = start_router(workers, "--tokenizer", "default", "--policy", "prefix")
        try:
            c = openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0, timeout=300)
            model = c.models.list().data[0].id
            urls = [w.url for w in workers]
            before = [hits(u) for u in urls]
            for q in ("Do you sell hammers?", "Where are the nails?", "Are you open on Sunday?", "Do you cut keys?"):
                c.chat.completions.create(model=model, max_tokens=2, temperature=0,
                                          messages=[{"role": "system", "content": SYSTEM},
                                                    {"role": "user", "content": q}])
                wait_index_synced(router.url, urls)
            gained = [hits(u) - b for u, b in zip(urls, before)]
            matched = samples(router.url, "hetero_infer_router_prefix_matched_tokens_total")
            assert sorted(g > 0 for g in gained) == [False, True], gained  # one worker holds the prompt
            assert max(gained) >= 3 * 16 * 8  # the three later chats each hit at least 8 blocks of it
            assert [matched.get(u, 0.0) for u in urls] == gained  # the router predicted exactly those hits
        finally:
            router.stop()
    finally:
        for w in workers:
            w.stop()
