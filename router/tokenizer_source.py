"""Where the router's tokenizer comes from (`--tokenizer`): the workers (`workers`, the default), a folder or the
default model (`default`), or nowhere (`none`: hashes of prompt-text chunks, approximate).

With `workers`, the router asks the first ready worker for its tokenizer's files (`GET /v1/tokenizer/files`,
worker/server/tokenizer_files.py) in the background, writes them to a temporary folder and loads them with the
workers' own class (hetero_infer.contracts.tokenizer.Tokenizer), so its token ids and chat templates are the
workers' by construction. Until then, and while no worker serves the files (another OpenAI-compatible server
answers 404), prompts are hashed as text. transformers is imported only when a tokenizer is loaded: the router
starts without it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import aiohttp

from hetero_infer.router.pool import WorkerPool

logger = logging.getLogger("hetero_infer.router")

FILES_PATH = "/v1/tokenizer/files"
WORKERS = "workers"
DISABLED = ("", "none", "off")
Mode = Literal["workers", "folder", "text"]
MODES: tuple[Mode, ...] = ("workers", "folder", "text")
_FILE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")  # a plain file name: no folders, no dot files


def source_of(option: str | None) -> Literal["workers", "folder", "none"]:
    """What a --tokenizer value asks for: the workers' tokenizer, a local one (a folder or 'default'), or none."""
    value = (option or "").strip()
    if value.lower() in DISABLED:
        return "none"
    return "workers" if value == WORKERS else "folder"


def load_tokenizer(name: str | None) -> Any:
    """A local tokenizer (a folder, a hub id in the cache, or 'default': the default model's), or None (text
    fallback) when it cannot be loaded."""
    if not name:
        return None
    try:
        from hetero_infer.contracts.tokenizer import Tokenizer

        if name == "default":
            from hetero_infer.default_model import default_tokenizer

            return default_tokenizer()
        return Tokenizer.from_pretrained(name)
    except Exception as exc:  # any failure leaves the router working, approximately
        logger.warning("tokenizer %r unavailable (%s): hashing prompt text instead", name, exc)
        return None


@dataclass(frozen=True)
class TokenizerFiles:
    model: str
    digest: str
    files: dict[str, str]


def parse_files(body: bytes) -> TokenizerFiles:
    """A worker's answer to GET /v1/tokenizer/files; ValueError when it is not one."""
    data = json.loads(body)
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, dict) or not files:
        raise ValueError("no files in the answer")
    for name, text in files.items():
        if not isinstance(name, str) or not _FILE_NAME.match(name) or not isinstance(text, str):
            raise ValueError(f"not a plain text file: {name!r}")
    return TokenizerFiles(str(data.get("model", "")), str(data.get("digest", "")), files)


def load_files(files: dict[str, str]) -> Any:
    """The workers' Tokenizer class over these files (written to a temporary folder, removed once loaded)."""
    from hetero_infer.contracts.tokenizer import Tokenizer

    with tempfile.TemporaryDirectory(prefix="hetero-infer-router-tokenizer-") as tmp:
        for name, text in files.items():
            (Path(tmp) / name).write_text(text, encoding="utf-8")
        return Tokenizer.from_pretrained(tmp)


def fetch_and_load(body: bytes) -> tuple[Any, TokenizerFiles]:
    """Parse and load a worker's answer (a few megabytes of JSON, then the tokenizer): meant for a thread."""
    files = parse_files(body)
    return load_files(files.files), files


class WorkersTokenizer:
    """Fetches the tokenizer from a ready worker (of `model`), retrying as workers appear; calls `on_loaded` once."""

    def __init__(self, pool: WorkerPool, on_loaded: Callable[[Any, str], None], api_key: str | None = None,
                 retry_s: float = 30.0, model: str | None = None) -> None:
        self.pool = pool
        self.model = model  # fetched from a worker serving this model (None: any)
        self.on_loaded = on_loaded
        self.retry_s = retry_s  # how long a worker that did not serve the files is left alone
        self._auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._refused: dict[str, float] = {}  # worker URL -> when it last did not serve them
        self._warned_auth = False
        self._warned_none = False

    def _recently_refused(self, now: float) -> set[str]:
        """Workers not to ask now: those that did not serve the files lately and, for a named model, those that do
        not list it (a worker whose models are unknown is asked by the unnamed fetcher only)."""
        skip = {u for u, t in self._refused.items() if now - t < self.retry_s}
        if self.model is not None:
            skip |= {w.url for w in self.pool.workers.values() if self.model not in w.models}
        return skip

    async def run(self, session: aiohttp.ClientSession) -> None:
        while True:
            now = time.monotonic()
            refused = self._recently_refused(now)
            candidates = self.pool.ready(refused, self.model)
            if not candidates:
                if any(now - t < self.retry_s for t in self._refused.values()) and not self._warned_none:
                    self._warned_none = True
                    logger.warning("tokenizer: the ready workers do not serve theirs (GET %s): prompts are hashed "
                                   "as text (approximate prefix index); asking again every %.0f s", FILES_PATH,
                                   self.retry_s)
                await self.pool.wait_ready(refused, now + self.retry_s, self.model)
                continue
            url = candidates[0].url
            loaded = await self._try(session, url)
            if loaded is not None:
                tokenizer, files = loaded
                logger.info("tokenizer: exact prefix hashes with the workers' tokenizer (model %s, %s, from %s)",
                            files.model, files.digest, url)
                self.on_loaded(tokenizer, url)
                return
            self._refused[url] = time.monotonic()

    async def _try(self, session: aiohttp.ClientSession, url: str) -> tuple[Any, TokenizerFiles] | None:
        try:
            async with session.get(url + FILES_PATH, headers=self._auth,
                                   timeout=aiohttp.ClientTimeout(total=120)) as r:
                if r.status != 200:
                    if r.status in (401, 403) and not self._warned_auth:
                        self._warned_auth = True
                        logger.warning("tokenizer: worker %s refused GET %s (%d): set --worker-api-key to the "
                                       "workers' key", url, FILES_PATH, r.status)
                    else:
                        logger.debug("tokenizer: worker %s answered %d to GET %s", url, r.status, FILES_PATH)
                    return None
                body = await r.read()
            return await asyncio.get_running_loop().run_in_executor(None, fetch_and_load, body)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bad answer or a lost worker: try another, or this one later
            logger.warning("tokenizer: could not load the tokenizer of worker %s: %s: %s", url,
                           exc.__class__.__name__, exc)
            return None
