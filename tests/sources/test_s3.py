"""s3:// models through boto3 against moto's S3 server on loopback: only the files a model needs, once; changed
objects fetched again; the cache when the store is unreachable; one clear line for a missing bucket or prefix
and for refused credentials, which never appear in it."""

from __future__ import annotations

import logging
import os
import socket
import urllib.request

from s3_store import put_objects
from source_testing import MODEL_FILES, one_line_error

from hetero_infer.model_source import fetch_model


def test_prefix_fetched_once_with_only_the_model_files(s3_env, model_files, caplog, tmp_path):
    caplog.set_level(logging.INFO)
    put_objects(s3_env, "models", "team/tiny", model_files)
    folder, name = fetch_model("s3://models/team/tiny/", interval=0.001)
    assert name == "tiny" and folder == tmp_path / "models" / "s3" / "models" / "team" / "tiny"
    assert {p for p in os.listdir(folder) if not p.startswith(".")} == MODEL_FILES
    for file in MODEL_FILES:
        assert (folder / file).read_bytes() == model_files[file]
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("downloading s3://models/team/tiny: 5 file(s), 3.0 MB into ") for m in messages)
    assert any(m.startswith("s3://models/team/tiny: ") and "(100%)" in m for m in messages)
    caplog.clear()
    assert fetch_model("s3://models/team/tiny")[0] == folder
    assert not any(r.getMessage().startswith("downloading") for r in caplog.records)  # the cache is current


def test_a_changed_object_is_fetched_again(s3_env, model_files):
    put_objects(s3_env, "models", "changing", model_files)
    folder, _ = fetch_model("s3://models/changing")
    put_objects(s3_env, "models", "changing", {"generation_config.json": b'{"eos_token_id": 7}'})
    assert (fetch_model("s3://models/changing")[0] / "generation_config.json").read_bytes() == \
        b'{"eos_token_id": 7}'
    assert (folder / "model.safetensors").read_bytes() == model_files["model.safetensors"]


def test_second_start_works_from_the_cache_when_the_store_is_unreachable(s3_env, model_files, monkeypatch, caplog):
    put_objects(s3_env, "models", "cached", model_files)
    folder, _ = fetch_model("s3://models/cached")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", closed)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    caplog.set_level(logging.WARNING)
    assert fetch_model("s3://models/cached")[0] == folder
    assert any("cannot reach" in r.getMessage() and "using the cached copy" in r.getMessage() for r in caplog.records)
    message = one_line_error("s3://models/never-fetched")
    assert "cannot reach" in message and "not in the cache" in message


def test_missing_bucket_and_prefix_are_one_line(s3_env, model_files):
    put_objects(s3_env, "models", "present", model_files)
    assert "bucket 'no-such-bucket' not found" in one_line_error("s3://no-such-bucket/x")
    assert "no objects under this prefix" in one_line_error("s3://models/absent")
    put_objects(s3_env, "models", "weights-only", {"model.safetensors": b"\0"})
    assert "no config.json" in one_line_error("s3://models/weights-only")


def test_refused_credentials_are_one_line_without_the_secret(s3_env, model_files, caplog):
    put_objects(s3_env, "models", "guarded", model_files)
    caplog.set_level(logging.DEBUG)

    def moto_auth(count: str) -> None:  # moto's own switch: check signatures against its IAM users from now on
        urllib.request.urlopen(urllib.request.Request(f"{s3_env}/moto-api/reset-auth", data=count.encode(),
                                                      headers={"Content-Type": "text/plain"}))

    moto_auth("0")
    try:
        message = one_line_error("s3://models/guarded")
    finally:
        moto_auth("inf")
    assert "access denied (InvalidAccessKeyId)" in message
    assert os.environ["AWS_SECRET_ACCESS_KEY"] not in message + caplog.text


def test_dummy_weights_fetch_no_weights_and_keep_the_cache_whole(s3_env, model_files, caplog):
    put_objects(s3_env, "models", "dummy", model_files)
    folder, _ = fetch_model("s3://models/dummy")
    caplog.set_level(logging.INFO)
    assert fetch_model("s3://models/dummy", weights=False)[0] == folder  # everything it needs is cached
    assert fetch_model("s3://models/dummy")[0] == folder
    assert not any(r.getMessage().startswith("downloading") for r in caplog.records)  # the weights' entry stayed


def test_dummy_weights_from_a_fresh_cache_download_no_weights(s3_env, model_files):
    put_objects(s3_env, "models", "fresh", model_files)
    folder, _ = fetch_model("s3://models/fresh", weights=False)
    assert {p for p in os.listdir(folder) if not p.startswith(".")} == MODEL_FILES - {"model.safetensors"}
