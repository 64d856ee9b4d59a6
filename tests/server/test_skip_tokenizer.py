"""A worker started on a config.json alone (`--load-format dummy --skip-tokenizer-init`), over real HTTP: token
ids in, token ids out (empty text, as vLLM answers), the same tokens `LLM` generates on the same weights, and a
clear 400 for everything that needs a tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from server_proc import ServerProcess, http

SHAPE = Path(__file__).resolve().parents[2] / "benchmarks" / "shapes" / "tiny-qwen3"
ARGS = ("--model", str(SHAPE), "--load-format", "dummy", "--skip-tokenizer-init", "--dtype", "float32",
        "--max-model-len", "256", "--seed", "5")
PROMPT = [11, 12, 13, 14, 15]


@pytest.fixture(scope="module")
def server():
    s = ServerProcess(*ARGS, executor="torch")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def reference():
    from hetero_infer.contracts.sampling_params import SamplingParams
    from hetero_infer.worker.frontend.llm import LLM

    llm = LLM(str(SHAPE), load_format="dummy", skip_tokenizer_init=True, dtype="float32", max_model_len=256, seed=5)
    out = llm.generate(prompt_token_ids=PROMPT, sampling_params=SamplingParams(temperature=0.0, max_tokens=6,
                                                                                ignore_eos=True))
    return out[0].outputs[0].token_ids


def completion(server, **body):
    return http("POST", server.base_url + "/completions",
                {"model": "tiny-qwen3", "max_tokens": 6, "temperature": 0, "ignore_eos": True, **body})


def test_token_ids_in_token_ids_out(server, reference):
    r = completion(server, prompt=PROMPT)
    assert r.status == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["text"] == "" and choice["token_ids"] == reference and choice["finish_reason"] == "length"
    assert r.json()["usage"]["completion_tokens"] == 6

    batch = completion(server, prompt=[PROMPT, PROMPT[:3]])
    assert batch.status == 200 and [c["token_ids"] for c in batch.json()["choices"]][0] == reference


def test_streamed_token_ids_add_up_to_the_same(server, reference):
    r = completion(server, prompt=PROMPT, stream=True)
    assert r.status == 200
    events = [json.loads(line[len("data: "):]) for line in r.text.splitlines()
              if line.startswith("data: ") and line != "data: [DONE]"]
    ids = [t for e in events for c in e["choices"] for t in c["token_ids"]]
    assert ids == reference and all(c["text"] == "" for e in events for c in e["choices"])


@pytest.mark.parametrize("path, body, param", [
    ("/completions", {"prompt": "Hello"}, "prompt"),
    ("/chat/completions", {"messages": [{"role": "user", "content": "Hello"}]}, "messages"),
    ("/completions", {"prompt": PROMPT, "stop": ["x"]}, "stop"),
    ("/completions", {"prompt": PROMPT, "logprobs": 2}, "logprobs"),
    ("/completions", {"prompt": PROMPT, "echo": True}, "echo"),
    ("/completions", {"prompt": PROMPT, "prompt_logprobs": 1}, "prompt_logprobs"),
    ("/completions", {"prompt": PROMPT, "response_format": {"type": "json_object"}}, "response_format"),
])
def test_what_needs_a_tokenizer_is_a_clear_400(server, reference, path, body, param):
    r = http("POST", server.base_url + path, {"model": "tiny-qwen3", "max_tokens": 4, **body})
    assert r.status == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and "tokenizer" in error["message"]
    assert completion(server, prompt=PROMPT).json()["choices"][0]["token_ids"] == reference  # still serving


def test_tokenizer_endpoints_say_why(server):
    r = http("POST", server.url + "/tokenize", {"model": "tiny-qwen3", "prompt": "Hello"})
    assert r.status == 400 and "--skip-tokenizer-init" in r.json()["error"]["message"]
