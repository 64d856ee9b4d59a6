"""Bad input over raw HTTP: OpenAI-shaped 4xx errors, nothing reaches the engine, no server state changes."""

from __future__ import annotations

import json

import pytest
from server_proc import ServerProcess, http

CHAT = "/v1/chat/completions"
COMPL = "/v1/completions"
USER = [{"role": "user", "content": "hi"}]

# (path, raw body, status, param the error must name (None: any))
CASES: list[tuple[str, str, int, str | None]] = [
    (COMPL, "{bad json", 400, None),
    (COMPL, "", 400, None),
    (COMPL, "[1, 2]", 400, None),
    (COMPL, '"just a string"', 400, None),
    (COMPL, "{}", 400, "prompt"),
    (COMPL, '{"prompt": 12}', 400, "prompt"),
    (COMPL, '{"prompt": true}', 400, "prompt"),
    (COMPL, '{"prompt": []}', 400, "prompt"),
    (COMPL, '{"prompt": [[]]}', 400, "prompt.0"),
    (COMPL, '{"prompt": [1, -5]}', 400, "prompt.1"),
    (COMPL, '{"prompt": [99999999]}', 400, None),
    (COMPL, '{"prompt": ""}', 400, "prompt"),
    (COMPL, '{"prompt": "x", "max_tokens": "5"}', 400, "max_tokens"),
    (COMPL, '{"prompt": "x", "max_tokens": 0}', 400, "max_tokens"),
    (COMPL, '{"prompt": "x", "max_tokens": -3}', 400, "max_tokens"),
    (COMPL, '{"prompt": "x", "max_tokens": 2.5}', 400, "max_tokens"),
    (COMPL, '{"prompt": "x", "temperature": "hot"}', 400, "temperature"),
    (COMPL, '{"prompt": "x", "temperature": 2.5}', 400, "temperature"),
    (COMPL, '{"prompt": "x", "temperature": NaN}', 400, "temperature"),
    (COMPL, '{"prompt": "x", "top_p": 0}', 400, "top_p"),
    (COMPL, '{"prompt": "x", "top_k": -2}', 400, "top_k"),
    (COMPL, '{"prompt": "x", "min_p": 1.5}', 400, "min_p"),
    (COMPL, '{"prompt": "x", "n": 0}', 400, "n"),
    (COMPL, '{"prompt": "x", "n": 1.5}', 400, "n"),
    (COMPL, '{"prompt": "x", "n": 100000}', 400, "n"),
    (COMPL, '{"prompt": "x", "logprobs": 21}', 400, "logprobs"),
    (COMPL, '{"prompt": "x", "presence_penalty": 3}', 400, "presence_penalty"),
    (COMPL, '{"prompt": "x", "frequency_penalty": -2.5}', 400, "frequency_penalty"),
    (COMPL, '{"prompt": "x", "repetition_penalty": 0}', 400, "repetition_penalty"),
    (COMPL, '{"prompt": "x", "seed": 1e30}', 400, "seed"),
    (COMPL, '{"prompt": "x", "seed": 100000000000000000000000}', 400, "seed"),
    (COMPL, '{"prompt": "x", "stream": "yes"}', 400, "stream"),
    (COMPL, '{"prompt": "x", "stream_options": {"include_usage": true}}', 400, "stream_options"),
    (COMPL, '{"prompt": "x", "stop": [1, 2]}', 400, "stop"),
    (COMPL, '{"prompt": "x", "stop": ["a","b","c","d","e","f","g","h","i","j","k","l","m","n","o","p","q"]}', 400,
     "stop"),
    (COMPL, '{"prompt": "x", "logit_bias": {"50": 10}}', 400, "logit_bias"),
    (COMPL, '{"prompt": "x", "best_of": 3}', 400, "best_of"),
    (COMPL, '{"prompt": "x", "suffix": "tail"}', 400, "suffix"),
    (COMPL, '{"prompt": "x", "echo": true, "logprobs": 1}', 400, "echo"),
    (COMPL, '{"prompt": "x", "min_tokens": 9, "max_tokens": 3}', 400, "min_tokens"),
    (COMPL, '{"prompt": "x", "max_tokens": 100000}', 400, "max_tokens"),
    (CHAT, "{}", 400, "messages"),
    (CHAT, '{"messages": []}', 400, "messages"),
    (CHAT, '{"messages": "hello"}', 400, "messages"),
    (CHAT, '{"messages": [{"content": "no role"}]}', 400, "messages.0.role"),
    (CHAT, '{"messages": [{"role": "robot", "content": "x"}]}', 400, "messages.0.role"),
    (CHAT, '{"messages": [{"role": "user", "content": 5}]}', 400, "messages.0.content"),
    (CHAT, '{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}', 400,
     "messages.0.content"),
    (CHAT, json.dumps({"messages": USER, "top_logprobs": 2}), 400, "top_logprobs"),
    (CHAT, json.dumps({"messages": USER, "logprobs": True, "top_logprobs": 30}), 400, "top_logprobs"),
    (CHAT, json.dumps({"messages": USER, "logprobs": 1}), 400, "logprobs"),
    (CHAT, json.dumps({"messages": USER, "tools": [{"type": "function", "function": {"name": "f"}}]}), 400, "tools"),
    (CHAT, json.dumps({"messages": USER, "response_format": {"type": "json_object"}}), 400, "response_format.type"),
    (CHAT, json.dumps({"messages": USER, "max_completion_tokens": 0}), 400, "max_completion_tokens"),
    (CHAT, json.dumps({"messages": USER, "max_completion_tokens": 10**6}), 400, "max_completion_tokens"),
    (CHAT, json.dumps({"messages": USER, "model": "gpt-4"}), 404, "model"),
    (COMPL, json.dumps({"prompt": "x", "model": "gpt-4"}), 404, "model"),
]


def _assert_openai_error(r, status: int, param: str | None = None) -> dict:
    assert r.status == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert set(body) == {"error"}
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    assert isinstance(err["type"], str)
    if param is not None:  # the field, or a position inside it
        assert err["param"] == param or err["param"].startswith(param + "."), err
    return err


@pytest.fixture(scope="module")
def engine_counters(server: ServerProcess):
    """Engine-side counters before the module's bad requests, checked again after them."""
    before = server.metrics()
    yield before
    after = server.metrics()
    for name in ("hetero_infer_prompt_tokens_total", "hetero_infer_request_prompt_tokens_count",
                 "hetero_infer_generation_tokens_total"):
        assert after.get(name, 0.0) == before.get(name, 0.0), name
    assert after["hetero_infer_num_requests_running"] == 0
    assert after["hetero_infer_num_requests_waiting"] == 0
    assert after["hetero_infer_kv_cache_usage_ratio"] == 0


@pytest.mark.parametrize(("path", "body", "status", "param"), CASES, ids=[f"{i}" for i in range(len(CASES))])
def test_bad_request(server: ServerProcess, engine_counters, path: str, body: str, status: int,
                     param: str | None) -> None:
    r = http("POST", server.url + path, body, {"Content-Type": "application/json"})
    _assert_openai_error(r, status, param)


def test_prompt_longer_than_context(server: ServerProcess, engine_counters) -> None:
    r = http("POST", server.url + COMPL, {"prompt": "hello " * 2000, "max_tokens": 4})
    err = _assert_openai_error(r, 400, "prompt")
    assert err["code"] == "context_length_exceeded"
    assert "512" in err["message"]  # the context length
    assert any(w.isdigit() and int(w) > 512 for w in err["message"].split())  # the prompt's token count
    r = http("POST", server.url + CHAT, {"messages": [{"role": "user", "content": "hello " * 2000}]})
    assert _assert_openai_error(r, 400, "messages")["code"] == "context_length_exceeded"


def test_prompt_plus_max_tokens_too_long(server: ServerProcess, engine_counters) -> None:
    r = http("POST", server.url + COMPL, {"prompt": "hello " * 30, "max_tokens": 500})
    err = _assert_openai_error(r, 400, "max_tokens")
    assert "512" in err["message"] and "500" in err["message"]


def test_oversized_body(server: ServerProcess, engine_counters) -> None:
    body = json.dumps({"prompt": "x" * (5 * 1024 * 1024)})
    r = http("POST", server.url + COMPL, body)
    assert _assert_openai_error(r, 413)["code"] == "request_too_large"


def test_unknown_route_and_method(server: ServerProcess, engine_counters) -> None:
    assert _assert_openai_error(http("GET", server.url + "/v1/nothing"), 404)["code"] == "not_found"
    r = http("GET", server.url + COMPL)
    assert _assert_openai_error(r, 405)["code"] == "method_not_allowed"
    assert "POST" in r.headers.get("allow", "")


def test_bad_request_ids_are_echoed_or_replaced(server: ServerProcess) -> None:
    r = http("POST", server.url + COMPL, "{}", {"X-Request-Id": "trace-123"})
    assert r.headers["x-request-id"] == "trace-123"
    r = http("POST", server.url + COMPL, "{}", {"X-Request-Id": "bad id with spaces"})
    assert r.headers["x-request-id"] != "bad id with spaces" and len(r.headers["x-request-id"]) == 32
