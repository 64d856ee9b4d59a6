"""API keys (flag, file, env; 401 in OpenAI shape; never logged) and structured access logs."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from server_proc import ServerProcess, http

FILE_KEY = "sk-file-key-0123456789"
ENV_KEY = "sk-env-key-9876543210"
SERVED = "acme/smol-test"  # a served name with a slash, as Hugging Face ids have


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    key_file: Path = tmp_path_factory.mktemp("keys") / "keys.txt"
    key_file.write_text(f"# one key per line\n{FILE_KEY}\n")
    s = ServerProcess("--api-key-file", str(key_file), "--served-model-name", SERVED,
                      env={"HETERO_INFER_API_KEY": ENV_KEY})
    yield s
    assert s.stop() == 0


def test_keys_are_required_on_v1(keyed: ServerProcess) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {FILE_KEY}"},
                    {"Authorization": f"Bearer {FILE_KEY}x"}):
        r = http("POST", keyed.url + "/v1/completions", {"prompt": "x", "max_tokens": 1}, headers)
        assert r.status == 401
        err = r.json()["error"]
        assert err["code"] == "invalid_api_key" and err["type"] == "invalid_request_error"
        assert http("GET", keyed.url + "/v1/models", headers=headers).status == 401
    # Probes and metrics stay open.
    for path in ("/healthz", "/readyz", "/metrics", "/openapi.json"):
        assert http("GET", keyed.url + path).status == 200
    assert http("GET", keyed.url + "/openapi.json").json()["components"]["securitySchemes"]


@pytest.mark.parametrize("key", [FILE_KEY, ENV_KEY])
def test_valid_keys_work_with_the_openai_client(keyed: ServerProcess, key: str) -> None:
    client = openai.OpenAI(base_url=keyed.base_url, api_key=key, max_retries=0)
    assert [m.id for m in client.models.list().data] == [SERVED]
    assert client.models.retrieve(SERVED).id == SERVED
    assert client.completions.create(model=SERVED, prompt="hi", max_tokens=2).model == SERVED
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=keyed.base_url, api_key="nope", max_retries=0).models.list()


def test_keys_never_logged_and_access_log_is_structured(keyed: ServerProcess) -> None:
    http("GET", keyed.url + "/v1/models?api_key=" + FILE_KEY, headers={"Authorization": f"Bearer {FILE_KEY}",
                                                                      "X-Request-Id": "auth-log-1"})
    http("GET", keyed.url + "/v1/models", headers={"Authorization": "Bearer " + ENV_KEY + "-typo"})
    deadline = time.monotonic() + 10  # records are written by a background thread, in batches
    while time.monotonic() < deadline:
        access = [r for r in keyed.records() if r.get("logger") == "hetero_infer.access"]
        if any(r.get("request_id") == "auth-log-1" for r in access) and any(r["status"] == 401 for r in access):
            break
        time.sleep(0.02)
    log = keyed.log()
    assert FILE_KEY not in log and ENV_KEY not in log
    access = [r for r in keyed.records() if r.get("logger") == "hetero_infer.access"]
    assert access
    mine = [r for r in access if r.get("request_id") == "auth-log-1"]
    assert len(mine) == 1
    rec = mine[0]
    assert rec["method"] == "GET" and rec["path"] == "/v1/models" and rec["status"] == 200
    assert isinstance(rec["duration_ms"], float) and rec["level"] == "info" and "ts" in rec
    assert any(r["status"] == 401 for r in access)


def test_probes_are_logged_when_their_answer_changes(keyed: ServerProcess) -> None:
    """Kubelets and load balancers poll /healthz and /readyz every second: one access line per change of answer
    (503 loading -> 200 ready), not one per poll; other requests get theirs every time."""
    for _ in range(5):
        assert http("GET", keyed.url + "/healthz").status == 200
        assert http("GET", keyed.url + "/readyz").status == 200
        assert http("GET", keyed.url + "/openapi.json", headers={"X-Request-Id": "probe-log-mark"}).status == 200
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        access = [r for r in keyed.records() if r.get("logger") == "hetero_infer.access"]
        if sum(r.get("request_id") == "probe-log-mark" for r in access) == 5:
            break
        time.sleep(0.02)
    assert sum(r.get("request_id") == "probe-log-mark" for r in access) == 5
    for path in ("/healthz", "/readyz"):
        statuses = [r["status"] for r in access if r["path"] == path]
        assert statuses.count(200) == 1 and all(a != b for a, b in zip(statuses, statuses[1:])), (path, statuses)
