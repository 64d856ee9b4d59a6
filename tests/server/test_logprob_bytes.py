"""Defect 3: logprobs of tokens that hold part of a character (byte-level BPE) carry their own bytes, not
U+FFFD's, and completions' `text_offset` points into the choice's text. The formatters run on the default
model's real tokenizer, without a server."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from transformers.convert_slow_tokenizer import bytes_to_unicode

from hetero_infer.contracts.protocol import ChatCompletionRequest, CompletionRequest
from hetero_infer.contracts.tokenizer import Tokenizer
from hetero_infer.worker.core.outputs import CompletionOutput, RequestDelta, RequestOutput, SampleDelta
from hetero_infer.worker.runner.loader import resolve_model
from hetero_infer.worker.server.chat import ChatFormatter
from hetero_infer.worker.server.completions import CompletionFormatter
from hetero_infer.worker.server.prompts import Prompt

TEXT = "héllo 日本 🙂 ok"  # 2-, 3- and 4-byte characters; the tokenizer splits some of them over tokens


@pytest.fixture(scope="module")
def state() -> Any:
    tok = Tokenizer.from_pretrained(resolve_model(None)[0])
    return SimpleNamespace(model_name="m", tokenizer=tok, token_text=lambda i: tok.decode([i]))


def _output(state: Any) -> CompletionOutput:
    ids = state.tokenizer.encode(TEXT, add_special_tokens=False)
    entries = [{t: -0.5, 0: -1.5} for t in ids]
    return CompletionOutput(0, state.tokenizer.decode(ids), ids, logprobs=entries, finish_reason="length")


def _chars_before(token_bytes: list[bytes], i: int) -> int:
    """Characters completed by the tokens before i (a partial character at the end does not count)."""
    return len(b"".join(token_bytes[:i]).decode("utf-8", errors="ignore"))


def test_the_text_splits_characters(state: Any) -> None:
    out = _output(state)
    assert out.text == TEXT
    assert sum("\ufffd" in state.token_text(t) for t in out.token_ids) >= 2  # what the test is about


def test_chat_logprobs_bytes_are_each_tokens_own(state: Any) -> None:
    out = _output(state)
    req = ChatCompletionRequest.model_validate_json(json.dumps(
        {"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 2}))
    fmt = ChatFormatter(state, req, [Prompt(None, [1])])
    fmt.bind(["r"])
    content = fmt.response([RequestOutput("r", None, [1], [out])])["choices"][0]["logprobs"]["content"]
    assert b"".join(bytes(e["bytes"]) for e in content).decode() == TEXT
    assert all(e["bytes"] != list("\ufffd".encode()) for e in content)
    hf = state.tokenizer.hf  # each top entry: its own bytes too (the sampled token is one of them)
    for e, tid in zip(content, out.token_ids, strict=True):
        assert [t["bytes"] for t in e["top_logprobs"] if t["logprob"] == -0.5] == [e["bytes"]]
        assert bytes(e["bytes"]).decode("utf-8", errors="ignore") == hf.decode([tid]).replace("\ufffd", "")


def test_completions_text_offset_follows_the_text(state: Any) -> None:
    out = _output(state)
    # the reference bytes: each token's piece through transformers' own GPT-2 byte map
    inverse = {c: b for b, c in bytes_to_unicode().items()}
    tb = [bytes(inverse[c] for c in p) for p in state.tokenizer.hf.convert_ids_to_tokens(out.token_ids)]
    assert b"".join(tb).decode() == TEXT
    req = CompletionRequest.model_validate_json(json.dumps({"prompt": "Say:", "logprobs": 1}))
    fmt = CompletionFormatter(state, req, [Prompt("Say:", [1])])
    fmt.bind(["r"])
    choice = fmt.response([RequestOutput("r", None, [1], [out])])["choices"][0]
    assert choice["logprobs"]["text_offset"] == [_chars_before(tb, i) for i in range(len(tb))]
    assert choice["text"] == TEXT


def test_streamed_text_offset_carries_partial_characters_across_chunks(state: Any) -> None:
    """One token per chunk: the offsets continue across chunks as in the whole response."""
    out = _output(state)
    req = CompletionRequest.model_validate_json(json.dumps({"prompt": "x", "logprobs": 0, "stream": True}))
    whole = CompletionFormatter(state, req, [Prompt("x", [1])])
    whole.bind(["r"])
    expected = whole.response([RequestOutput("r", None, [1], [out])])["choices"][0]["logprobs"]["text_offset"]
    fmt = CompletionFormatter(state, req, [Prompt("x", [1])])
    fmt.bind(["r"])
    offsets = []
    for tid, entry in zip(out.token_ids, out.logprobs or [], strict=True):
        delta = RequestDelta("r", [SampleDelta([tid], "", [entry], None, None, None)], False, None, [])
        (chunk,) = fmt.chunks([delta])
        offsets += json.loads(chunk)["choices"][0]["logprobs"]["text_offset"]
    assert offsets == expected and len(set(offsets)) < len(offsets)  # split characters share an offset
