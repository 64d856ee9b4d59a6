"""LoRA adapters on the server, as vLLM serves them: each adapter is a served model name (a request's `model`), listed
by /v1/models with `parent` (the base model) and `root` (its folder); `--lora-modules` loads some at start, and with
`--allow-runtime-lora-updating` (or vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING=true)

    POST /v1/load_lora_adapter   {"lora_name": NAME, "lora_path": PATH}  -> 200 "Success: LoRA adapter 'NAME' added successfully."
    POST /v1/unload_lora_adapter {"lora_name": NAME}                     -> 200 "Success: LoRA adapter 'NAME' removed successfully."

add and remove them at run time (the routes do not exist otherwise: 404). A path is a local PEFT folder,
`hf://ORG/NAME[@REVISION]` or `s3://BUCKET/PREFIX`, fetched through hetero_infer/model_source.py into the model
cache. A bad adapter (a bad name, one already loaded, a path that holds none, a rank above --max-lora-rank, target
modules the model lacks, an adapter of another base model) is a 400 with the reason, and changes nothing; unloading
a name that is not loaded is vLLM's 404.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiohttp import web

from hetero_infer.contracts.lora import LoRAAdapterError, LoRARequest
from hetero_infer.contracts.lora_modules import LoRAModulePath, check_adapter_name, read_lora_modules_file
from hetero_infer.contracts.protocol import LoadLoRAAdapterRequest, UnloadLoRAAdapterRequest
from hetero_infer.model_source import ModelSourceError, fetch_model
from hetero_infer.worker.server.errors import APIError

if TYPE_CHECKING:  # state.py holds a ServedAdapters
    from hetero_infer.worker.server.state import ServerState

logger = logging.getLogger("hetero_infer.server")

LOAD_PATH, UNLOAD_PATH = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"
FOLLOW_INTERVAL_S = 2.0  # --lora-modules-file: how often it is read
RETRY_S = 60.0  # --lora-modules-file: an adapter that failed to load is tried again this much later
VLLM_RUNTIME_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"


@dataclass(frozen=True)
class ServedAdapter:
    request: LoRARequest
    source: str  # the path as given (hf://, s3:// or a folder): its model card's `root`
    created: int


class ServedAdapters:
    """The adapters a worker serves, by name. A name is taken while its adapter loads, so two loads of one name
    cannot both succeed; it is served only once the engine has read and checked the adapter."""

    def __init__(self) -> None:
        self.by_name: dict[str, ServedAdapter] = {}
        self._loading: set[str] = set()
        self._ids = itertools.count(1)

    def get(self, name: str | None) -> LoRARequest | None:
        served = self.by_name.get(name) if name is not None else None
        return served.request if served is not None else None

    def __contains__(self, name: object) -> bool:
        return name in self.by_name

    def names(self) -> list[str]:
        return sorted(self.by_name)

    async def load(self, state: ServerState, module: LoRAModulePath) -> LoRARequest:
        """Fetch, check and add one adapter to the engine, then serve it under `module.name`; APIError 400 with the
        reason (and nothing served) when it cannot be."""
        name = module.name
        if why := check_adapter_name(name):
            raise _bad(why, "lora_name")
        if not state.lora_enabled:
            raise _bad("this worker serves no LoRA adapters: start it with --enable-lora", "lora_name")
        if name == state.model_name:
            raise _bad(f"'{name}' is the base model's name; choose another name for the adapter", "lora_name")
        if name in self.by_name or name in self._loading:
            raise _bad(f"The lora adapter '{name}' has already been loaded.", "lora_name")  # vLLM's words
        self._loading.add(name)
        try:
            try:  # a download: off the event loop
                folder, _ = await asyncio.get_running_loop().run_in_executor(
                    None, lambda: fetch_model(module.path, adapter=True))
            except ModelSourceError as exc:
                raise _bad(f"cannot load the adapter '{name}': {exc}", "lora_path") from None
            request = LoRARequest(name, next(self._ids), str(folder), module.base_model_name)
            try:
                await state.engine.add_lora(request)
            except LoRAAdapterError as exc:
                raise _bad(f"cannot load the adapter '{name}': {exc}", "lora_path") from None
            self.by_name[name] = ServedAdapter(request, module.path, int(time.time()))
        finally:
            self._loading.discard(name)
        logger.info("serving the LoRA adapter %s from %s", name, module.path)
        return request

    async def unload(self, state: ServerState, name: str) -> None:
        """Stop serving `name` (new requests for it get 404 at once) and unload it from the engine (its running
        requests finish with it); APIError 404 when no adapter of that name is served."""
        served = self.by_name.pop(name, None)
        if served is None:
            raise APIError(404, f"The lora adapter '{name}' cannot be found.", param="lora_name",
                           code="model_not_found")  # vLLM's words and status
        await state.engine.remove_lora(name)
        logger.info("unloaded the LoRA adapter %s", name)

    def cards(self, base: str, owned_by: str, max_model_len: int) -> list[dict[str, object]]:
        """The adapters' /v1/models cards, vLLM's shape: `parent` the base model, `root` where it came from."""
        return [{"id": name, "object": "model", "created": s.created, "owned_by": owned_by,
                 "root": s.source, "parent": s.request.base_model_name or base, "max_model_len": max_model_len}
                for name, s in sorted(self.by_name.items())]


def _bad(message: str, param: str) -> APIError:
    return APIError(400, message, param=param, code="invalid_value")


async def load_lora_adapter(request: web.Request) -> web.Response:
    from hetero_infer.worker.server.prompts import parse_body
    from hetero_infer.worker.server.state import get_state

    state = get_state(request)
    state.check_serving()
    req: LoadLoRAAdapterRequest = await parse_body(request, LoadLoRAAdapterRequest)
    await state.adapters.load(state, LoRAModulePath(req.lora_name, req.lora_path, req.base_model_name))
    return web.Response(text=f"Success: LoRA adapter '{req.lora_name}' added successfully.")


async def unload_lora_adapter(request: web.Request) -> web.Response:
    from hetero_infer.worker.server.prompts import parse_body
    from hetero_infer.worker.server.state import get_state

    state = get_state(request)
    state.check_serving()
    req: UnloadLoRAAdapterRequest = await parse_body(request, UnloadLoRAAdapterRequest)
    await state.adapters.unload(state, req.lora_name)
    return web.Response(text=f"Success: LoRA adapter '{req.lora_name}' removed successfully.")


async def follow_modules_file(state: ServerState, path: str, interval_s: float = FOLLOW_INTERVAL_S) -> None:
    """`--lora-modules-file`: every `interval_s`, serve what the file lists (read again whole each time: a mounted
    ConfigMap is swapped in at once by the kubelet). Adapters it gains are loaded, those it loses or whose entry
    changed are unloaded (and the changed ones loaded again); one that fails to load is logged and tried again when
    its entry changes or RETRY_S later. Adapters loaded otherwise (--lora-modules, the load endpoint) are left
    alone."""
    ours: dict[str, LoRAModulePath] = {}  # loaded from the file, as the file gave them
    failed: dict[str, tuple[LoRAModulePath, float]] = {}  # entries that could not be loaded, as given, and when
    bad_file: str | None = None
    while True:
        try:
            wanted = {m.name: m for m in read_lora_modules_file(path)}
        except (ValueError, OSError) as exc:
            if str(exc) != bad_file:
                logger.error("--lora-modules-file: %s; the adapters stay as they are", exc)
                bad_file = str(exc)
        else:
            bad_file = None
            await _follow(state, wanted, ours, failed)
        await asyncio.sleep(interval_s)


async def _follow(state: ServerState, wanted: dict[str, LoRAModulePath], ours: dict[str, LoRAModulePath],
                  failed: dict[str, tuple[LoRAModulePath, float]]) -> None:
    for name in [n for n, m in ours.items() if wanted.get(n) != m]:
        del ours[name]
        try:
            await state.adapters.unload(state, name)
        except APIError:  # unloaded through the endpoint meanwhile
            pass
    for name, module in wanted.items():
        if name in ours or name in state.adapters:
            continue
        if name in failed and failed[name][0] == module and time.monotonic() - failed[name][1] < RETRY_S:
            continue
        try:
            await state.adapters.load(state, module)
        except APIError as exc:
            failed[name] = (module, time.monotonic())
            logger.error("--lora-modules-file: %s", exc.message)
        else:
            ours[name] = module
            failed.pop(name, None)
    for name in [n for n in failed if n not in wanted]:
        del failed[name]


def add_routes(app: web.Application) -> None:
    app.router.add_post(LOAD_PATH, load_lora_adapter)
    app.router.add_post(UNLOAD_PATH, unload_lora_adapter)
