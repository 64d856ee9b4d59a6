"""Model references, the files a model needs, redaction and progress lines: pure logic."""

from __future__ import annotations

import logging
import re
import time

import pytest

from hetero_infer.model_source import ModelRef, ModelSourceError, parse_model_ref, redact, select_model_files
from hetero_infer.progress import Progress, human_bytes, progress_line


@pytest.mark.parametrize(("text", "ref"), [
    ("hf://HuggingFaceTB/SmolLM2-135M-Instruct", ModelRef("hf", "HuggingFaceTB/SmolLM2-135M-Instruct")),
    ("hf://org/name@v1.0", ModelRef("hf", "org/name", revision="v1.0")),
    ("hf://gpt2", ModelRef("hf", "gpt2")),
    ("meta-llama/Llama-3.1-8B-Instruct", ModelRef("hf", "meta-llama/Llama-3.1-8B-Instruct")),
    ("s3://models/llama/8b/", ModelRef("s3", "models", prefix="llama/8b")),
    ("s3://models", ModelRef("s3", "models")),
    ("/no/such/folder", ModelRef("local", "/no/such/folder")),
    ("model.gguf", ModelRef("local", "model.gguf")),
])
def test_parse(text, ref):
    assert parse_model_ref(text) == ref


def test_names_and_urls():
    assert parse_model_ref("hf://org/name@abc").name == "org/name"
    assert str(parse_model_ref("hf://org/name@abc")) == "hf://org/name@abc"
    assert parse_model_ref("s3://bucket/a/b/").name == "b"
    assert str(parse_model_ref("s3://bucket/a/b/")) == "s3://bucket/a/b"
    assert parse_model_ref("s3://bucket").name == "bucket"
    assert parse_model_ref("/x/SmolLM2.Q4_1.gguf").name == "SmolLM2.Q4_1"


def test_existing_local_path_wins_over_a_hub_id(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert parse_model_ref("org/name").scheme == "hf"
    (tmp_path / "org" / "name").mkdir(parents=True)
    assert parse_model_ref("org/name") == ModelRef("local", "org/name")


@pytest.mark.parametrize(("text", "words"), [
    ("gs://bucket/model", "unsupported model URL scheme 'gs://'"),
    ("ollama://llama3", "unsupported model URL scheme 'ollama://'"),
    ("hf://", "malformed model URL"),
    ("hf://org/name@", "malformed model URL"),
    ("hf://org/na me", "malformed model URL"),
    ("s3://", "malformed model URL"),
    ("s3://UPPER/x", "malformed model URL"),
])
def test_bad_references_are_one_clear_line(text, words):
    with pytest.raises(ModelSourceError) as info:
        parse_model_ref(text)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_select_model_files():
    files = {
        "config.json": 1, "generation_config.json": 1, "tokenizer.json": 1, "tokenizer_config.json": 1,
        "special_tokens_map.json": 1, "tokenizer.model": 1, "merges.txt": 1, "vocab.json": 1,
        "chat_template.jinja": 1, "model-00001-of-00002.safetensors": 1, "model-00002-of-00002.safetensors": 1,
        "model.safetensors.index.json": 1, "consolidated.safetensors": 1,  # Mistral's second copy
        "pytorch_model.bin": 1, "pytorch_model.bin.index.json": 1, "model.gguf": 1, "README.md": 1,
        "LICENSE.txt": 1, "onnx/model.onnx": 1, "onnx/config.json": 1, "original/consolidated.00.pth": 1,
    }
    assert select_model_files(files) == sorted([
        "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
        "special_tokens_map.json", "tokenizer.model", "merges.txt", "vocab.json", "chat_template.jinja",
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.safetensors.index.json",
        "pytorch_model.bin.index.json",  # small json, harmless
    ])
    # without model*.safetensors, whatever safetensors the repository has
    assert select_model_files({"config.json": 1, "weights.safetensors": 1}) == ["config.json", "weights.safetensors"]


def test_redact():
    env = {"HF_TOKEN": "hf_abcdefSECRET", "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI"}
    text = "token hf_abcdefSECRET at https://user:pa55@hub.local/x and key wJalrXUtnFEMI"
    assert redact(text, env) == "token *** at https://***@hub.local/x and key ***"


def test_progress_line():
    assert human_bytes(999) == "999 B" and human_bytes(1500) == "1.5 kB" and human_bytes(2.5e9) == "2.5 GB"
    assert progress_line("hf://o/n", 250_000_000, 1_000_000_000, 10.0) == \
        "hf://o/n: 250.0 MB of 1.0 GB (25%), 25.0 MB/s, 10 s"
    assert progress_line("x", 0, None, 0.0) == "x: 0 B, 0 B/s, 0 s"


def test_progress_logs_periodically(caplog):
    done = [0]
    caplog.set_level(logging.INFO, logger="hetero_infer.progress")
    with Progress("s3://b/m", 1000, lambda: done[0], interval=0.02, tty=False):
        for _ in range(10):
            done[0] += 100
            time.sleep(0.02)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) >= 3
    percents = [int(m.group(1)) for m in (re.search(r"of 1.0 kB \((\d+)%\)", line) for line in lines) if m]
    assert len(percents) == len(lines) and percents == sorted(percents) and percents[-1] > percents[0]


def test_progress_heartbeat_names_the_step(caplog):
    caplog.set_level(logging.INFO, logger="hetero_infer.progress")
    with Progress("converting m.gguf", interval=0.02, tty=False) as progress:
        progress.set_step("dequantizing weights")
        time.sleep(0.1)
    assert any(re.fullmatch(r"converting m.gguf: dequantizing weights, \d+ s", r.getMessage())
               for r in caplog.records)
