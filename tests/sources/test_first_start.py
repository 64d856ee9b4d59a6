"""The first start as a new user meets it: the GGUF conversion cache keyed by content (a new virtualenv's copy
of the same file finds the same conversion), health probes that do not flood the access log, and the mock
executor answering to the model name "mock"."""

from __future__ import annotations

import os
import shutil
import time

import pytest
from server_proc import ServerProcess, http

from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.worker.runner.loader import (
    DEFAULT_MODEL_NAME,
    content_key,
    convert_gguf,
    default_model_gguf,
    pin_model,
    resolve_model,
)
from hetero_infer.worker.server.logs import ProbeLog


def test_content_key_follows_the_content_not_the_path(tmp_path, monkeypatch):
    monkeypatch.setenv("HETERO_INFER_MODEL_CACHE", str(tmp_path / "models"))
    a, b, c = tmp_path / "a.gguf", tmp_path / "venv2" / "a.gguf", tmp_path / "c.gguf"
    b.parent.mkdir()
    a.write_bytes(b"GGUF" + bytes(range(256)) * 1000)
    shutil.copy(a, b)
    c.write_bytes(b"GGUF" + bytes(range(256)) * 999 + bytes(256))
    assert content_key(a) == content_key(b) != content_key(c)
    assert (tmp_path / "models" / ".digests.json").is_file()
    key = content_key(a)
    time.sleep(0.01)
    a.write_bytes(b"GGUF" + bytes(range(255, -1, -1)) * 1000)  # same size, new content and mtime
    assert content_key(a) != key


def test_a_copy_of_the_default_gguf_reuses_its_conversion(tmp_path):
    folder, _ = resolve_model(None)
    copy = tmp_path / "other-venv" / default_model_gguf().name
    copy.parent.mkdir()
    shutil.copy(default_model_gguf(), copy)
    started = time.monotonic()
    assert convert_gguf(copy, name=DEFAULT_MODEL_NAME) == folder
    assert convert_gguf(copy) == folder  # under another name too: the same content is converted once
    assert time.monotonic() - started < 30  # hashed (~1 s), not converted again (~2 minutes)


@pytest.mark.parametrize("load_format", ["auto", "gguf"])
def test_pinning_a_gguf_gives_its_converted_folder(load_format):
    """The server resolves the model once (pin_model) and hands the engine process the folder: a config asking
    for a GGUF must still be one the engine accepts."""
    pinned = pin_model(EngineConfig(model=str(default_model_gguf()), load_format=load_format, executor="mock"))
    folder, name = resolve_model(None)
    assert (pinned.model, pinned.served_model_name) == (str(folder), default_model_gguf().stem)
    assert resolve_model(pinned.model, pinned.load_format)[0] == folder
    assert pin_model(EngineConfig(executor="mock")).served_model_name == "mock"
    assert pin_model(EngineConfig(executor="mock", served_model_name="m")).served_model_name == "m"


def test_probe_log_keeps_only_changes():
    probes = ProbeLog()
    seen = [(p, s) for p, s in [("/readyz", 503)] * 5 + [("/readyz", 200)] * 5 + [("/healthz", 200)] * 3
            + [("/readyz", 503), ("/v1/models", 200), ("/v1/models", 200)] if probes.wanted(p, s)]
    assert seen == [("/readyz", 503), ("/readyz", 200), ("/healthz", 200), ("/readyz", 503),
                    ("/v1/models", 200), ("/v1/models", 200)]


@pytest.fixture(scope="module")
def mock_server():
    server = ServerProcess()
    yield server
    server.stop()


def test_probes_do_not_flood_the_access_log(mock_server):
    for _ in range(20):
        assert http("GET", mock_server.url + "/readyz").status == 200
        assert http("GET", mock_server.url + "/healthz").status == 200
    assert http("GET", mock_server.base_url + "/models").status == 200
    deadline = time.monotonic() + 10
    access: list[dict] = []
    while time.monotonic() < deadline and not any(r["path"] == "/v1/models" for r in access):
        time.sleep(0.1)
        access = [r for r in mock_server.records() if r.get("logger") == "hetero_infer.access"]
    probes = [(r["path"], r["status"]) for r in access if r["path"] in ("/readyz", "/healthz")]
    assert sorted(set(probes)) == sorted(probes)  # each answer once, however often it was asked
    assert ("/readyz", 200) in probes and ("/healthz", 200) in probes
    assert [r["path"] for r in access].count("/v1/models") == 1


def test_mock_executor_answers_to_mock(mock_server):
    assert [m["id"] for m in http("GET", mock_server.base_url + "/models").json()["data"]] == ["mock"]
    rsp = http("POST", mock_server.base_url + "/completions", {"model": "mock", "prompt": "hi", "max_tokens": 3})
    assert rsp.status == 200 and rsp.json()["model"] == "mock"
    assert http("POST", mock_server.base_url + "/completions",
                {"model": DEFAULT_MODEL_NAME, "prompt": "hi", "max_tokens": 3}).status == 404


@pytest.mark.parametrize(("dtype", "device", "expected"), [
    ("bfloat16", "cpu", "bfloat16"), ("float16", "cpu", "float32"), ("float32", "cpu", "float32"),
    ("auto", "cpu", "float32"), ("auto", "auto", "float32")])  # this machine has no CUDA: auto is the CPU
def test_a_gguf_is_converted_into_the_engines_dtype(dtype, device, expected, tmp_path, monkeypatch):
    """A bfloat16 engine (a GPU's default) gets a bfloat16 conversion: half the disk of float32, whose copy of an
    8B model (32 GB) would not fit a pod's ephemeral storage."""
    import hetero_infer.worker.runner.loader as loader

    assert loader.gguf_dtype(EngineConfig(dtype=dtype, device=device)) == expected
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    asked = []
    monkeypatch.setattr(loader, "convert_gguf", lambda path, name=None, dtype="float32": asked.append(dtype) or tmp_path)
    loader.resolve_engine_model(EngineConfig(model=str(gguf), dtype=dtype, device=device))
    loader.pin_model(EngineConfig(model=str(gguf), dtype=dtype, device=device, executor="mock"))
    assert asked == [expected, expected]


def test_a_cuda_engine_in_auto_dtype_converts_into_bfloat16(monkeypatch):
    import hetero_infer.worker.runner.executor as executor
    import hetero_infer.worker.runner.loader as loader

    monkeypatch.setattr(executor.torch.cuda, "is_available", lambda: True)
    assert loader.gguf_dtype(EngineConfig(dtype="auto", device="cuda")) == "bfloat16"
    assert loader.gguf_dtype(EngineConfig(dtype="float32", device="cuda")) == "float32"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_new_gguf_is_converted_through_transformers_in_its_dtype(dtype, tmp_path, monkeypatch):
    """A GGUF not yet in the cache reaches transformers' GGUF loader with the dtype asked for (the conversion
    itself, ~2 minutes for the default model, runs in the docker suite's image builds)."""
    import torch
    import transformers

    import hetero_infer.worker.runner.loader as loader

    monkeypatch.setenv("HETERO_INFER_MODEL_CACHE", str(tmp_path / "models"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(64))
    asked = []

    class Stop(Exception):
        pass

    def from_pretrained(folder, gguf_file=None, dtype=None):
        asked.append((folder, gguf_file, dtype))
        raise Stop

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    with pytest.raises(Stop):
        loader.convert_gguf(gguf, dtype=dtype)
    assert asked == [(tmp_path, "m.gguf", getattr(torch, dtype))]
    assert not list((tmp_path / "models").glob("m-*"))  # nothing half-converted is left as if complete


def test_a_conversion_in_a_log_draws_no_library_bars(tmp_path, monkeypatch):
    """Into a log (stderr not a terminal), transformers' own bars ("Converting and de-quantizing GGUF tensors",
    drawn with tqdm directly; "Writing model shards", through its switch) are off while the GGUF converts, and
    back on afterwards; the conversion's progress goes to log lines instead."""
    import sys

    import transformers
    import transformers.modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    import hetero_infer.worker.runner.loader as loader

    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    monkeypatch.setenv("HETERO_INFER_MODEL_CACHE", str(tmp_path / "models"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(64))
    seen = []

    class Stop(Exception):
        pass

    def from_pretrained(folder, gguf_file=None, dtype=None):
        seen.append((hf_logging.is_progress_bar_enabled(), gguf_utils.tqdm(range(2)).disable))
        raise Stop

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    assert hf_logging.is_progress_bar_enabled()
    with pytest.raises(Stop):
        loader.convert_gguf(gguf)
    assert seen == [(False, True)]
    assert hf_logging.is_progress_bar_enabled() and not gguf_utils.tqdm(range(2), file=open(os.devnull, "w")).disable
