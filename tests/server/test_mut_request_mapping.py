"""Request -> SamplingParams edge cases that mutation testing found unchecked (docs/testing.md).

The context's last position and the name of the offending field: a prompt one token short of the
context still gets its one token, a prompt that fills it is refused naming the endpoint's prompt field
(or the batch position the completions endpoint passes), never another field.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from hetero_infer.contracts.protocol import ChatCompletionRequest, CompletionRequest
from hetero_infer.worker.core.request_check import EngineLimits
from hetero_infer.worker.server.errors import APIError
from hetero_infer.worker.server.prompts import Prompt, request_sampling_params

MAX_MODEL_LEN = 64
ENDPOINTS = ["completions", "chat"]
PROMPT_FIELD = {"completions": "prompt", "chat": "messages"}


def _state() -> Any:
    return SimpleNamespace(limits=EngineLimits("m", MAX_MODEL_LEN, 1000, 1 << 20, 16, ()), max_num_seqs=64)


def _request(endpoint: str, **fields: Any) -> Any:
    if endpoint == "completions":
        return CompletionRequest.model_validate_json(json.dumps({"prompt": "x", **fields}))
    return ChatCompletionRequest.model_validate_json(
        json.dumps({"messages": [{"role": "user", "content": "x"}], **fields}))


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_a_prompt_one_short_of_the_context_gets_one_token(endpoint: str) -> None:
    prompt = Prompt(None, [1] * (MAX_MODEL_LEN - 1))
    assert request_sampling_params(_state(), _request(endpoint), prompt).max_tokens == 1


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_a_prompt_that_fills_the_context_is_refused_naming_the_prompt_field(endpoint: str) -> None:
    prompt = Prompt(None, [1] * MAX_MODEL_LEN)
    with pytest.raises(APIError) as e:
        request_sampling_params(_state(), _request(endpoint), prompt)
    assert e.value.status == 400 and e.value.param == PROMPT_FIELD[endpoint]


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_the_callers_prompt_name_wins(endpoint: str) -> None:
    prompt = Prompt(None, [1] * MAX_MODEL_LEN)
    with pytest.raises(APIError) as e:
        request_sampling_params(_state(), _request(endpoint), prompt, "prompt.3")
    assert e.value.param == "prompt.3"
