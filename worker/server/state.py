"""What the handlers share: the engine client, the model's facts, the metrics and the serving phase."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from aiohttp import web

from hetero_infer.contracts.lora import LoRARequest
from hetero_infer.contracts.server_options import ServerOptions
from hetero_infer.worker.core.request_check import EngineLimits
from hetero_infer.worker.frontend.client import EngineClient
from hetero_infer.worker.server.errors import APIError, overloaded, unavailable
from hetero_infer.worker.server.lora import ServedAdapters
from hetero_infer.worker.server.metrics import ServerMetrics

LOADING, READY, DRAINING, FAILED = "loading", "ready", "draining", "failed"


class ServerState:
    def __init__(self, options: ServerOptions, metrics: ServerMetrics | None = None) -> None:
        self.options = options
        self.metrics = metrics or ServerMetrics()
        self.api_keys: list[bytes] = [k.encode() for k in options.api_keys()]
        self.phase = LOADING
        self.load_error: str | None = None
        self.created = int(time.time())
        self._engine: EngineClient | None = None
        self.tokenizer: Any = None
        self.limits: EngineLimits | None = None
        self.model_name = ""
        self.model_root = ""  # where the base model came from (its /v1/models card's root)
        self.max_model_len = 0
        self.lora_enabled = False  # the engine serves LoRA adapters (--enable-lora)
        self.adapters = ServedAdapters()
        self.max_num_seqs = 1
        self.open_seqs = 0  # sequences of admitted requests (running or waiting)
        self.active_requests = 0  # generation handlers in flight
        self._idle = asyncio.Event()
        self._idle.set()
        self._token_text: dict[int, str] = {}
        self._decoded_token: dict[int, str] = {}

    # ----------------------------------------------------------------- engine
    def start_engine(self, engine: Any, *, max_num_seqs: int, tokenizer: Any = None,
                     core: Any = None, ready: bool = True) -> EngineClient:
        """Start serving a loaded `LLMEngine` on an engine thread (call on the event loop), or, with `core` (an
        `EngineProcess` that is ready; `engine` is then unused), the engine in that process.

        `tokenizer` is the loop's own copy (default: the engine's, shared with the engine thread). `ready` False:
        still loading (the caller has more to do first: --lora-modules) until it sets the phase to READY.
        """
        client: EngineClient
        if core is not None:
            from hetero_infer.worker.frontend.process import ProcessEngineClient

            client = ProcessEngineClient(core, timing_sink=self.metrics, stream_interval=self.options.stream_interval,
                                         tokenizer=tokenizer)
            limits = core.limits
        else:
            from hetero_infer.worker.frontend.inproc import InprocEngineClient

            tokenizer = tokenizer if tokenizer is not None else engine.tokenizer
            client = InprocEngineClient(engine, timing_sink=self.metrics, stream_interval=self.options.stream_interval,
                                        tokenizer=tokenizer)
            limits = engine.limits
        client.start()
        config = getattr(core, "pinned", None) if core is not None else getattr(engine, "config", None)
        self.lora_enabled = bool(getattr(config, "enable_lora", False))
        self.model_root = str(getattr(config, "model", None) or limits.model_name)
        self._engine = client
        self.tokenizer = tokenizer
        self.limits = limits
        self.model_name = limits.model_name
        self.max_model_len = limits.max_model_len
        self.max_num_seqs = max_num_seqs
        self.metrics.bind(self.model_name, client.stats, lambda: client.healthy,
                          {"block_size": str(limits.block_size), "num_gpu_blocks": str(limits.num_blocks)},
                          limits.max_model_len, self.adapters.names)
        self.phase = READY if ready else LOADING
        return client

    @property
    def engine(self) -> EngineClient:
        assert self._engine is not None
        return self._engine

    @property
    def ready(self) -> bool:
        return self.phase == READY and self._engine is not None and self._engine.healthy

    def readiness(self) -> tuple[bool, str, str | None]:
        """(ready, status word, error) for /readyz."""
        if self.phase == READY and self._engine is not None and not self._engine.healthy:
            return False, "engine_failed", self._engine.error
        if self.phase == FAILED:
            return False, FAILED, self.load_error
        return self.phase == READY, self.phase, None

    def liveness(self) -> tuple[bool, str, str | None]:
        """(alive, status word, error) for /healthz, the liveness probe: alive while loading, serving and
        draining, not once a started engine has died. A dead engine never comes back in this process, so the
        kubelet should restart the pod (after the probe's failureThreshold) rather than let it hold its GPU;
        /readyz, /healthz's body and the log keep saying why until then."""
        if self._engine is not None and not self._engine.healthy and self.phase in (READY, DRAINING):
            return False, "engine_failed", self._engine.error
        return True, "ok", None

    def require_tokenizer(self, what: str, param: str | None = None) -> Any:
        """The tokenizer; a 400 naming `what` when this worker runs without one (--skip-tokenizer-init)."""
        if self.tokenizer is None:
            raise APIError(400, f"{what} needs a tokenizer, and this worker runs without one "
                                "(--skip-tokenizer-init): send prompts as token ids to /v1/completions",
                           param=param, code="invalid_value")
        return self.tokenizer

    def token_text(self, token_id: int) -> str:
        text = self._token_text.get(token_id)
        if text is None:
            text = self._token_text[token_id] = self.tokenizer.decode([token_id])
        return text

    def decoded_token(self, token_id: int) -> str:
        """The token decoded alone, special tokens included: vLLM's `Logprob.decoded_token`."""
        text = self._decoded_token.get(token_id)
        if text is None:
            text = self._decoded_token[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return text

    # ----------------------------------------------------------------- admission
    def check_model(self, model: str | None) -> LoRARequest | None:
        """The LoRA adapter `model` names (None: the base model); 404 for a name this worker does not serve."""
        if model is None or model == self.model_name or self.phase == LOADING:
            return None
        adapter = self.adapters.get(model)
        if adapter is None:
            served = ", ".join(f"`{m}`" for m in [self.model_name, *self.adapters.names()])
            raise APIError(404, f"The model `{model}` does not exist. This worker serves {served}.",
                           param="model", code="model_not_found")
        return adapter

    def check_serving(self) -> None:
        """503 unless the engine is loaded, healthy and the server is not draining."""
        if self.phase == LOADING:
            self.metrics.rejected("not_ready")
            raise unavailable("the model is still loading", "not_ready", retry_after_s=5)
        if self.phase in (DRAINING, FAILED):
            self.metrics.rejected("draining")
            raise unavailable("the server is shutting down", "shutting_down")
        if not self.engine.healthy:
            self.metrics.rejected("engine_failed")
            raise unavailable(f"the engine has failed: {self.engine.error}", "engine_failed")

    @contextmanager
    def admit(self, num_seqs: int) -> Iterator[None]:
        """Count a generation request in; 429 when the waiting queue is full."""
        self.check_serving()
        capacity = self.max_num_seqs + self.options.max_queue_len
        if num_seqs > capacity:
            raise APIError(400, f"the request asks for {num_seqs} sequences; this server holds at most {capacity}",
                           param="n", code="request_too_large")
        if self.open_seqs + num_seqs > capacity:
            self.metrics.rejected("queue_full")
            raise overloaded(
                f"the server is at capacity ({self.open_seqs} sequences running or waiting, queue limit "
                f"{self.options.max_queue_len}); retry later", self.options.retry_after)
        self.open_seqs += num_seqs
        self.active_requests += 1
        self._idle.clear()
        try:
            yield
        finally:
            self.open_seqs -= num_seqs
            self.active_requests -= 1
            if self.active_requests == 0:
                self._idle.set()

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no generation request is in flight; False if the timeout passed first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False


STATE_KEY = web.AppKey("state", ServerState)


def get_state(request: web.Request) -> ServerState:
    return request.app[STATE_KEY]
