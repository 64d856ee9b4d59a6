"""`GET /v1/tokenizer/files`: this worker's tokenizer as the text files `AutoTokenizer.from_pretrained` reads, so
that a router without the model (the operator image) can tokenize prompts and render chat templates exactly as
the workers do and hash the same token blocks the workers report (docs/router.md).

The files are those of the tokenizer the server loaded, written by its own `save_pretrained` (whatever it came
from: a model folder, a GGUF file, a hub id), once per tokenizer, off the event loop. Only UTF-8 text files up to
`MAX_FILE_BYTES` are served; the others are named in `skipped` with the reason. Answer:

    {"object": "tokenizer.files", "model": NAME, "digest": "sha256:HEX",
     "files": {"tokenizer.json": TEXT, ...}, "skipped": [{"file": NAME, "reason": WHY}, ...]}

`digest` covers the names and contents of the files served.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import tempfile
import weakref
from pathlib import Path
from typing import Any

from aiohttp import web

from hetero_infer.worker.server.state import get_state

MAX_FILE_BYTES = 48 * 1024 * 1024  # the largest tokenizer.json files in use are about 35 MB
# Written by save_pretrained but not read by AutoTokenizer (or not needed to tokenize).
_UNNEEDED = frozenset({"generation_config.json", "config.json"})

# The rendered answer per tokenizer object (a worker's never changes once loaded).
_cache: weakref.WeakKeyDictionary[Any, bytes] = weakref.WeakKeyDictionary()


def collect_files(folder: Path) -> tuple[dict[str, str], list[dict[str, str]]]:
    """The servable files of a saved tokenizer folder (sorted by name) and the ones left out, with why."""
    files: dict[str, str] = {}
    skipped: list[dict[str, str]] = []
    for path in sorted(folder.iterdir()):
        if not path.is_file() or path.name in _UNNEEDED:
            continue
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            skipped.append({"file": path.name, "reason": f"{size} bytes, over the {MAX_FILE_BYTES}-byte limit"})
            continue
        try:
            files[path.name] = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            skipped.append({"file": path.name, "reason": "binary (not UTF-8 text)"})
    return files, skipped


def files_digest(files: dict[str, str]) -> str:
    h = hashlib.sha256()
    for name in sorted(files):
        data = files[name].encode("utf-8")
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
    return "sha256:" + h.hexdigest()


def render(tokenizer: Any, model: str) -> bytes:
    """The answer's body for `tokenizer` (a hetero_infer.contracts.tokenizer.Tokenizer)."""
    with tempfile.TemporaryDirectory(prefix="hetero-infer-tokenizer-") as tmp:
        tokenizer.hf.save_pretrained(tmp)
        files, skipped = collect_files(Path(tmp))
    body = {"object": "tokenizer.files", "model": model, "digest": files_digest(files), "files": files,
            "skipped": skipped}
    return json.dumps(body, ensure_ascii=False).encode("utf-8")


async def tokenizer_files(request: web.Request) -> web.Response:
    state = get_state(request)
    state.check_serving()
    tokenizer = state.require_tokenizer("/v1/tokenizer/files")
    body = _cache.get(tokenizer)
    if body is None:  # saving takes a while (a tokenizer.json of megabytes): off the event loop
        body = await asyncio.get_running_loop().run_in_executor(None, render, tokenizer, state.model_name)
        _cache[tokenizer] = body
    return web.Response(body=body, content_type="application/json")
