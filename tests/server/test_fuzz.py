"""Schemathesis fuzzing of every operation in /openapi.json (valid and invalid data): no 5xx, no crash, and
responses that match the documented status codes, content types and schemas."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from server_proc import ServerProcess, http

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
EXAMPLES = {"POST": 40, "GET": 10}


@pytest.fixture(scope="module")
def fuzz_server() -> Iterator[ServerProcess]:
    # No step latency and a short context keep generated requests (any n, any max_tokens) quick.
    s = ServerProcess("--max-model-len", "64", "--max-num-seqs", "256")
    yield s
    assert s.stop() == 0, s.log()


@pytest.mark.parametrize("mode", [schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE])
def test_fuzz_every_operation(fuzz_server: ServerProcess, mode: schemathesis.GenerationMode) -> None:
    schema = schemathesis.openapi.from_url(fuzz_server.url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {f"{op.method.upper()} {op.path}" for op in operations} >= {
        "POST /v1/completions", "POST /v1/chat/completions", "GET /v1/models", "GET /v1/models/{model}",
        "GET /healthz", "GET /readyz", "GET /metrics"}
    session = requests.Session()
    tested = 0
    for op in operations:
        if mode == schemathesis.GenerationMode.NEGATIVE and op.method.upper() != "POST":
            continue  # nothing to make invalid: no body, at most a free-form string in the path

        @given(case=op.as_strategy(generation_mode=mode))
        @settings(max_examples=EXAMPLES[op.method.upper()], deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        def run(case: schemathesis.Case) -> None:
            case.call_and_validate(base_url=fuzz_server.url, session=session, checks=CHECKS, timeout=30)

        run()
        tested += 1
    assert tested >= 2
    # The server is still healthy and empty afterwards.
    assert http("GET", fuzz_server.url + "/readyz").status == 200
    m = fuzz_server.metrics()
    assert m["hetero_infer_num_requests_running"] == 0 and m["hetero_infer_kv_cache_usage_ratio"] == 0
    # (/readyz answered 503 while the model loaded: that one is expected.)
    time.sleep(0.3)  # access records are written in batches (at most every 50 ms)
    errors = [r for r in fuzz_server.records()
              if isinstance(r.get("status"), int) and r["status"] >= 500 and r.get("path") != "/readyz"]
    assert not errors, errors
