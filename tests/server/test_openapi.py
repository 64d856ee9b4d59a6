"""Real responses (plain, streamed, errors) validate against the schemas /openapi.json publishes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from server_proc import ServerProcess, http

MESSAGES = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def validate(server: ServerProcess):
    spec = http("GET", server.url + "/openapi.json").json()
    assert spec["openapi"].startswith("3.1")

    def check(component: str, instance: Any) -> None:
        schema = {"$ref": f"#/components/schemas/{component}", "components": spec["components"]}
        errors = list(Draft202012Validator(schema).iter_errors(instance))
        assert not errors, (component, [e.message for e in errors], instance)

    return check


def _events(server: ServerProcess, path: str, body: dict) -> list[Any]:
    r = http("POST", server.url + path, {**body, "stream": True})
    assert r.status == 200 and r.headers["content-type"].startswith("text/event-stream")
    data = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def test_completion_shapes(server: ServerProcess, validate) -> None:
    for body in ({"prompt": "a", "max_tokens": 3}, {"prompt": ["a", "b"], "max_tokens": 2, "n": 2, "echo": True},
                 {"prompt": "a", "max_tokens": 3, "logprobs": 2}):
        r = http("POST", server.url + "/v1/completions", body)
        assert r.status == 200
        validate("CompletionResponse", r.json())
        for event in _events(server, "/v1/completions", {**body, "stream_options": {"include_usage": True}}):
            validate("CompletionChunk", event)


def test_chat_shapes(server: ServerProcess, validate) -> None:
    for body in ({"messages": MESSAGES, "max_tokens": 3}, {"messages": MESSAGES, "max_tokens": 3, "n": 2},
                 {"messages": MESSAGES, "max_tokens": 3, "logprobs": True, "top_logprobs": 2}):
        r = http("POST", server.url + "/v1/chat/completions", body)
        assert r.status == 200
        validate("ChatCompletionResponse", r.json())
        for event in _events(server, "/v1/chat/completions", body):
            validate("ChatCompletionChunk", event)


def test_other_shapes(server: ServerProcess, validate, model_name: str) -> None:
    validate("ModelList", http("GET", server.url + "/v1/models").json())
    validate("ModelCard", http("GET", server.url + "/v1/models/" + model_name).json())
    validate("HealthStatus", http("GET", server.url + "/healthz").json())
    validate("HealthStatus", http("GET", server.url + "/readyz").json())
    for r in (http("POST", server.url + "/v1/completions", "{"), http("GET", server.url + "/v1/models/x"),
              http("GET", server.url + "/nowhere")):
        validate("ErrorResponse", r.json())
