"""The router's options (`hetero-infer router`): flags > HETERO_INFER_ROUTER_<OPTION> > --config FILE."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from hetero_infer.contracts import cors, hosts
from hetero_infer.contracts.options import InvalidOption

ENV_PREFIX = "HETERO_INFER_ROUTER_"
_DNS_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")  # a Kubernetes object name (DNS subdomain)
# Sizes the text-chunk memory (prompts hashed as text, before the router has the workers' tokenizer) from a pool's
# tokens: an upper bound, not a mean (English is about 4 bytes a token, other text up to 6-7). Too small, the text
# index forgets prefixes the worker still holds and sends their next requests elsewhere: each prefix ends up
# duplicated over the pools and evicts the others (issue 43: 0.71-0.76 of 0.87 on the small-pools workload as
# text, whose prompts are 6.4 bytes a token); too large, it sends a prefix to a worker that evicted it, which costs
# that one prefill and caches it there again.
TEXT_BYTES_PER_TOKEN = 8

HELP = {
    "host": "address to bind (default 127.0.0.1; 0.0.0.0 in containers)",
    "port": "port to bind (default 3000; 0 picks a free one, printed at start)",
    "worker": "a worker's base URL, e.g. http://127.0.0.1:3001 (repeatable; the environment variable takes a "
    "comma-separated list)",
    "policy": "prefix (default): the worker holding the longest cached prefix, bounded load; least-load; round-robin",
    "tokenizer": "where the tokenizer for exact prefix hashes comes from: 'workers' (default: fetched from the first "
    "ready worker's GET /v1/tokenizer/files in the background; prompt text hashed until then or when workers do not "
    "serve it), a tokenizer folder (the workers' model folder), 'default' (the default model's), or 'none' (hash "
    "chunks of the prompt text: approximate)",
    "block_size": "tokens per KV block: the workers' --block-size (default 16)",
    "hold_timeout_s": "seconds a request is held while no worker is ready, then 503 with Retry-After (default 60)",
    "retry_after_s": "Retry-After seconds on that 503 (default 5)",
    "max_attempts": "workers one request may be sent to before a byte has gone back (default 3)",
    "connect_timeout_s": "seconds to connect to a worker before trying another (default 3)",
    "first_byte_timeout_s": "seconds to wait for a worker's first byte before trying another (default 300)",
    "health_interval_s": "seconds between health checks, load scrapes and block-report polls per worker (default 1)",
    "load_factor": "prefix policy: no worker takes a request above this times the average load, beyond its "
    "slack (default 1.25)",
    "min_slack": "prefix policy: requests a worker with a free sequence slot may hold, whatever the average load, "
    "before a request for a prefix it caches is sent elsewhere (default 4)",
    "host_hit_weight": "prefix policy: what a prompt block a worker holds in its host KV tier (restored, not "
    "computed) is worth beside one on its device, 0 <= w < 1 (default 0.5; docs/router.md)",
    "kv_events": "read the KV events the workers advertise in their block reports (ZMQ; --kv-events-config on the "
    "workers): the index follows their caches as they change, block reports resync it (default on; "
    "--no-kv-events: block reports only)",
    "approx_capacity_blocks": "approximate index: blocks remembered per worker whose pool size is unknown (one that "
    "does not report; default 4096)",
    "text_chunk_bytes": "without a tokenizer: bytes of prompt text per hashed chunk (default 64)",
    "discover_service": "in a cluster: take the workers from the EndpointSlices of this Service (watched, ready "
    "endpoints only), besides any --worker",
    "namespace": "the namespace of --discover-service, --discover-inference-deployments and --scale-target (default: "
    "the pod's own, else 'default')",
    "discover_port": "the EndpointSlice port (name or number) the workers serve on (default: the one named http, "
    "else the first)",
    "discover_inference_deployments": "in a cluster: front every InferenceDeployment of --namespace (or those "
    "matching --selector), found through the API: each one's model, its workers from its worker Service's "
    "EndpointSlices, and scale from zero where its autoscaling goes to 0 replicas (the chart's cluster router)",
    "selector": "with --discover-inference-deployments: a label selector for the InferenceDeployments to front "
    "(e.g. team=search)",
    "scale_target": "in a cluster: the InferenceDeployment (in --namespace) to scale from 0 to 1 replica, through "
    "its scale subresource, as soon as a request is held while no worker is ready (scale from zero without "
    "waiting for the operator's next pass; never lowers, never above 1)",
    "api_key": "a key the router's clients must present (`Authorization: Bearer <key>`) on /v1/* (repeatable; "
    "the environment variable takes one); their requests then go to the workers with --worker-api-key instead. "
    "Without it the router checks nothing and passes each client's Authorization header to the workers",
    "shutdown_grace_s": "on SIGTERM: seconds the router still finishes what it holds and streams (default 60)",
    "worker_api_key": "the workers' --api-key, sent only on the router's own requests (block reports, "
    "GET /v1/cache/blocks; the tokenizer, GET /v1/tokenizer/files); clients' requests carry their own Authorization header",
    "model_alias": "NAME=MODEL[:WEIGHT]: requests for NAME go to MODEL (a rename); repeat NAME with several models "
    "and weights for a canary (chat=a:9 and chat=a-v2:1 send a tenth of chat's prompts to a-v2, each prompt prefix "
    "always to the same one). Repeatable; the environment variable takes a comma-separated list",
    "served_model": "a model the router holds requests for (and scales from zero, with --scale-target) even while "
    "no worker of it has been seen; without it, a model none of the known workers serves is a 404 model_not_found "
    "(repeatable)",
    "flow_control": "queue at the router what the workers cannot run at once, per (tenant, priority): the best "
    "priority first (the request's `priority`, lower first), tenants of one priority in turn, the lowest priority "
    "shed first (429 with Retry-After) when the queue is full (default off: every request goes to a worker at once)",
    "worker_slots": "flow control: requests in flight per worker (default: its max_num_seqs, from its block report; "
    "8 where it does not say)",
    "max_queued": "flow control: requests queued at the router per model beyond the workers' slots (default 64)",
    "queue_timeout_s": "flow control: seconds a request may wait in the router's queue before a 429 (default 30)",
    "tenant_header": "flow control: a request header naming the tenant, trusted (set it only behind a gateway that "
    "sets it); without it, or when absent, the tenant is the router's --api-key the client presented",
    "priority_class": "flow control: NAME=PRIORITY, a named priority class (repeat for more): a request that gives no "
    "`priority` of its own and names a class in --priority-class-header takes its priority (lower first)",
    "priority_class_header": "flow control: the request header naming a --priority-class, trusted as --tenant-header is",
    "tenant_limit": "flow control: TENANT=N, the most requests of that tenant in flight at once over every model "
    "(repeat for more; the others of that tenant wait their turn in the queue)",
    "allowed_hosts": hosts.HELP,  # the same guard as the workers' (contracts/hosts.py)
    **cors.HELP,  # answered at the router, the same as the workers' options (worker/server/cors.py)
    "log_level": "debug, info, warning or error (default info)",
}


@dataclass
class RouterOptions:
    host: str = "127.0.0.1"
    port: int = 3000
    worker: list[str] = field(default_factory=list)
    policy: Literal["prefix", "least-load", "round-robin"] = "prefix"
    tokenizer: str | None = "workers"
    block_size: int = 16
    hold_timeout_s: float = 60.0
    retry_after_s: int = 5
    max_attempts: int = 3
    connect_timeout_s: float = 3.0
    first_byte_timeout_s: float = 300.0
    health_interval_s: float = 1.0
    load_factor: float = 1.25
    min_slack: int = 4
    host_hit_weight: float = 0.5
    kv_events: bool = True
    approx_capacity_blocks: int = 4096
    text_chunk_bytes: int = 64
    discover_service: str | None = None
    namespace: str | None = None
    discover_port: str | None = None
    scale_target: str | None = None
    discover_inference_deployments: bool = False
    selector: str | None = None
    worker_api_key: str | None = field(default=None, repr=False)  # never printed
    api_key: list[str] = field(default_factory=list, repr=False)  # never printed
    shutdown_grace_s: float = 60.0
    flow_control: bool = False
    worker_slots: int | None = None
    max_queued: int = 64
    queue_timeout_s: float = 30.0
    tenant_header: str | None = None
    priority_class: list[str] = field(default_factory=list)
    priority_class_header: str | None = None
    tenant_limit: list[str] = field(default_factory=list)
    model_alias: list[str] = field(default_factory=list)
    served_model: list[str] = field(default_factory=list)
    allowed_hosts: list[str] = field(default_factory=list)
    allowed_origins: list[str] = field(default_factory=list)
    allowed_methods: list[str] = field(default_factory=lambda: ["*"])
    allowed_headers: list[str] = field(default_factory=lambda: ["*"])
    allow_credentials: bool = False
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    @property
    def text_chunks_per_block(self) -> float:
        """Text chunks (the no-tokenizer hashes) that one KV block of text stands for."""
        return self.block_size * TEXT_BYTES_PER_TOKEN / self.text_chunk_bytes

    @property
    def priority_classes(self) -> dict[str, int]:
        """--priority-class as NAME -> priority."""
        return parse_int_map(self.priority_class, "NAME=PRIORITY", minimum=None)

    @property
    def tenant_limits(self) -> dict[str, int]:
        """--tenant-limit as TENANT -> requests in flight at most."""
        return parse_int_map(self.tenant_limit, "TENANT=N", minimum=1)

    @property
    def aliases(self) -> dict[str, tuple[tuple[str, float], ...]]:
        """--model-alias as NAME -> ((MODEL, weight), ...)."""
        return parse_aliases(self.model_alias)

    def __post_init__(self) -> None:
        self.worker = [u.strip().rstrip("/") for w in self.worker for u in w.split(",") if u.strip()]
        self.model_alias = [a.strip() for v in self.model_alias for a in v.split(",") if a.strip()]
        self.served_model = [m.strip() for v in self.served_model for m in v.split(",") if m.strip()]
        try:
            parse_aliases(self.model_alias)
        except ValueError as exc:
            raise InvalidOption("model_alias", f"invalid router option model_alias={self.model_alias!r}: {exc}") from None
        for name, form, minimum in (("priority_class", "NAME=PRIORITY", None), ("tenant_limit", "TENANT=N", 1)):
            setattr(self, name, [e.strip() for v in getattr(self, name) for e in v.split(",") if e.strip()])
            try:
                parse_int_map(getattr(self, name), form, minimum)
            except ValueError as exc:
                raise InvalidOption(name, f"invalid router option {name}={getattr(self, name)!r}: {exc}") from None
        if self.priority_class and not self.priority_class_header:
            raise InvalidOption("priority_class_header", "invalid router options: --priority-class needs "
                                "--priority-class-header, the header requests name their class in")
        for name in ("block_size", "max_attempts", "approx_capacity_blocks", "text_chunk_bytes", "min_slack"):
            if getattr(self, name) < 1:
                raise InvalidOption(name, f"invalid router option {name}={getattr(self, name)!r}: must be >= 1")
        if isinstance(self.api_key, str):
            self.api_key = [self.api_key]
        if any(not isinstance(k, str) or not k.strip() for k in self.api_key):
            raise InvalidOption("api_key", "invalid router option api_key=***: must be non-empty strings")
        if self.shutdown_grace_s < 0:
            raise InvalidOption("shutdown_grace_s", f"invalid router option shutdown_grace_s={self.shutdown_grace_s!r}: "
                                "must be >= 0")
        if self.worker_slots is not None and self.worker_slots < 1:
            raise InvalidOption("worker_slots", f"invalid router option worker_slots={self.worker_slots!r}: must be >= 1")
        if self.max_queued < 0:
            raise InvalidOption("max_queued", f"invalid router option max_queued={self.max_queued!r}: must be >= 0")
        for name in ("hold_timeout_s", "connect_timeout_s", "first_byte_timeout_s", "health_interval_s",
                     "queue_timeout_s"):
            if not getattr(self, name) > 0:
                raise InvalidOption(name, f"invalid router option {name}={getattr(self, name)!r}: must be > 0")
        if not 0 <= self.host_hit_weight < 1:
            raise InvalidOption("host_hit_weight", f"invalid router option host_hit_weight={self.host_hit_weight!r}: "
                                "must be >= 0 and < 1 (a block on the device is worth 1)")
        if self.load_factor < 1.0:
            raise InvalidOption("load_factor", f"invalid router option load_factor={self.load_factor!r}: must be >= 1")
        if bad := cors.check_options(self.allowed_origins, self.allowed_methods, self.allowed_headers,
                                     self.allow_credentials):
            name, why = bad
            raise InvalidOption(name, f"invalid router option {name}={getattr(self, name)!r}: {why}")
        if why := hosts.check_allowed_hosts(self.allowed_hosts):
            raise InvalidOption("allowed_hosts", f"invalid router option allowed_hosts={self.allowed_hosts!r}: {why}")
        if self.scale_target is not None and not _DNS_NAME.fullmatch(self.scale_target):
            raise InvalidOption("scale_target", f"invalid router option scale_target={self.scale_target!r}: must be "
                                "an InferenceDeployment's name (lower-case letters, digits, '-' and '.')")
        for url in self.worker:
            if not url.startswith(("http://", "https://")):
                raise InvalidOption("worker", f"invalid router option worker={url!r}: must be an http(s) URL")


def parse_int_map(entries: list[str], form: str, minimum: int | None) -> dict[str, int]:
    """`KEY=INT` entries as KEY -> int; ValueError naming the malformed one (or a repeated key)."""
    out: dict[str, int] = {}
    for entry in entries:
        key, sep, value = entry.partition("=")
        key = key.strip()
        try:
            number = int(value.strip())
        except ValueError:
            number = None
        if not sep or not key or number is None or (minimum is not None and number < minimum):
            bound = f", N >= {minimum}" if minimum is not None else ""
            raise ValueError(f"{entry!r} is not {form} (an integer{bound})")
        if key in out:
            raise ValueError(f"{key!r} is given twice")
        out[key] = number
    return out


def parse_aliases(entries: list[str]) -> dict[str, tuple[tuple[str, float], ...]]:
    """`NAME=MODEL[:WEIGHT]` entries as NAME -> ((MODEL, weight), ...); ValueError on a malformed one. A WEIGHT is
    the text after the last ':' when it is a number (so model names may contain ':'); default 1."""
    out: dict[str, list[tuple[str, float]]] = {}
    for entry in entries:
        name, sep, target = entry.partition("=")
        name, target = name.strip(), target.strip()
        if not sep or not name or not target:
            raise ValueError(f"{entry!r} is not NAME=MODEL[:WEIGHT]")
        model, weight = target, 1.0
        head, colon, tail = target.rpartition(":")
        if colon:
            try:
                weight = float(tail)
            except ValueError:
                pass
            else:
                model = head.strip()
        if not model or not weight > 0 or weight == float("inf"):
            raise ValueError(f"{entry!r}: the model must be named and its weight a positive number")
        if any(m == model for m, _ in out.get(name, ())):
            raise ValueError(f"{entry!r}: {model!r} is listed twice for {name!r}")
        out.setdefault(name, []).append((model, weight))
    return {name: tuple(targets) for name, targets in out.items()}
