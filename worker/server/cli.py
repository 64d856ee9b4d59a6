"""`hetero-infer serve`: the worker process.

Options come from flags, environment variables (HETERO_INFER_<NAME>) and a JSON/YAML `--config FILE` holding
server and engine keys in snake_case; precedence flag > environment > file > default. Everything is
validated before anything slow happens; a bad option exits with status 2 and a one-line reason.

Start-up binds the port first (so /healthz answers and /readyz says "loading" while the model loads), then
builds the engine in its own process (`--engine-process`, the default; see worker/frontend/process.py) or on a
background thread (`--no-engine-process`), then turns ready. SIGTERM/SIGINT drain: /readyz fails at once,
new requests get 503, in-flight requests have `--shutdown-grace` seconds to finish, then the process exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import logging
import os
import signal
import sys
import threading
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from hetero_infer.contracts import cors, hosts
from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.contracts.lora_modules import parse_lora_modules
from hetero_infer.contracts.options import TRUE_WORDS, add_flags, environment_values, load_options
from hetero_infer.contracts.server_options import LOG_FORMATS, LOG_LEVELS, ServerOptions
from hetero_infer.model_source import ModelSourceError
from hetero_infer.worker.cli_args import ENV_PREFIX, add_engine_args
from hetero_infer.worker.frontend.gc_freeze import freeze_startup_objects
from hetero_infer.worker.server.lora import VLLM_RUNTIME_ENV, follow_modules_file

logger = logging.getLogger("hetero_infer.server")

_SERVER_HELP = {
    "host": "address to bind (default 127.0.0.1; use 0.0.0.0 in containers)",
    "port": "port to bind (default 3000; 0 picks a free one, printed at start)",
    "api_key": "require this API key on /v1/* (repeatable; prefer --api-key-file or HETERO_INFER_API_KEY)",
    "api_key_file": "file with one API key per line",
    "max_queue_len": "sequences that may wait beyond --max-num-seqs before requests get 429 (default 512)",
    "request_timeout": "seconds a request may run before it is aborted with 504 (default 600)",
    "grammar_compile_timeout": "seconds a new structured-output schema, regex or grammar may take to compile "
    "(off the engine loop: only its own request waits) before the request gets 400 (default 10)",
    "shutdown_grace": "seconds in-flight requests may still run after SIGTERM (default 30)",
    "header_timeout_s": "seconds a new connection has to send its first request's headers, else it is closed "
    "(default 30)",
    "body_timeout_s": "seconds a request's body may take to arrive, else 408 and the connection is closed "
    "(default 60)",
    **cors.HELP,
    "allowed_hosts": hosts.HELP,
    "keepalive_timeout_s": "seconds a kept-alive connection may sit idle, or in the headers of its next request, "
    "before it is closed (default 30)",
    "max_body_bytes": "largest request body; larger ones get 413 (default 4 MiB)",
    "retry_after": "Retry-After seconds sent with 429 (default 1)",
    "stream_interval": "deliver new tokens to the HTTP side at most every this many seconds; steps in between "
    "are coalesced into one chunk (default 0.01; only matters when steps are faster than that)",
    "log_level": f"one of {', '.join(LOG_LEVELS)}",
    "log_format": f"one of {', '.join(LOG_FORMATS)} (default auto: text when stderr is a terminal, else json)",
    "access_log": "log one line per HTTP request (default on)",
    "enable_prompt_tokens_details": "report the prompt tokens served by the prefix cache in responses, as "
    "usage.prompt_tokens_details.cached_tokens (default on, as OpenAI does; vLLM's flag, off there)",
    "engine_process": "run the engine core in its own process, so that it does not share the GIL with the HTTP "
    "side; --no-engine-process runs it on a thread of the server process (default: a process when at least 2 "
    "CPUs are usable, else a thread)",
    "lora_modules": "LoRA adapters to serve from the start (needs --enable-lora), each NAME=PATH or vLLM's JSON "
    "'{\"name\": ..., \"path\": ..., \"base_model_name\": ...}'; PATH a PEFT folder, hf://ORG/NAME[@REVISION] or "
    "s3://BUCKET/PREFIX; a request's model names one",
    "lora_modules_file": "a JSON file listing LoRA adapters as --lora-modules does, followed while the worker runs: "
    "adapters it gains are loaded, those it loses unloaded (the operator's ConfigMap of spec.adapters)",
    "allow_runtime_lora_updating": "serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's; also "
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING=true; off by default, and behind the API key when there is one)",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hetero-infer serve",
        description="Run the OpenAI-compatible worker. Options: flags > HETERO_INFER_* environment > --config file.",
    )
    group = parser.add_argument_group("server")
    add_flags(group, ServerOptions, _SERVER_HELP, skip=("lora_modules",))
    # vLLM's form: several values after one flag (--lora-modules a=/x b=/y), or the flag again
    group.add_argument("--lora-modules", dest="lora_modules", nargs="+", action="extend", default=None,
                       metavar="NAME=PATH", help=_SERVER_HELP["lora_modules"])
    add_engine_args(parser)
    return parser


def _server_env(environ: Mapping[str, str]) -> dict[str, Any]:
    """The server options that the environment sets."""
    return environment_values(ServerOptions, environ, ENV_PREFIX)


def resolve_options(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> tuple[ServerOptions, EngineConfig]:
    """Merge defaults < config file < environment < flags; ValueError with a clear message on bad input."""
    environ = os.environ if environ is None else environ
    options, engine = load_options((ServerOptions, EngineConfig), args, ENV_PREFIX, environ)
    options.api_keys()  # a missing or empty key file fails now, not at the first request
    if (not options.allow_runtime_lora_updating and args.allow_runtime_lora_updating is None
            and environ.get(VLLM_RUNTIME_ENV, "").strip().lower() in TRUE_WORDS):
        options.allow_runtime_lora_updating = True  # vLLM's variable, below our flag and variable
    given = [flag for flag, on in (("--lora-modules", options.lora_modules), ("--lora-modules-file",
                                                                              options.lora_modules_file),
                                   ("--allow-runtime-lora-updating", options.allow_runtime_lora_updating)) if on]
    if given and not engine.enable_lora:
        raise ValueError(f"{given[0]} serves LoRA adapters: it needs --enable-lora")
    return options, engine


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        options, engine_config = resolve_options(args)
    except ValueError as exc:
        print(f"hetero-infer serve: error: {exc}", file=sys.stderr)
        return 2
    from hetero_infer.worker.server.logs import setup_logging

    listener = setup_logging(options.log_level, options.log_format)
    try:
        return asyncio.run(serve(options, engine_config))
    except KeyboardInterrupt:
        return 0
    finally:
        listener.stop()  # writes out what is still queued


def _settle(future: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)


def _private_tokenizer(tokenizer: Any) -> Any:
    """A copy of the engine's tokenizer for the event loop, so that the (Rust) tokenizer object is never used
    from two threads at once: the engine thread detokenizes while the loop tokenizes."""
    try:
        return copy.deepcopy(tokenizer)
    except Exception as exc:  # an uncopyable tokenizer still works, shared
        logger.warning("could not copy the tokenizer (%s); sharing it with the engine thread", exc)
        return tokenizer


async def _load_engine(engine_config: EngineConfig) -> tuple[Any, Any]:
    """Build the LLMEngine (and the loop's tokenizer) on a daemon thread: loading is slow, and meanwhile the
    loop keeps answering /healthz."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def load() -> None:
        try:
            from hetero_infer.worker.core.engine import LLMEngine

            engine = LLMEngine(engine_config)
            tokenizer = _private_tokenizer(engine.tokenizer)
        except BaseException as exc:  # reported to the loop, which exits with status 1
            loop.call_soon_threadsafe(_settle, future, None, exc)
        else:
            loop.call_soon_threadsafe(_settle, future, (engine, tokenizer), None)

    threading.Thread(target=load, name="engine-load", daemon=True).start()
    return await future


async def _load_engine_process(engine_config: EngineConfig, stream_interval: float,
                               log: tuple[str, str]) -> tuple[Any, ...]:
    """Spawn the engine-core process at once (here, on the loop's thread: the child's parent-death signal follows
    the thread that created it) and wait on a daemon thread for its limits. The child resolves the model first
    (download, conversion: a stop meanwhile does not wait for it) and names the folder, from which this process
    loads its own tokenizer while the child builds the engine: the two processes' imports and loads overlap."""
    from hetero_infer.contracts.tokenizer import import_tokenizer_library
    from hetero_infer.worker.frontend.process import EngineProcess, load_parent_tokenizer

    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    core = EngineProcess(engine_config, stream_interval, log)
    try:
        core.start()
    except OSError as exc:  # no processes to be had here: the thread mode still works
        logger.warning("could not start the engine process (%s); running the engine on a thread", exc)
        return await _load_engine(engine_config)

    def load() -> None:
        try:
            if not engine_config.skip_tokenizer_init:
                import_tokenizer_library()  # while the child resolves the model
            tokenizer = load_parent_tokenizer(core.wait_pinned())
            core.wait_ready()
        except BaseException as exc:
            core.stop(2.0)
            loop.call_soon_threadsafe(_settle, future, None, exc)
        else:
            loop.call_soon_threadsafe(_settle, future, (None, tokenizer, core), None)

    threading.Thread(target=load, name="engine-load", daemon=True).start()
    try:
        return await future
    except asyncio.CancelledError:  # stopped while loading: the child reads no commands yet, so no asking it
        core.stop(0.0)
        raise


async def serve(options: ServerOptions, engine_config: EngineConfig) -> int:
    from hetero_infer.worker.server.app import create_app
    from hetero_infer.worker.server.errors import unavailable
    from hetero_infer.worker.server.logs import ACCESS_LOGGER, AccessLogger
    from hetero_infer.worker.server.state import DRAINING, FAILED, READY, ServerState
    from hetero_infer.worker.server.timeouts import GUARD_KEY

    state = ServerState(options)
    app = create_app(state)
    runner = web.AppRunner(
        app,
        handler_cancellation=True,  # a client that disconnects cancels its handler: its request is aborted
        access_log_class=AccessLogger,
        access_log=logging.getLogger(ACCESS_LOGGER) if options.access_log else None,
        shutdown_timeout=5.0,
        keepalive_timeout=options.keepalive_timeout_s,
    )
    await runner.setup()
    assert runner.server is not None
    app[GUARD_KEY].install(runner.server)
    site = web.TCPSite(runner, options.host, options.port, backlog=4096)
    try:
        await site.start()
    except OSError as exc:
        logger.error("cannot bind %s:%s: %s", options.host, options.port, exc)
        await runner.cleanup()
        return 1
    port = runner.addresses[0][1] if runner.addresses else options.port  # the real one when --port 0
    logger.info("listening on http://%s:%s", options.host, port)
    if state.api_keys:
        logger.info("API key authentication enabled for /v1/* (%d key(s))", len(state.api_keys))

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    if options.use_engine_process():
        load = asyncio.ensure_future(_load_engine_process(engine_config, options.stream_interval,
                                                          (options.log_level, options.log_format)))
    else:
        load = asyncio.ensure_future(_load_engine(engine_config))
    stopper = asyncio.ensure_future(stop.wait())
    await asyncio.wait([load, stopper], return_when=asyncio.FIRST_COMPLETED)
    if not load.done():  # stopped while loading
        logger.info("stopped while loading the model")
        load.cancel()
        await runner.cleanup()
        return 0
    try:
        engine, tokenizer, *rest = load.result()
    except Exception as exc:
        state.phase = FAILED
        state.load_error = f"{type(exc).__name__}: {exc}"
        logger.error("could not load the engine: %s", state.load_error,
                     exc_info=None if isinstance(exc, ModelSourceError) else exc)  # one line says it all
        await runner.cleanup()
        return 1

    core = rest[0] if rest else None
    async_engine = state.start_engine(engine, max_num_seqs=engine_config.max_num_seqs, tokenizer=tokenizer,
                                      core=core, ready=False)
    try:
        for module in parse_lora_modules(options.lora_modules):  # ready only then: requests may name them at once
            await state.adapters.load(state, module)
    except Exception as exc:
        state.phase = FAILED
        state.load_error = f"--lora-modules: {getattr(exc, 'message', exc)}"
        logger.error("could not load a LoRA adapter: %s", state.load_error)
        await runner.cleanup()
        async_engine.shutdown()
        return 1
    state.phase = READY
    follower = (asyncio.ensure_future(follow_modules_file(state, options.lora_modules_file))
                if options.lora_modules_file else None)
    freeze_startup_objects()
    logger.info("ready: serving %s (max_model_len %d, executor %s, engine %s)", state.model_name,
                state.max_model_len, engine_config.executor,
                f"process pid {core.pid}" if core is not None else "thread")

    await stopper
    if follower is not None:
        follower.cancel()
    alive, _, engine_error = state.liveness()
    state.phase = DRAINING
    logger.info("draining: %d request(s) in flight, grace %.1f s", state.active_requests, options.shutdown_grace)
    if not await state.wait_idle(options.shutdown_grace):
        logger.warning("grace period over: aborting %d request(s)", state.active_requests)
        async_engine.fail_all(unavailable("the server is shutting down", "shutting_down"))
        await state.wait_idle(5.0)
    await runner.cleanup()
    async_engine.shutdown()
    if not alive:  # a non-zero exit: the pod's termination message (FallbackToLogsOnError) carries the reason
        logger.error("stopped after an engine failure: %s", engine_error)
        return 1
    logger.info("stopped")
    return 0
