"""hf:// models through huggingface_hub against a local Hub (tests/sources/hub_server.py): only the files a model
needs, the cache when the Hub is unreachable or HF_HUB_OFFLINE is set, tokens for private and gated
repositories (never logged), revisions, and one clear line for each refusal."""

from __future__ import annotations

import logging
import os
import re

import pytest
from hub_server import Repo
from source_testing import MODEL_FILES, one_line_error

from hetero_infer.model_source import ModelSourceError, fetch_model


def _publish(hub, model_files, repo_id="org/tiny", **flags) -> Repo:
    repo = Repo(**flags)
    repo.add_commit(model_files)
    hub.repos[repo_id] = repo
    return repo


def test_public_model_fetches_only_the_files_it_needs(hub_env, model_files, caplog):
    caplog.set_level(logging.INFO)
    _publish(hub_env, model_files)
    folder, name = fetch_model("hf://org/tiny", interval=0.001)
    assert name == "org/tiny"
    assert set(os.listdir(folder)) == MODEL_FILES
    for file in MODEL_FILES:
        assert (folder / file).read_bytes() == model_files[file]
    fetched = {path.rsplit("/", 1)[-1] for method, path in hub_env.requests if method == "GET" and "/resolve/" in path}
    assert fetched == MODEL_FILES
    messages = [r.getMessage() for r in caplog.records]
    assert any(re.match(r"downloading hf://org/tiny: 5 file\(s\), 3.0 MB into ", m) for m in messages)
    assert any(re.match(r"hf://org/tiny: [\d.]+ [kMG]?B of [\d.]+ MB \(\d+%\), ", m) for m in messages)
    assert any(m.startswith("downloaded hf://org/tiny in ") for m in messages)


def test_bare_org_name_is_a_hub_model(hub_env, model_files, tmp_path, monkeypatch):
    _publish(hub_env, model_files)
    monkeypatch.chdir(tmp_path)
    folder, name = fetch_model("org/tiny")
    assert name == "org/tiny" and set(os.listdir(folder)) == MODEL_FILES
    with pytest.raises(ModelSourceError, match=r"^hf://models/llama: repository not found .* \(nor is there a "
                                               r"local folder models/llama\)$"):
        fetch_model("models/llama")  # a mistyped local path: the message says both


def test_second_start_works_from_the_cache_when_the_hub_is_unreachable(hub_env, model_files, caplog):
    _publish(hub_env, model_files)
    first, _ = fetch_model("hf://org/tiny")
    hub_env.stop()
    caplog.set_level(logging.WARNING)
    again, _ = fetch_model("hf://org/tiny")
    assert again == first and set(os.listdir(again)) == MODEL_FILES
    assert any("cannot reach" in r.getMessage() and "using the cached copy" in r.getMessage() for r in caplog.records)
    message = one_line_error("hf://org/other")
    assert "cannot reach" in message and "not in the cache" in message


def test_offline_mode_reads_the_cache_without_asking_the_hub(hub_env, model_files, monkeypatch):
    _publish(hub_env, model_files)
    first, _ = fetch_model("hf://org/tiny")
    asked = len(hub_env.requests)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert fetch_model("hf://org/tiny")[0] == first
    assert len(hub_env.requests) == asked
    assert "HF_HUB_OFFLINE" in one_line_error("hf://org/other")


def test_a_cache_missing_a_shard_is_not_used(hub_env, model_files, monkeypatch):
    files = {k: v for k, v in model_files.items() if k != "model.safetensors"}
    files["model-00001-of-00002.safetensors"] = model_files["model.safetensors"]
    files["model-00002-of-00002.safetensors"] = b"\0" * 16
    files["model.safetensors.index.json"] = (
        b'{"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}')
    _publish(hub_env, files)
    folder, _ = fetch_model("hf://org/tiny")
    (folder / "model-00002-of-00002.safetensors").unlink()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert "lacks model-00002-of-00002.safetensors" in one_line_error("hf://org/tiny")


def test_missing_repository_is_one_line(hub_env):
    assert "repository not found" in one_line_error("hf://org/missing")
    assert "revision 'nope' not found" in _error_with_repo(hub_env, "hf://org/tiny@nope")


def _error_with_repo(hub, ref: str) -> str:
    hub.repos["org/tiny"] = Repo()
    hub.repos["org/tiny"].add_commit({"config.json": b"{}", "model.safetensors": b""})
    return one_line_error(ref)


def test_private_repository_needs_the_token_which_is_never_logged(hub_env, model_files, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    _publish(hub_env, model_files, private=True)
    message = one_line_error("hf://org/tiny")
    assert "not authorized (HTTP 401)" in message and "HF_TOKEN" in message
    monkeypatch.setenv("HF_TOKEN", hub_env.token)
    folder, _ = fetch_model("hf://org/tiny", interval=0.001)
    assert set(os.listdir(folder)) == MODEL_FILES
    assert f"Bearer {hub_env.token}" in hub_env.auth_headers  # it was sent...
    assert hub_env.token not in caplog.text  # ...and never logged


def test_gated_repository_without_access_is_one_line(hub_env, model_files, monkeypatch):
    _publish(hub_env, model_files, gated=True)
    assert "gated repository" in one_line_error("hf://org/tiny")
    monkeypatch.setenv("HF_TOKEN", "hf_some_other_users_token")
    message = one_line_error("hf://org/tiny")
    assert "HTTP 403" in message and "gated repository" in message and "hf_some_other_users_token" not in message
    monkeypatch.setenv("HF_TOKEN", hub_env.token)
    assert set(os.listdir(fetch_model("hf://org/tiny")[0])) == MODEL_FILES


def test_revisions(hub_env, model_files):
    repo = _publish(hub_env, {**model_files, "generation_config.json": b'{"v": 1}'})
    v1 = repo.refs["main"]
    repo.refs["v1"] = v1
    repo.add_commit({**model_files, "generation_config.json": b'{"v": 2}'})
    assert (fetch_model("hf://org/tiny")[0] / "generation_config.json").read_bytes() == b'{"v": 2}'
    assert (fetch_model("hf://org/tiny@v1")[0] / "generation_config.json").read_bytes() == b'{"v": 1}'
    folder, name = fetch_model(f"hf://org/tiny@{v1}")
    assert folder.name == v1 and name == "org/tiny"


def test_a_repository_without_a_model_is_refused(hub_env):
    hub_env.repos["org/gguf-only"] = Repo()
    hub_env.repos["org/gguf-only"].add_commit({"config.json": b"{}", "model.Q4_0.gguf": b"\0", "model.bin": b""})
    assert "no .safetensors weights" in one_line_error("hf://org/gguf-only")
    hub_env.repos["org/data"] = Repo()
    hub_env.repos["org/data"].add_commit({"README.md": b"x"})
    assert "no config.json" in one_line_error("hf://org/data")


def test_fetch_command(hub_env, model_files, capsys, caplog):
    from hetero_infer.cli import main
    from hetero_infer.model_source import EXIT_PERMANENT

    _publish(hub_env, model_files)
    assert main(["fetch", "hf://org/tiny"]) == 0
    folder = capsys.readouterr().out.strip()
    assert set(os.listdir(folder)) == MODEL_FILES
    caplog.clear()
    assert main(["fetch", "hf://org/missing"]) == EXIT_PERMANENT  # the download Job fails at once (no retries)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].startswith("hf://org/missing: repository not found")


def test_dummy_weights_fetch_no_weights(hub_env, model_files):
    """load_format="dummy" reads only config.json and the tokenizer: the weights are never downloaded, and a later
    real start downloads them then."""
    _publish(hub_env, model_files)
    folder, _ = fetch_model("hf://org/tiny", weights=False)
    assert set(os.listdir(folder)) == MODEL_FILES - {"model.safetensors"}
    assert not any(path.endswith(".safetensors") for _, path in hub_env.requests)
    folder, _ = fetch_model("hf://org/tiny")
    assert set(os.listdir(folder)) == MODEL_FILES


def test_fetch_logs_no_line_per_http_request(hub_env, model_files, caplog, monkeypatch):
    """huggingface_hub's HTTP client logs each request at INFO: a download of a sharded model would print hundreds
    of lines between the progress lines."""
    from hetero_infer.cli import main
    from hetero_infer.model_source import HTTP_CLIENT_LOGGERS

    for name in HTTP_CLIENT_LOGGERS:
        monkeypatch.setattr(logging.getLogger(name), "level", logging.NOTSET)
    caplog.set_level(logging.INFO)
    _publish(hub_env, model_files)
    assert main(["fetch", "hf://org/tiny"]) == 0
    names = {r.name for r in caplog.records}
    assert "hetero_infer.model_source" in names and not names & set(HTTP_CLIENT_LOGGERS)
