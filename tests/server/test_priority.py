"""A request's `priority` through HTTP to `--scheduling-policy priority` (vLLM's field and meaning: lower runs
first): one mock worker at --max-num-seqs 4 flooded by low-priority streams still starts a high-priority request
about as soon as when it is idle (TTFT at most 2x), where first-come-first-served would keep it behind the whole
flood (each flood stream runs 400 steps).

The mock's cost model makes the high request's prompt cost its prefill (1 ms a token, 10 ms a step): with a
fixed cost per step instead, a flooded worker's TTFT is about 2.5 steps against 1 idle whatever the policy, since
with the overlap (async scheduling) a request arriving mid-step waits for that step and the one already launched
(measured: 149 ms against 58 ms at 50 ms a step)."""

from __future__ import annotations

import statistics
import threading
import time

import openai
import pytest
from server_proc import ServerProcess, http, metric

FLOOD = 10
PROMPT = "hello there " * 75  # about 150 tokens: a 150 ms prefill


@pytest.fixture(scope="module")
def worker():
    s = ServerProcess("--max-num-seqs", "4", "--scheduling-policy", "priority", "--mock-step-latency-s", "0.01",
                      "--mock-token-latency-s", "0.001", "--max-model-len", "1024", "--no-access-log")
    yield s
    s.stop()


def ttft(client: openai.OpenAI, priority: int, i: int) -> float:
    start = time.monotonic()
    # a prompt of its own each time: a prefix-cache hit would skip the prefill it is timed with
    stream = client.completions.create(model="mock", prompt=f"{i} " + PROMPT, max_tokens=2, stream=True,
                                       extra_body={"priority": priority, "ignore_eos": True})
    first = None
    for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].text is not None:
            first = time.monotonic() - start
    assert first is not None
    return first


def test_a_high_priority_request_starts_at_once_on_a_worker_flooded_with_low_priority_streams(worker):
    client = openai.OpenAI(base_url=worker.base_url, api_key="unused", max_retries=0, timeout=120)
    ttft(client, 0, 0)  # warm-up: connections, first compiled paths
    idle = statistics.median(ttft(client, 0, i) for i in range(1, 6))
    stop = threading.Event()
    errors: list[BaseException] = []

    def low() -> None:
        try:
            stream = client.completions.create(model="mock", prompt="flood", max_tokens=400, stream=True,
                                               extra_body={"priority": 10, "ignore_eos": True})
            for _ in stream:
                if stop.is_set():
                    stream.close()
                    return
        except BaseException as exc:  # recorded for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=low, daemon=True) for _ in range(FLOOD)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 60
        while True:  # the batch full of low-priority streams, the rest queued
            m = worker.metrics()
            if (metric(m, "hetero_infer_num_requests_running") == 4
                    and metric(m, "hetero_infer_num_requests_waiting") == FLOOD - 4):
                break
            assert time.monotonic() < deadline, m
            time.sleep(0.05)
        busy = [ttft(client, 0, i) for i in range(6, 11)]
        m = worker.metrics()
        # still flooded after the high ones (a preempted stream may be between two steps)
        assert metric(m, "hetero_infer_num_requests_running") + metric(m, "hetero_infer_num_requests_waiting") == FLOOD
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not errors, errors
    print(f"TTFT idle {idle * 1000:.0f} ms, flooded {statistics.median(busy) * 1000:.0f} ms (median of 5)")
    assert statistics.median(busy) <= 2 * idle, (busy, idle)
    # they took low streams' places (fcfs preempts none): not always all five, since a high request that arrives just
    # as the previous one has ended, before a waiting low stream is admitted again, finds its slot free (CI: 4 of 5)
    assert metric(worker.metrics(), "hetero_infer_num_preemptions_total") >= 1


def test_priority_is_validated_and_optional():
    # Bad values are a 400 at the server; the field is vLLM's, an int.
    s = ServerProcess("--max-num-seqs", "2", "--no-access-log")
    try:
        r = http("POST", s.base_url + "/completions", {"model": "mock", "prompt": "x", "max_tokens": 1,
                                                       "priority": "high"})
        assert r.status == 400, r.text
        r = http("POST", s.base_url + "/completions", {"model": "mock", "prompt": "x", "max_tokens": 1,
                                                       "priority": -3})
        assert r.status == 200, r.text  # accepted (and ignored) under fcfs
    finally:
        s.stop()
