"""End to end with real processes: three mock workers behind one `hetero-infer router`.

A shared system prompt lands on one worker (its prefix-cache hits show it); then a worker is killed while
requests stream and queue: every request that had not received a byte is answered by another worker, and the
ones sent after the kill never reach the dead one."""

from __future__ import annotations

import threading
import time

import openai
import pytest
from router_proc import samples, start_router, start_workers

pytestmark = pytest.mark.slow  # four processes start (about a minute on two loaded cores)

SYSTEM = "You are a careful assistant who answers in short sentences and never guesses. " * 12


@pytest.fixture(scope="module")
def cluster():
    workers = start_workers(3, "--mock-step-latency-s", "0.02", "--max-num-seqs", "2", "--max-queue-len", "64")
    try:
        router = start_router(workers, "--hold-timeout-s", "120")
    except BaseException:
        for w in workers:
            w.stop()
        raise
    yield router, workers
    router.stop()
    for w in workers:
        w.stop()


def client(router) -> openai.OpenAI:
    return openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def hits(workers) -> list[float]:
    return [sum(samples(w.url, "hetero_infer_prefix_cache_hits_total").values()) for w in workers]


def test_a_shared_prefix_is_served_from_one_workers_cache(cluster):
    router, workers = cluster
    c = client(router)
    model = c.models.list().data[0].id
    before = hits(workers)
    for user in range(5):
        c.completions.create(model=model, prompt=SYSTEM + f"Question {user}: why?", max_tokens=2)
    gained = [after - b for after, b in zip(hits(workers), before)]
    assert sum(1 for g in gained if g > 0) == 1, gained  # one worker served the prefix from cache
    assert max(gained) >= 4 * 128  # the later four requests each hit at least eight blocks of the prefix


class Stream(threading.Thread):
    def __init__(self, c: openai.OpenAI, model: str, i: int) -> None:
        super().__init__(daemon=True)
        self.c, self.model, self.i = c, model, i
        self.chunks = 0
        self.error: BaseException | None = None
        self.finished = False

    def run(self) -> None:
        try:
            stream = self.c.completions.create(model=self.model, prompt=SYSTEM + f"User {self.i} asks.",
                                               max_tokens=25, stream=True, extra_body={"ignore_eos": True})
            for _ in stream:
                self.chunks += 1
            self.finished = True
        except BaseException as exc:  # recorded for the assertions
            self.error = exc


def test_killing_a_worker_fails_no_request_that_had_not_started_streaming(cluster):
    router, workers = cluster
    c = client(router)
    model = c.models.list().data[0].id
    streams = [Stream(c, model, i) for i in range(18)]
    for s in streams:
        s.start()
    deadline = time.monotonic() + 120
    while sum(s.chunks > 0 for s in streams) < 3:  # some stream, the others queue (2 running per worker)
        assert time.monotonic() < deadline, "no stream started"
        time.sleep(0.01)
    in_flight = samples(router.url, "hetero_infer_router_requests_in_flight")
    victim = max(workers, key=lambda w: in_flight.get(w.url, 0))
    started_before_kill = {s.i for s in streams if s.chunks > 0}
    victim.kill()
    for s in streams:
        s.join(180)
        assert not s.is_alive(), "a request hung"
    failed = [s for s in streams if s.error is not None]
    for s in failed:
        assert s.chunks > 0 or s.i in started_before_kill, f"request {s.i} failed before streaming: {s.error!r}"
    assert all(s.finished for s in streams if s.error is None)
    # The kill caught requests queued on the victim, and those were retried elsewhere.
    retried = samples(router.url, "hetero_infer_router_retries_total")
    assert sum(v for k, v in retried.items() if k.endswith(victim.url) or victim.url in k) >= 1, retried
    def routed_to_victim() -> float:
        return sum(v for k, v in samples(router.url, "hetero_infer_router_requests_routed_total").items()
                   if victim.url in k)

    before = routed_to_victim()
    after = [Stream(c, model, 100 + i) for i in range(6)]
    for s in after:
        s.start()
    for s in after:
        s.join(180)
        assert s.finished and s.error is None, s.error
    assert routed_to_victim() == before  # the dead worker left the pool


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_scale_from_zero_a_held_request_is_answered_once_the_first_worker_is_ready():
    from router_proc import Proc

    port = free_port()
    router = Proc("router", "--port", "0", "--worker", f"http://127.0.0.1:{port}", "--health-interval-s", "0.2",
                  "--hold-timeout-s", "300")
    worker = None
    try:
        router.wait_ready()
        c = openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0, timeout=300)
        result: dict = {}

        def ask() -> None:
            try:
                result["text"] = c.completions.create(model="m", prompt="hello", max_tokens=3).choices[0].text
            except BaseException as exc:  # recorded for the assertion
                result["error"] = exc

        t = threading.Thread(target=ask, daemon=True)
        t.start()
        deadline = time.monotonic() + 60
        while samples(router.url, "hetero_infer_router_requests_held").get("", 0) < 1:
            assert time.monotonic() < deadline, "the request was not held"
            time.sleep(0.05)
        assert t.is_alive()
        worker = Proc("serve", "--port", str(port), "--executor", "mock", "--no-engine-process",
                      "--served-model-name", "m", "--log-format", "json")
        t.join(300)
        assert "error" not in result, result.get("error")
        assert isinstance(result["text"], str)
        assert samples(router.url, "hetero_infer_router_requests_held").get("", 0) == 0
    finally:
        router.stop()
        if worker is not None:
            worker.stop()
