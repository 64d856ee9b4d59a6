"""`LLM`: offline batched generation in the shape Python users know from vLLM.

As in vLLM V1, the engine core runs in its own process by default (`engine_process`): the caller's process
checks and submits the requests, then turns the engine's token-id deltas into text and `RequestOutput`s while
the engine process runs its next steps, so that detokenization and output assembly never hold the engine's
loop. It is the server's engine process and client (worker/frontend/process.py), driven from a private event
loop. `engine_process=False` runs the engine in this process (`llm.engine`; what tests that look inside it use).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import os
import weakref
from collections.abc import Sequence as Seq
from typing import Any

from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.contracts.lora import LoRAAdapterError, LoRARequest
from hetero_infer.contracts.sampling_params import SamplingParams
from hetero_infer.log_config import configure_default_logging
from hetero_infer.worker.core.busy_loop import EngineRequest
from hetero_infer.worker.core.outputs import RequestOutput
from hetero_infer.worker.core.request_check import EngineLimits, check_request

# "0" runs `LLM`'s engine in the caller's process, "1" in its own; unset (or "auto"): its own where at least two
# CPUs are usable, as the server decides (ServerOptions.use_engine_process)
ENGINE_PROCESS_ENV = "HETERO_INFER_LLM_ENGINE_PROCESS"


def default_engine_process(environ: dict[str, str] | None = None) -> bool:
    value = (os.environ if environ is None else environ).get(ENGINE_PROCESS_ENV, "auto").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    if value != "auto":
        raise ValueError(f"{ENGINE_PROCESS_ENV}={value!r}: must be 0, 1 or auto")
    from hetero_infer.contracts.server_options import ENGINE_PROCESS_MIN_CPUS
    from hetero_infer.cpu_quota import usable_cpus

    return usable_cpus() >= ENGINE_PROCESS_MIN_CPUS


class LLM:
    """Load a model once and generate for many prompts with continuous batching.

    Keyword arguments are the engine options (see `EngineConfig`): device, dtype, block_size,
    max_num_blocks, max_num_seqs, max_model_len, max_num_batched_tokens, memory_threshold,
    executor ("torch" | "mock"), load_format ("auto" | "safetensors" | "gguf" | "dummy": random weights from
    config.json alone), skip_tokenizer_init (token ids in and out, no tokenizer files needed), enable_lora,
    max_loras, max_lora_rank, max_cpu_loras (LoRA adapters: `generate(..., lora_request=...)`), ...

    `engine_process`: run the engine core in a child process (None: the `HETERO_INFER_LLM_ENGINE_PROCESS`
    variable, else yes where at least two CPUs are usable). `shutdown()` (or the end of a `with` block, or the
    interpreter's exit) stops it.
    """

    def __init__(self, model: str | None = None, *, engine_process: bool | None = None, **kwargs: Any) -> None:
        configure_default_logging()  # each start-up phase and its time on stderr, unless the program logs already
        config = EngineConfig.from_dict({"model": model, **kwargs})
        if engine_process is None:
            engine_process = default_engine_process()
        self._ids = itertools.count()
        self._engine: Any = None
        self._remote: _EngineProcessDriver | None = None
        if engine_process:
            self._remote = _EngineProcessDriver(config)
            self._finalizer = weakref.finalize(self, self._remote.close)
            self.tokenizer = self._remote.client.detokenizer.tokenizer
            self.limits = self._remote.limits
        else:
            from hetero_infer.worker.core.engine import LLMEngine

            self._engine = LLMEngine(config, offline=True)
            self.tokenizer = self._engine.tokenizer
            self.limits = self._engine.limits

    @property
    def engine(self) -> Any:
        """The `LLMEngine`, when it runs in this process (`engine_process=False`)."""
        if self._engine is None:
            raise AttributeError("this LLM's engine runs in its own process: create it with engine_process=False "
                                 "to reach the engine object")
        return self._engine

    @property
    def engine_pid(self) -> int | None:
        """The engine process's id (None: the engine runs in this process)."""
        return None if self._remote is None else self._remote.core.pid

    def get_tokenizer(self):
        return self.tokenizer

    def shutdown(self) -> None:
        """Stop the engine process (if any); this LLM generates no more."""
        if self._remote is not None:
            self._finalizer()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def generate(
        self,
        prompts: str | Seq[str] | None = None,
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        prompt_token_ids: Seq[int] | Seq[Seq[int]] | None = None,
        use_tqdm: bool = False,
        lora_request: LoRARequest | Seq[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """One RequestOutput per prompt, in input order. Bad input raises ValueError before any work.
        `lora_request`: the LoRA adapter every prompt runs with, or one per prompt (None: the base model); an
        adapter not loaded yet is read from its folder first (LoRAAdapterError for a bad one)."""
        if prompts is None and prompt_token_ids is None:
            raise ValueError("give prompts or prompt_token_ids")
        texts: list[str | None]
        if prompt_token_ids is not None:
            ids = list(prompt_token_ids)
            token_lists = [list(ids)] if ids and isinstance(ids[0], int) else [list(x) for x in ids]
            texts = [None] * len(token_lists)
            if prompts is not None:
                texts = [prompts] if isinstance(prompts, str) else list(prompts)
                if len(texts) != len(token_lists):
                    raise ValueError("prompts and prompt_token_ids differ in length")
        else:
            texts = [prompts] if isinstance(prompts, str) else list(prompts)
            token_lists = [self._tokenizer("text prompts").encode(t) for t in texts]
        return self._run(texts, token_lists, sampling_params, use_tqdm, lora_request)

    def chat(
        self,
        messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        use_tqdm: bool = False,
        lora_request: LoRARequest | Seq[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Apply the model's chat template to one conversation (or a list of them) and generate."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        tok = self._tokenizer("chat")
        token_lists = [tok.apply_chat_template(c, add_generation_prompt=True) for c in conversations]
        return self._run([None] * len(token_lists), token_lists, sampling_params, use_tqdm, lora_request)

    # -- LoRA adapters --------------------------------------------------------------------
    def add_lora(self, lora_request: LoRARequest) -> None:
        """Read and check a LoRA adapter into the engine's host memory ahead of use (LoRAAdapterError)."""
        if self._remote is not None:
            self._remote.call(self._remote.client.add_lora(lora_request))
        else:
            self._engine.add_lora(lora_request)

    def remove_lora(self, lora_name: str) -> bool:
        if self._remote is not None:
            return self._remote.call(self._remote.client.remove_lora(lora_name))
        return self._engine.remove_lora(lora_name)

    def list_loras(self) -> list[LoRARequest]:
        if self._remote is not None:
            return self._remote.client.list_loras()
        return self._engine.list_loras()

    def _tokenizer(self, what: str):
        if self.tokenizer is None:
            raise ValueError(f"a tokenizer is needed for {what}, and this LLM has none (skip_tokenizer_init=True): pass "
                             "prompt_token_ids")
        return self.tokenizer

    def _run(self, texts, token_lists, sampling_params, use_tqdm, lora_request=None) -> list[RequestOutput]:
        if sampling_params is None:
            sampling_params = SamplingParams()
        params = (
            [sampling_params] * len(token_lists)
            if isinstance(sampling_params, SamplingParams)
            else list(sampling_params)
        )
        if len(params) != len(token_lists):
            raise ValueError(f"{len(params)} sampling params for {len(token_lists)} prompts")
        if self._remote is not None and any(p.logits_processors for p in params):
            raise ValueError("logits_processors run inside the engine, which this LLM runs in its own process: "
                             "create the LLM with engine_process=False to use them")
        limits: EngineLimits = self.limits
        max_tokens = [check_request(ids, p, limits) for ids, p in zip(token_lists, params)]  # all or nothing
        loras = _per_prompt(lora_request, len(token_lists))
        for lora in dict.fromkeys(r for r in loras if r is not None):  # bad adapters refused before any request
            self.add_lora(lora)
        requests = [EngineRequest(f"llm-{next(self._ids)}", text, ids, p, m, lora)
                    for text, ids, p, m, lora in zip(texts, token_lists, params, max_tokens, loras)]
        bar = None
        if use_tqdm:
            from tqdm import tqdm

            bar = tqdm(total=len(requests), desc="Generating", unit="req")
        try:
            if self._remote is not None:
                return self._remote.generate(requests, bar)
            return _generate_here(self._engine, requests, bar)
        finally:
            if bar:
                bar.close()


def _per_prompt(lora_request: Any, n: int) -> list[LoRARequest | None]:
    if lora_request is None or isinstance(lora_request, LoRARequest):
        return [lora_request] * n
    loras = list(lora_request)
    if len(loras) != n:
        raise ValueError(f"{len(loras)} lora requests for {n} prompts")
    for r in loras:
        if r is not None and not isinstance(r, LoRARequest):
            raise LoRAAdapterError(f"lora_request must be a LoRARequest or None, not {type(r).__name__}")
    return loras


def _generate_here(engine: Any, requests: list[EngineRequest], bar: Any) -> list[RequestOutput]:
    """The requests' final outputs, in order, from an engine in this process (`LLMEngine.step` makes the text)."""
    order = {r.request_id: i for i, r in enumerate(requests)}
    results: list[RequestOutput | None] = [None] * len(requests)
    left = len(requests)
    try:
        for r in requests:
            engine.add_request(r.request_id, r.prompt, r.prompt_token_ids, r.params, max_tokens=r.max_tokens,
                               lora_request=r.lora_request)
        while left:
            for out in engine.step():
                if out.error is not None:
                    raise RuntimeError(f"generation failed: {out.error}")
                if out.finished and out.request_id in order:
                    results[order[out.request_id]] = out
                    left -= 1
                    if bar:
                        bar.update()
    finally:
        for request_id, i in order.items():
            if results[i] is None:
                engine.abort_request(request_id)
    return results  # type: ignore[return-value]


class _EngineProcessDriver:
    """An `EngineProcess` and its `ProcessEngineClient` on a private event loop: `generate` submits a batch and runs
    the loop until every request has ended (the client reads the child's pipe and makes the text meanwhile)."""

    def __init__(self, config: EngineConfig) -> None:
        from hetero_infer.worker.frontend.process import (
            EngineProcess,
            ProcessEngineClient,
            load_parent_tokenizer,
        )

        # Only finished requests are handed over (no stream to feed): one delta per request, its whole output.
        # the child's start-up records at this process's level for the package (`configure_default_logging`)
        level = logging.getLevelName(logging.getLogger("hetero_infer").getEffectiveLevel()).lower()
        self.core = EngineProcess(config, float("inf"), (level, "text"), offline=True)
        self.core.start()
        try:
            if not config.skip_tokenizer_init:
                from hetero_infer.contracts.tokenizer import import_tokenizer_library

                import_tokenizer_library()  # while the child resolves the model, as the server does
            tokenizer = load_parent_tokenizer(self.core.wait_pinned())  # while the child builds the engine
            self.limits: EngineLimits = self.core.wait_ready()
        except BaseException:
            self.core.stop(2.0)
            raise
        self.loop = asyncio.new_event_loop()
        self.client = ProcessEngineClient(self.core, tokenizer=tokenizer)
        self.client.start(self.loop)

    def generate(self, requests: list[EngineRequest], bar: Any) -> list[RequestOutput]:
        from hetero_infer.worker.frontend.client import EngineDeadError, RequestFailedError

        if self.loop.is_closed():
            raise RuntimeError("this LLM is shut down")
        stream = self.client.submit(requests)
        order = {r.request_id: i for i, r in enumerate(requests)}
        results: list[RequestOutput | None] = [None] * len(requests)

        async def collect() -> None:
            while outputs := await stream.next():
                for out in outputs:
                    if out.finished:
                        results[order[out.request_id]] = out
                        if bar:
                            bar.update()

        try:
            self._run(collect())
        except RequestFailedError as exc:
            raise RuntimeError(f"generation failed: {exc}") from None
        except EngineDeadError as exc:
            raise RuntimeError(f"the engine process failed: {exc}") from None
        finally:
            if not stream.done:  # a failure, or an interrupt: the others are no longer wanted
                self.client.abort(stream)
        return results  # type: ignore[return-value]

    def call(self, coro: Any) -> Any:
        """`coro`'s result, run on the private loop."""
        if self.loop.is_closed():
            raise RuntimeError("this LLM is shut down")
        box: list[Any] = []

        async def run() -> None:
            box.append(await coro)

        self._run(run())
        return box[0]

    def _run(self, coro: Any) -> None:
        """Run `coro` on the private loop: on this thread, or, where this thread runs an event loop of its own (a
        notebook), on a helper thread. An interrupt cancels it."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                return pool.submit(self._run, coro).result()
        task = self.loop.create_task(coro)
        try:
            self.loop.run_until_complete(task)
        except BaseException:
            if not task.done():
                task.cancel()
                try:
                    self.loop.run_until_complete(task)
                except BaseException:
                    pass
            raise

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self.client.shutdown(5.0)
        self.loop.close()
