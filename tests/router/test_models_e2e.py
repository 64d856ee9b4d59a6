"""End to end with real processes: mock workers of three models behind one `hetero-infer router`. 500 requests
for the three models, mixed, are each answered by a worker of their model, and one of the two workers of a
model is killed midway: no request is lost (non-streamed answers: nothing has gone back before the kill, so
what the killed worker held is retried on the other)."""

from __future__ import annotations

import concurrent.futures
import json
import random
import threading

import openai
import pytest
from router_proc import get, samples, start_router, start_workers

pytestmark = pytest.mark.slow  # five processes start (about a minute on two loaded cores)

MODELS = ("alpha", "beta", "gamma")


@pytest.fixture(scope="module")
def cluster():
    names = ["alpha", "alpha", "beta", "gamma"]
    workers = start_workers(len(names), "--mock-step-latency-s", "0.005", "--max-num-seqs", "4",
                            extra={i: ["--served-model-name", n] for i, n in enumerate(names)})
    try:
        router = start_router(workers, "--hold-timeout-s", "120")
    except BaseException:
        for w in workers:
            w.stop()
        raise
    yield router, dict(zip((w.url for w in workers), names)), workers
    router.stop()
    for w in workers:
        w.stop()


def finished(url: str) -> float:
    return sum(samples(url, "hetero_infer_requests_finished_total").values())


def test_500_mixed_requests_each_answered_by_a_worker_of_its_model_with_one_killed_midway(cluster):
    router, model_of, workers = cluster
    assert sorted(c["id"] for c in json.loads(get(router.url + "/v1/models")[1])["data"]) == list(MODELS)
    status, body = get(router.url + "/v1/models/delta")
    assert status == 404 and json.loads(body)["error"]["code"] == "model_not_found"
    client = openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    rng = random.Random(43)
    asked = [rng.choice(MODELS) for _ in range(500)]
    done = 0
    lock = threading.Lock()
    victim = workers[0]  # one of alpha's two
    killed = threading.Event()

    def one(i: int) -> tuple[str, str]:
        nonlocal done
        answer = client.completions.create(model=asked[i], prompt=f"request {i} " * rng.randint(1, 30), max_tokens=8,
                                           extra_body={"ignore_eos": True})
        with lock:
            done += 1
            if done == 200:
                victim.kill()
                killed.set()
        return answer.model, answer.choices[0].text

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(500)))  # any lost request raises here
    assert killed.is_set()
    assert [m for m, _ in results] == asked  # each answered under its model's name: by a worker serving it
    # Each worker finished only requests of its model (the survivors' counters; the victim's died with it).
    per_model = {m: sum(finished(u) for u, n in model_of.items() if n == m and u != victim.url) for m in MODELS}
    assert per_model["beta"] == asked.count("beta") and per_model["gamma"] == asked.count("gamma")
    assert 0 < per_model["alpha"] <= asked.count("alpha")
    routed = samples(router.url, "hetero_infer_router_requests_routed_total")
    to_victim = sum(v for k, v in routed.items() if victim.url in k)
    assert 0 < to_victim < asked.count("alpha")  # it served alpha until it died, then its twin did
