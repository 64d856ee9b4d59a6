"""Bad input over raw HTTP: OpenAI-shaped 4xx errors, nothing reaches the engine, no server state changes; and the
one request check itself (`check_request`): typed errors with their OpenAI fields, one context-length message,
called once."""

from __future__ import annotations

import json

import pytest
from server_proc import ServerProcess, http

from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.contracts.sampling_params import SamplingParams
from hetero_infer.worker.core.busy_loop import EngineRequest
from hetero_infer.worker.core.engine import LLMEngine
from hetero_infer.worker.core.request_check import EngineLimits, ParamNames, RequestError, check_request
from hetero_infer.worker.frontend.inproc import InprocEngineClient
from hetero_infer.worker.server.errors import from_request_error

CHAT = "/v1/chat/completions"
COMPL = "/v1/completions"
USER = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}

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
    (COMPL, '{"prompt": "x", "logit_bias": {"abc": 10}}', 400, "logit_bias"),
    (COMPL, '{"prompt": "x", "logit_bias": {"-5": 10}}', 400, "logit_bias"),
    (COMPL, '{"prompt": "x", "logit_bias": {"5": 101}}', 400, "logit_bias"),
    (COMPL, '{"prompt": "x", "logit_bias": {"5": -100.5}}', 400, "logit_bias"),
    (COMPL, '{"prompt": "x", "logit_bias": {"5": "1"}}', 400, "logit_bias"),
    (COMPL, '{"prompt": "x", "logit_bias": {"99999999": 1}}', 400, "logit_bias"),  # outside the vocabulary
    (COMPL, '{"prompt": "x", "logit_bias": [1]}', 400, "logit_bias"),
    (COMPL, '{"prompt": "x", "best_of": 1, "n": 2}', 400, "best_of"),
    (COMPL, '{"prompt": "x", "best_of": 2, "stream": true}', 400, "best_of"),
    (COMPL, '{"prompt": "x", "best_of": 129}', 400, "best_of"),
    (COMPL, '{"prompt": "x", "response_format": {"type": "json_schema"}}', 400, "response_format.json_schema"),
    (COMPL, '{"prompt": "x", "guided_json": {"type": "object"}, "guided_regex": "a+"}', 400, "guided_regex"),
    (COMPL, '{"prompt": "x", "guided_json": "{not json"}', 400, "guided_json"),
    (COMPL, '{"prompt": "x", "guided_json": "[1]"}', 400, "guided_json"),
    (COMPL, '{"prompt": "x", "guided_json": {"type": 5}}', 400, "guided_json"),
    (COMPL, '{"prompt": "x", "guided_choice": []}', 400, "guided_choice"),
    (COMPL, '{"prompt": "x", "guided_regex": 5}', 400, "guided_regex"),
    (COMPL, '{"prompt": "x", "structured_outputs": {"regex": "a", "choice": ["b"]}}', 400, "structured_outputs"),
    (COMPL, '{"prompt": "x", "structured_outputs": {"json": 5}}', 400, "structured_outputs"),
    (COMPL, '{"prompt": "x", "response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}}',
     400, "structured_outputs"),
    (COMPL, '{"prompt": "x", "suffix": "tail"}', 400, "suffix"),
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
    (CHAT, json.dumps({"messages": USER, "tools": [{"type": "function", "function": {"name": "bad name"}}]}), 400,
     "tools"),
    (CHAT, json.dumps({"messages": USER, "tools": [{"type": "function"}]}), 400, "tools"),
    (CHAT, json.dumps({"messages": USER, "tools": [{"type": "retrieval", "function": {"name": "f"}}]}), 400, "tools"),
    (CHAT, json.dumps({"messages": USER, "tools": [TOOL, TOOL]}), 400, "tools"),  # the same name twice
    (CHAT, json.dumps({"messages": USER, "tools": [TOOL], "tool_choice": "always"}), 400, "tool_choice"),
    (CHAT, json.dumps({"messages": USER, "tools": [TOOL],
                       "tool_choice": {"type": "function", "function": {"name": "other"}}}), 400, "tool_choice"),
    (CHAT, json.dumps({"messages": USER, "tool_choice": "required"}), 400, "tool_choice"),
    (CHAT, json.dumps({"messages": USER, "tools": [TOOL], "tool_choice": "required",
                       "response_format": {"type": "json_object"}}), 400, "tool_choice"),
    (CHAT, json.dumps({"messages": USER, "functions": [TOOL["function"]]}), 400, "functions"),
    (CHAT, json.dumps({"messages": USER, "function_call": "auto"}), 400, "function_call"),
    (CHAT, json.dumps({"messages": USER, "response_format": {"type": "xml"}}), 400, "response_format.type"),
    (CHAT, json.dumps({"messages": USER, "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
     400, "response_format.json_schema"),
    (CHAT, json.dumps({"messages": USER, "response_format": {"type": "json_schema",
                                                             "json_schema": {"name": "x", "schema": "{}"}}}),
     400, "response_format.json_schema.schema"),
    (CHAT, json.dumps({"messages": USER, "guided_choice": ["a"], "guided_grammar": "root ::= \"a\""}), 400,
     "guided_grammar"),
    (CHAT, json.dumps({"messages": USER, "logit_bias": {"1.5": 1}}), 400, "logit_bias"),
    (CHAT, json.dumps({"messages": [{"role": "assistant", "tool_calls": [{"type": "function", "function": {
        "name": "f"}}]}]}), 400, "messages.0.tool_calls.0.function.arguments"),
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


# ------------------------------------------------------------------ the one check, without a server

LIMITS = EngineLimits("m", 64, 1000, 8, 16, (2,))


@pytest.mark.parametrize(("ids", "params", "param", "code"), [
    ([5] * 64, SamplingParams(max_tokens=4), "messages", "context_length_exceeded"),
    ([5] * 60, SamplingParams(max_tokens=5), "max_completion_tokens", "context_length_exceeded"),
    ([], SamplingParams(), "messages", "invalid_value"),
    ([5, 1000], SamplingParams(), "messages", "invalid_value"),
    ([5], SamplingParams(top_p=0.0), "top_p", "invalid_value"),
    ([5], SamplingParams(max_tokens=4, min_tokens=5), "min_tokens", "invalid_value"),
    ([5], SamplingParams(n=3), "n", "invalid_value"),
])
def test_check_request_errors_carry_their_openai_fields(ids, params, param, code) -> None:
    names = ParamNames(prompt="messages", max_tokens="max_completion_tokens")
    with pytest.raises(RequestError) as info:
        check_request(ids, params, LIMITS, names=names, max_n=2)
    assert (info.value.status, info.value.type, info.value.param, info.value.code) == (
        400, "invalid_request_error", param, code)
    err = from_request_error(info.value)
    assert (err.status, err.param, err.code, err.message) == (400, param, code, str(info.value))


def test_one_context_length_message() -> None:
    messages = []
    for ids, max_tokens in (([5] * 64, 4), ([5] * 60, 5), ([5] * 60, None)):
        try:
            check_request(ids, SamplingParams(max_tokens=max_tokens), LIMITS)
        except RequestError as exc:
            messages.append(str(exc))
    assert messages == [
        "This model's maximum context length is 64 tokens. However, you requested 68 tokens (64 in the prompt, 4 for "
        "the completion). Please reduce the length of the prompt or the completion.",
        "This model's maximum context length is 64 tokens. However, you requested 65 tokens (60 in the prompt, 5 for "
        "the completion). Please reduce the length of the prompt or the completion.",
    ]  # with max_tokens None the rest of the context is resolved: no error
    assert check_request([5] * 60, SamplingParams(max_tokens=None), LIMITS) == 4


async def test_a_checked_request_is_not_checked_again_by_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """The frontend's check is the only one: an EngineRequest with its resolved max_tokens is added as is; one
    without is checked by the engine (and a refusal fails its stream with the typed error)."""
    from hetero_infer.worker.core import engine as engine_module

    engine = LLMEngine(EngineConfig(executor="mock", max_model_len=128, max_num_blocks=64))
    calls = []
    real = engine_module.check_request
    monkeypatch.setattr(engine_module, "check_request", lambda *a, **k: calls.append(a) or real(*a, **k))
    client = InprocEngineClient(engine)
    client.start()
    try:
        params = SamplingParams(max_tokens=3, ignore_eos=True)
        for request, expected_calls in ((EngineRequest("checked", None, [5, 6], params, 3), 0),
                                        (EngineRequest("unchecked", None, [5, 6], params), 1)):
            stream = client.submit([request])
            while outputs := await stream.next():
                last = outputs[-1]
            assert last.finished and len(last.outputs[0].token_ids) == 3 and len(calls) == expected_calls
        stream = client.submit([EngineRequest("refused", None, [5] * 200, params)])
        with pytest.raises(RequestError) as info:
            await stream.next()
        assert info.value.code == "context_length_exceeded" and info.value.param == "prompt"
    finally:
        client.shutdown()
