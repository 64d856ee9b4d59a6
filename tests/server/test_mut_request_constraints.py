"""Request -> SamplingParams cases that mutation testing (docs/testing.md, round 5) found unchecked by the
mapping tests: a rejected constraint is reported under the field the client sent, any other error keeps its
own field, and logit_bias ids at the vocabulary's edge are refused naming the first bad id.

A grammar is parsed when it is compiled, off the engine's loop (`structured.prepare_grammar`, issue 24): the
rejected-constraint cases go through it, with the engine's own compile cache (`GrammarCache`) behind it."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from hetero_infer.contracts.protocol import ChatCompletionRequest, CompletionRequest
from hetero_infer.worker.core.request_check import EngineLimits
from hetero_infer.worker.server.errors import APIError
from hetero_infer.worker.server.prompts import Prompt, request_sampling_params

VOCAB = 1000
MAX_MODEL_LEN = 64


def _state() -> Any:
    return SimpleNamespace(limits=EngineLimits("m", MAX_MODEL_LEN, VOCAB, 1 << 20, 16, ()), max_num_seqs=64)


def _chat(**fields: Any) -> Any:
    return ChatCompletionRequest.model_validate_json(
        json.dumps({"messages": [{"role": "user", "content": "x"}], **fields}))


def _completion(**fields: Any) -> Any:
    return CompletionRequest.model_validate_json(json.dumps({"prompt": "x", **fields}))


def _param_of(req: Any, prompt_len: int = 4) -> str | None:
    with pytest.raises(APIError) as e:
        request_sampling_params(_state(), req, Prompt(None, [1] * prompt_len))
    assert e.value.status == 400
    return e.value.param


@pytest.mark.parametrize(("fields", "param"), [
    ({"guided_regex": "(unclosed"}, "guided_regex"),
    ({"structured_outputs": {"regex": "(unclosed"}}, "structured_outputs"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
     "response_format"),
])
async def test_a_rejected_constraint_names_the_field_the_client_sent(fields: dict, param: str) -> None:
    import asyncio

    import xgrammar

    from hetero_infer.worker.server.structured import prepare_grammar
    from hetero_infer.worker.structured.compiler import GrammarCache

    req = _chat(**fields)
    params = request_sampling_params(_state(), req, Prompt(None, [1] * 4))  # its shape is fine
    cache = GrammarCache(lambda: xgrammar.TokenizerInfo([f"t{i}" for i in range(VOCAB)]), threads=1)
    engine = SimpleNamespace(prepare_grammar=lambda spec, deadline: asyncio.wrap_future(cache.prepare(spec, deadline)))
    state = SimpleNamespace(engine=engine, options=SimpleNamespace(grammar_compile_timeout=30.0))
    with pytest.raises(APIError) as e:
        await prepare_grammar(state, req, params)
    assert e.value.status == 400 and e.value.param == param


def test_another_error_beside_a_constraint_keeps_its_own_field() -> None:
    req = _completion(guided_regex="a+")
    assert _param_of(req, prompt_len=MAX_MODEL_LEN) == "prompt"  # the prompt fills the context


def test_logit_bias_ids_at_the_vocabulary_edge() -> None:
    ok = request_sampling_params(_state(), _completion(logit_bias={str(VOCAB - 1): 5}), Prompt(None, [1]))
    assert ok.logit_bias == {VOCAB - 1: 5}
    with pytest.raises(APIError) as e:
        request_sampling_params(_state(), _completion(logit_bias={str(VOCAB): 5}), Prompt(None, [1]))
    assert e.value.param == "logit_bias" and str(VOCAB) in e.value.message


def test_logit_bias_names_the_first_bad_id() -> None:
    with pytest.raises(APIError) as e:
        request_sampling_params(_state(), _completion(logit_bias={"3": 1, "4001": 1, "5002": 1}), Prompt(None, [1]))
    assert "4001" in e.value.message and "5002" not in e.value.message
