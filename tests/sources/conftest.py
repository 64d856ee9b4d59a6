"""Fixtures of the model-source tests: a tiny real model, a local Hub serving it, an S3 server (moto's server
mode, on loopback) holding it, and an environment whose caches are this test's own."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

_TESTS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(_TESTS / "quant"))  # quant_testing: save_tiny_model
sys.path.insert(0, str(_TESTS / "server"))  # server_proc: ServerProcess

from hub_server import LocalHub, folder_files  # noqa: E402

# Files a repository also carries that a model does not need (and that must not be fetched).
EXTRA_FILES = {
    "pytorch_model.bin": b"\0" * 4096,
    "onnx/model.onnx": b"\0" * 4096,
    "onnx/config.json": b"{}",
    "original/consolidated.pth": b"\0" * 4096,
    "model.Q4_0.gguf": b"\0" * 4096,
    "README.md": b"# tiny\n",
}


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory) -> Path:
    """A tiny random-weight llama saved with save_pretrained (safetensors) and the default tokenizer."""
    from quant_testing import save_tiny_model

    folder = tmp_path_factory.mktemp("tiny-llama")
    save_tiny_model("llama", folder)
    return folder


@pytest.fixture(scope="session")
def tiny_files(tiny_folder) -> dict[str, bytes]:
    """The tiny model's files and the extras a repository also carries."""
    return {**folder_files(tiny_folder), **EXTRA_FILES}


@pytest.fixture(scope="session")
def model_files() -> dict[str, bytes]:
    """A small stand-in for the transfer tests (which compare bytes, not outputs): a model's file names."""
    rng = random.Random(7)
    return {
        "config.json": b'{"model_type": "llama", "architectures": ["LlamaForCausalLM"]}',
        "generation_config.json": b'{"eos_token_id": 2}',
        "tokenizer.json": b'{"version": "1.0"}',
        "tokenizer_config.json": b'{}',
        "model.safetensors": rng.randbytes(3_000_000),
        **EXTRA_FILES,
    }


@pytest.fixture
def hub():
    server = LocalHub().start()
    yield server
    server.stop()


@pytest.fixture
def hub_env(hub, tmp_path, monkeypatch):
    """HF_ENDPOINT at the local Hub, HF_HOME in this test's folder, no token."""
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(name, raising=False)
    return hub


@pytest.fixture(scope="module")
def s3_server():
    """moto's S3 server on loopback (a real HTTP server; boto3 speaks to it over the wire)."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_env(s3_server, tmp_path, monkeypatch):
    """The standard AWS variables aimed at the local server, HETERO_INFER_MODEL_CACHE in this test's folder."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDLOCALTEST")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "local-secret-key-never-logged")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("HETERO_INFER_MODEL_CACHE", str(tmp_path / "models"))
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    return s3_server
