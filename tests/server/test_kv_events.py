"""KV events as vLLM publishes them (`--kv-events-config`): a ZMQ subscriber, as llm-d's precise prefix-cache
producer is, decodes every batch of a real worker (mock executor, a small pool and a host tier, so blocks are
stored, evicted, saved and restored) and rebuilds its block set, which must equal the worker's own block report
(GET /v1/cache/blocks, both tiers) at the end of a load; `seq` has no gap; the host tier's blocks are the "CPU"
medium; the report advertises the endpoint and the batches its state holds."""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import zmq
from server_proc import ServerProcess, http

from hetero_infer.contracts import kv_events


@pytest.mark.parametrize("engine", ["--engine-process", "--no-engine-process"])
def test_a_subscriber_rebuilds_the_workers_blocks(engine: str) -> None:
    config = json.dumps({"enable_kv_cache_events": True, "endpoint": "tcp://127.0.0.1:*", "topic": "kv"})
    server = ServerProcess(engine, "--max-num-blocks", "48", "--block-size", "4", "--kv-offloading-size", "0.01",
                           "--kv-events-config", config)
    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    try:
        endpoint = next(m.group(1) for line in server.lines
                        if (m := re.search(r"KV events: publishing on (\S+)", line)))
        sub.setsockopt(zmq.SUBSCRIBE, b"kv")
        sub.connect(endpoint)
        time.sleep(0.5)  # PUB/SUB: batches sent before the subscription reaches the publisher are not delivered

        prefixes = [" ".join(f"w{p}x{i}" for i in range(12)) for p in range(6)]

        def ask(i: int) -> None:
            body = {"model": "mock", "prompt": prefixes[i % 6] + f" q{i}", "max_tokens": 6}
            r = http("POST", server.base_url + "/completions", body, timeout=60)
            assert r.status == 200, r.text

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(ask, range(36)))

        blocks: dict[str, set[int]] = {}
        seqs = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if not sub.poll(500):
                break
            topic, seq, payload = sub.recv_multipart()
            assert topic == b"kv"
            seqs.append(int.from_bytes(seq, "big"))
            kv_events.apply(blocks, kv_events.decode_batch(payload))
        assert seqs and seqs == list(range(seqs[0], seqs[0] + len(seqs))), "a gap in seq: a batch was lost"
        report = http("GET", server.url + "/v1/cache/blocks").json()
        assert blocks[kv_events.DEVICE_MEDIUM] == set(report["added"])
        assert blocks.get(kv_events.HOST_MEDIUM), "the load evicted blocks into the host tier"
        assert blocks[kv_events.HOST_MEDIUM] == set(report["host_added"])
        # the report advertises the events, and how far its state goes: every batch published
        assert report["kv_events"] == {"endpoint": endpoint, "topic": "kv", "seq": seqs[-1] + 1}
        metrics = server.metrics()
        assert metrics["hetero_infer_host_kv_bytes_saved_total"] > 0
        assert metrics["vllm:external_prefix_cache_hits_total"] == metrics["hetero_infer_host_prefix_cache_hits_total"]
    finally:
        sub.close(0)
        context.term()
        assert server.stop() == 0, server.log()


def test_a_bad_events_config_is_a_clear_error() -> None:
    from hetero_infer.contracts.engine_options import EngineConfig
    from hetero_infer.contracts.options import InvalidOption

    with pytest.raises(InvalidOption, match="kv_events_config"):
        EngineConfig(kv_events_config='{"enable_kv_cache_events": true, "publisher": "kafka"}')
    with pytest.raises(InvalidOption, match="kv_events_config"):
        EngineConfig(kv_events_config='{"enable_kv_events": true}')
    assert EngineConfig(kv_events_config='{"enable_kv_cache_events": true}').kv_events_config
