"""A local Hugging Face Hub: the subset of the Hub's HTTP API that huggingface_hub's snapshot_download uses
(model info at a revision, the file tree, HEAD/GET of /resolve/), with the Hub's auth and error answers (a
missing or private repository: 401 RepoNotFound without a token, 404 with one; a gated one: 401/403 GatedRepo;
a missing revision: 404 RevisionNotFound). Run on a thread with its own event loop; point HF_ENDPOINT at `url`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web


@dataclass
class Repo:
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)  # sha -> {path: content}
    refs: dict[str, str] = field(default_factory=dict)  # branch or tag -> sha
    private: bool = False
    gated: bool = False

    def add_commit(self, files: dict[str, bytes], ref: str = "main") -> str:
        digest = hashlib.sha1()
        for path in sorted(files):
            digest.update(path.encode() + b"\0" + hashlib.sha256(files[path]).digest())
        digest.update(str(len(self.commits)).encode())  # the same files twice are two commits
        sha = digest.hexdigest()
        self.commits[sha] = dict(files)
        self.refs[ref] = sha
        return sha


def folder_files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _git_oid(content: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def _is_lfs(path: str) -> bool:
    return path.endswith((".safetensors", ".bin", ".gguf", ".pth", ".onnx"))


class LocalHub:
    def __init__(self, token: str = "hf_local_test_token") -> None:
        self.token = token
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str]] = []  # (method, path)
        self.auth_headers: list[str] = []  # the Authorization headers it received
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None

    # -- answers ------------------------------------------------------------------------------------
    _ERRORS = {401: web.HTTPUnauthorized, 403: web.HTTPForbidden, 404: web.HTTPNotFound}

    def _error(self, status: int, code: str, message: str) -> web.HTTPException:
        return self._ERRORS[status](text=json.dumps({"error": message}), content_type="application/json",
                                    headers={"X-Error-Code": code, "X-Error-Message": message})

    def _authorized(self, request: web.Request) -> bool:
        return request.headers.get("Authorization") == f"Bearer {self.token}"

    def _find(self, request: web.Request) -> tuple[str, Repo, str]:
        """(repository id, repository, commit) of a request, or the Hub's error for it (raised)."""
        repo_id = f"{request.match_info['org']}/{request.match_info['name']}"
        revision = request.match_info["rev"]
        repo = self.repos.get(repo_id)
        authorized = self._authorized(request)
        if repo is None or (repo.private and not authorized):
            raise self._error(404 if authorized else 401, "RepoNotFound", "Repository not found")
        if repo.gated and not authorized:
            has_token = "Authorization" in request.headers
            raise self._error(403 if has_token else 401, "GatedRepo",
                              f"Access to model {repo_id} is restricted. You must have access to it.")
        sha = revision if revision in repo.commits else repo.refs.get(revision)
        if sha is None:
            raise self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return repo_id, repo, sha

    @web.middleware
    async def _record(self, request: web.Request, handler):
        self.requests.append((request.method, request.path))
        if "Authorization" in request.headers:
            self.auth_headers.append(request.headers["Authorization"])
        return await handler(request)

    async def info(self, request: web.Request) -> web.StreamResponse:
        repo_id, repo, sha = self._find(request)
        return web.json_response({"id": repo_id, "modelId": repo_id, "sha": sha, "private": repo.private,
                                  "gated": "manual" if repo.gated else False,
                                  "siblings": [{"rfilename": p} for p in sorted(repo.commits[sha])]})

    async def tree(self, request: web.Request) -> web.StreamResponse:
        _, repo, sha = self._find(request)
        recursive = request.query.get("recursive", "false").lower() == "true"
        entries, folders = [], set()
        for path, content in sorted(repo.commits[sha].items()):
            if "/" in path:
                folders.add(path.split("/", 1)[0])
                if not recursive:
                    continue
            entry = {"type": "file", "path": path, "size": len(content), "oid": _git_oid(content)}
            if _is_lfs(path):
                entry["lfs"] = {"oid": hashlib.sha256(content).hexdigest(), "size": len(content),
                                "pointerSize": 134}
            entries.append(entry)
        entries += [{"type": "directory", "path": f, "size": 0, "oid": "0" * 40} for f in sorted(folders)]
        return web.json_response(entries)

    async def resolve(self, request: web.Request) -> web.StreamResponse:
        _, repo, sha = self._find(request)
        path = request.match_info["path"]
        content = repo.commits[sha].get(path)
        if content is None:
            raise self._error(404, "EntryNotFound", f"{path} does not exist")
        etag = hashlib.sha256(content).hexdigest() if _is_lfs(path) else _git_oid(content)
        headers = {"X-Repo-Commit": sha, "ETag": f'"{etag}"', "Accept-Ranges": "bytes"}
        if request.method == "HEAD":
            headers["Content-Length"] = str(len(content))
            return web.Response(status=200, headers=headers)
        start = 0
        ranged = request.headers.get("Range", "")
        if ranged.startswith("bytes=") and ranged[6:].split("-")[0]:
            start = int(ranged[6:].split("-")[0])
        if start:
            headers["Content-Range"] = f"bytes {start}-{len(content) - 1}/{len(content)}"
        return web.Response(status=206 if start else 200, body=content[start:], headers=headers)

    # -- lifecycle ----------------------------------------------------------------------------------
    def start(self, port: int = 0, host: str = "127.0.0.1") -> LocalHub:
        """Serve on `host`:`port` (0: a free one); `url` names the address it bound."""
        app = web.Application(middlewares=[self._record])
        app.router.add_get("/api/models/{org}/{name}/revision/{rev}", self.info)
        app.router.add_get("/api/models/{org}/{name}/tree/{rev}", self.tree)
        app.router.add_route("*", "/{org}/{name}/resolve/{rev}/{path:.+}", self.resolve)
        started = threading.Event()

        def run() -> None:
            self._loop = asyncio.new_event_loop()
            self._runner = web.AppRunner(app, access_log=None)
            self._loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, host, port)
            self._loop.run_until_complete(site.start())
            self.url = f"http://{host}:{self._runner.addresses[0][1]}"
            started.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="local-hub", daemon=True)
        self._thread.start()
        started.wait(10)
        return self

    def stop(self) -> None:
        if self._loop is None:
            return
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
        self._loop = None
