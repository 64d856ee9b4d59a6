"""Options of the HTTP server itself (the engine's options live in `EngineConfig`)."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from hetero_infer.contracts.options import InvalidOption

LOG_FORMATS = ("auto", "json", "text")  # auto: text on a terminal, JSON otherwise (a pod, a pipe, a file)
LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclass
class ServerOptions:
    host: str = "127.0.0.1"
    port: int = 3000
    api_key: list[str] = field(default_factory=list, repr=False)  # never printed
    api_key_file: str | None = None
    max_queue_len: int = 512  # sequences that may wait beyond the running batch (max_num_seqs); then 429
    request_timeout: float = 600.0  # a request that runs longer is aborted (504)
    # A structured-output grammar that is not compiled within this many seconds: 400 (the compile runs off the
    # engine loop; only its own request waits).
    grammar_compile_timeout: float = 10.0
    # Connections that make no progress (worker/server/timeouts.py): a new connection's first request headers,
    # a request body, and the idle time (or next request's headers) between requests on a kept-alive connection.
    header_timeout_s: float = 30.0
    body_timeout_s: float = 60.0
    keepalive_timeout_s: float = 30.0
    # CORS (worker/server/cors.py), vLLM's flags: off until origins are given ("*" for any).
    allowed_origins: list[str] = field(default_factory=list)
    allowed_methods: list[str] = field(default_factory=lambda: ["*"])
    allowed_headers: list[str] = field(default_factory=lambda: ["*"])
    allow_credentials: bool = False
    # Host names the server answers to besides IP addresses and localhost (contracts/hosts.py); empty: only
    # those when bound to loopback without an API key (DNS rebinding), any otherwise.
    allowed_hosts: list[str] = field(default_factory=list)
    shutdown_grace: float = 30.0  # SIGTERM: how long in-flight requests may still run
    max_body_bytes: int = 4 * 1024 * 1024  # larger request bodies get 413
    retry_after: int = 1  # Retry-After sent with 429
    stream_interval: float = 0.01  # wake the event loop for new outputs at most this often (seconds)
    log_level: str = "info"
    log_format: str = "auto"
    access_log: bool = True
    # usage.prompt_tokens_details.cached_tokens in responses (vLLM's flag; off there, on here as in OpenAI's API)
    enable_prompt_tokens_details: bool = True
    # Run the engine core in its own process (False: on a thread of the server). None: auto, a process when
    # at least ENGINE_PROCESS_MIN_CPUS CPUs are usable (with one CPU the two processes only compete for it).
    engine_process: bool | None = None
    # LoRA adapters (vLLM's flags; the engine's --enable-lora, --max-loras, ... are engine options): the adapters
    # served from the start (NAME=PATH or vLLM's JSON object, contracts/lora_modules.py), and whether
    # POST /v1/load_lora_adapter and /v1/unload_lora_adapter exist (vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING too)
    lora_modules: list[str] = field(default_factory=list)
    allow_runtime_lora_updating: bool = False
    # A JSON file listing adapters as --lora-modules does (strings or objects), followed while the worker runs: the
    # adapters it gains are loaded, those it loses unloaded (the operator's ConfigMap, mounted in the pod)
    lora_modules_file: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.api_key, str):
            self.api_key = [self.api_key]
        self.validate()

    def validate(self) -> None:
        def bad(name: str, why: str) -> None:
            value = "***" if name == "api_key" else repr(getattr(self, name))
            raise InvalidOption(name, f"invalid server option {name}={value}: {why}")

        if not isinstance(self.host, str) or not self.host:
            bad("host", "must be a host name or IP address")
        if ":" in self.host:
            try:
                ipaddress.IPv6Address(self.host)
            except ValueError:
                bad("host", "is neither a host name nor an IP address")
        if not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            bad("port", "must be an integer in [0, 65535] (0 picks a free port)")
        if any(not isinstance(k, str) or not k.strip() for k in self.api_key):
            bad("api_key", "must be non-empty strings")
        from hetero_infer.contracts.cors import check_options

        if cors := check_options(self.allowed_origins, self.allowed_methods, self.allowed_headers,
                                 self.allow_credentials):
            bad(*cors)
        from hetero_infer.contracts.hosts import check_allowed_hosts

        if why := check_allowed_hosts(self.allowed_hosts):
            bad("allowed_hosts", why)
        if self.max_queue_len < 0:
            bad("max_queue_len", "must be >= 0")
        if not self.request_timeout > 0:
            bad("request_timeout", "must be > 0 seconds")
        if not self.grammar_compile_timeout > 0:
            bad("grammar_compile_timeout", "must be > 0 seconds")
        for name in ("header_timeout_s", "body_timeout_s", "keepalive_timeout_s"):
            if not getattr(self, name) > 0:
                bad(name, "must be > 0 seconds")
        if self.shutdown_grace < 0:
            bad("shutdown_grace", "must be >= 0 seconds")
        if self.max_body_bytes < 1024:
            bad("max_body_bytes", "must be at least 1024")
        if not 0 <= self.stream_interval <= 1:
            bad("stream_interval", "must be in [0, 1] seconds")
        if self.retry_after < 0:
            bad("retry_after", "must be >= 0")
        if self.log_level not in LOG_LEVELS:
            bad("log_level", f"must be one of {', '.join(LOG_LEVELS)}")
        if self.log_format not in LOG_FORMATS:
            bad("log_format", f"must be one of {', '.join(LOG_FORMATS)}")
        from hetero_infer.contracts.lora_modules import parse_lora_modules

        try:
            parse_lora_modules(self.lora_modules)
        except ValueError as exc:
            bad("lora_modules", str(exc))

    def use_engine_process(self) -> bool:
        if self.engine_process is not None:
            return self.engine_process
        from hetero_infer.cpu_quota import usable_cpus

        return usable_cpus() >= ENGINE_PROCESS_MIN_CPUS

    def api_keys(self) -> list[str]:
        """Keys from --api-key plus those in --api-key-file (one per line, # comments)."""
        keys = [k.strip() for k in self.api_key]
        if self.api_key_file:
            keys += read_key_file(self.api_key_file)
        return keys

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in fields(cls)}

    @classmethod
    def field_types(cls) -> dict[str, Any]:
        return {f.name: f.type for f in fields(cls)}


# Measured on 2 CPUs (docs/benchmarks.md, "Serving overhead"): the process is faster than the thread with a
# pure-Python engine (mock executor) and as fast with the CPU model.
ENGINE_PROCESS_MIN_CPUS = 2


def read_key_file(path: str | os.PathLike[str]) -> list[str]:
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"API key file not found: {p}")
    keys = [line.strip() for line in p.read_text().splitlines()]
    keys = [k for k in keys if k and not k.startswith("#")]
    if not keys:
        raise ValueError(f"API key file {p} holds no key")
    return keys
