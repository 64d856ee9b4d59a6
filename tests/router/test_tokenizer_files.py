"""`GET /v1/tokenizer/files` on a worker (worker/server/tokenizer_files.py): the files of the tokenizer it loaded,
text only, behind its API key like the rest of /v1/; binary and oversized files are named, not served."""

from __future__ import annotations

import contextlib
import hashlib
import json

import aiohttp
import pytest
from worker_thread import real_workers

from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.worker.core.engine import LLMEngine
from hetero_infer.worker.server import tokenizer_files

KEY = "sk-worker-secret"
PATH = "/v1/tokenizer/files"


@pytest.fixture(scope="module")
def engine() -> LLMEngine:
    return LLMEngine(EngineConfig(executor="mock", max_model_len=128, max_num_seqs=2))


@contextlib.asynccontextmanager
async def served(engine: LLMEngine, **options):
    async with real_workers([engine], **options) as (url,):
        yield url


async def test_the_files_are_the_loaded_tokenizers(engine: LLMEngine) -> None:
    async with served(engine) as url, aiohttp.ClientSession() as s:
        async with s.get(url + PATH) as r:
            assert r.status == 200 and r.content_type == "application/json"
            body = await r.json()
        async with s.get(url + "/v1/models") as r:
            model = (await r.json())["data"][0]["id"]
    assert body["object"] == "tokenizer.files" and body["model"] == model
    files = body["files"]
    assert {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"} <= set(files)
    assert body["skipped"] == []
    # The chat template is the one the worker renders with; tokenizer.json holds its whole vocabulary.
    assert files["chat_template.jinja"] == engine.tokenizer.hf.chat_template
    assert len(json.loads(files["tokenizer.json"])["model"]["vocab"]) + len(
        json.loads(files["tokenizer.json"])["added_tokens"]) >= engine.tokenizer.vocab_size
    h = hashlib.sha256()
    for name in sorted(files):
        data = files[name].encode()
        h.update(f"{name}\0{len(data)}\0".encode() + data)
    assert body["digest"] == "sha256:" + h.hexdigest()


@pytest.mark.parametrize("key, status", [(KEY, 200), (None, 401), ("wrong", 401)])
async def test_the_files_need_the_api_key(engine: LLMEngine, key: str | None, status: int) -> None:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with served(engine, api_key=[KEY]) as url, aiohttp.ClientSession() as s:
        async with s.get(url + PATH, headers=headers) as r:
            assert r.status == status
            body = await r.json()
    assert ("files" in body) == (status == 200)


def test_binary_and_oversized_files_are_named_not_served(tmp_path, monkeypatch) -> None:
    (tmp_path / "tokenizer.json").write_text('{"x": "ü"}', encoding="utf-8")
    (tmp_path / "tokenizer.model").write_bytes(b"\x80\x81\xfe\xff binary")
    (tmp_path / "vocab.txt").write_text("a\n" * 600)
    (tmp_path / "config.json").write_text("{}")
    monkeypatch.setattr(tokenizer_files, "MAX_FILE_BYTES", 1000)
    files, skipped = tokenizer_files.collect_files(tmp_path)
    assert files == {"tokenizer.json": '{"x": "ü"}'}
    assert [s["file"] for s in skipped] == ["tokenizer.model", "vocab.txt"]
    assert "binary" in skipped[0]["reason"] and "1200 bytes" in skipped[1]["reason"]
