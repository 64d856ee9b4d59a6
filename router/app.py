"""The router's HTTP side: OpenAI endpoints proxied to a chosen worker, plus /healthz, /readyz and /metrics.

One request: read the body, hash its prompt's blocks, choose a worker by the policy, send it there. Until the
worker's first body byte has arrived nothing has gone back to the client, so a refusal (cannot connect, 429,
503, a time-out, a connection lost before the first byte) is retried on another worker, up to `max_attempts`.
From the first byte on the response is the worker's, streamed through untouched; an upstream failure then ends
the client's connection (never a second send). With no ready worker the request is held until one is ready or
`hold_timeout_s` passes (then 503 with Retry-After). A client that disconnects cancels its handler, which closes
the upstream connection, and the worker aborts the request.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from hetero_infer.contracts import cors, hosts
from hetero_infer.contracts.auth import api_key_middleware
from hetero_infer.contracts.errors import APIError
from hetero_infer.contracts.router_options import RouterOptions
from hetero_infer.router import policies
from hetero_infer.router.flow import FlowControl, Shed, priority_of, tenant_of
from hetero_infer.router.index import PrefixIndex
from hetero_infer.router.metrics import RouterMetrics
from hetero_infer.router.models import model_not_found, pick_target, union_cards
from hetero_infer.router.pool import Worker, WorkerPool
from hetero_infer.router.prompt import request_hashes
from hetero_infer.router.scale import ScaleFromZero
from hetero_infer.router.tokenizer_source import MODES, WorkersTokenizer, load_tokenizer, source_of

logger = logging.getLogger("hetero_infer.router")

# Not forwarded either way: hop-by-hop, or recomputed by aiohttp. Origin: CORS is answered here (the router's
# --allowed-origins); a worker seeing the browser's Origin would refuse what the router allowed.
_DROP_REQUEST = {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "te", "upgrade",
                 "origin"}
_DROP_RESPONSE = {"connection", "keep-alive", "transfer-encoding", "content-length", "server", "date"}
_REFUSED = (429, 503)
DEFAULT_WORKER_SLOTS = 8  # flow control: a worker that does not report its max_num_seqs
_INLINE_TOKENIZE_BYTES = 1024  # request bodies up to this size are tokenized on the event loop


class Retry(Exception):
    """This attempt ended before the first byte: try another worker."""

    def __init__(self, reason: str, response: tuple[int, dict[str, str], bytes] | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.response = response


def _error(status: int, message: str, kind: str, headers: dict[str, str] | None = None) -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
    return web.json_response(body, status=status, headers=headers)


class Router:
    def __init__(self, options: RouterOptions, tokenizer: Any = None) -> None:
        self.options = options
        self.tokenizer = tokenizer
        self.metrics = RouterMetrics()
        self.index = PrefixIndex(options.approx_capacity_blocks, options.text_chunks_per_block)
        self.pool = WorkerPool(options.worker, self.index, options.block_size, options.health_interval_s,
                               on_change=self._pool_changed, api_key=options.worker_api_key,
                               kv_events=options.kv_events)
        self.aliases = options.aliases
        self._rr: dict[str | None, int] = {}
        self.session: aiohttp.ClientSession | None = None
        # --tokenizer workers: each model's, fetched from its workers (None: for workers that do not list models)
        self.tokenizers: dict[str | None, Any] = {}
        self._tokenizer_tasks: dict[str | None, asyncio.Task] = {}
        self.scaler: ScaleFromZero | None = None  # --scale-target (cli.add_scale_from_zero): any model's
        self.scalers: dict[str, ScaleFromZero] = {}  # per model (the cluster router: one per InferenceDeployment)
        self.declared: dict[str, str] = {}  # model -> the InferenceDeployment serving it (the cluster router)
        self.adapters: dict[str, str] = {}  # LoRA adapter -> its base model (the workers' /v1/models)
        self.flow: FlowControl | None = None
        if options.flow_control:
            self.flow = FlowControl(self.slots, options.max_queued, options.queue_timeout_s,
                                    lambda priority, reason: self.metrics.shed.labels(str(priority), reason).inc(),
                                    tenant_limits=options.tenant_limits)
        self._set_tokenizer_mode()

    def slots(self, model: str | None) -> int:
        """Flow control: requests the ready workers of `model` run at once."""
        return sum(self.options.worker_slots or w.max_num_seqs or DEFAULT_WORKER_SLOTS
                   for w in self.pool.ready(model=model))

    # -- models and their tokenizers -----------------------------------------------------------
    def _set_tokenizer_mode(self) -> None:
        if self.tokenizer is not None:
            mode = "folder"
        else:
            served = set().union(*(w.models for w in self.pool.ready()))
            mode = ("workers" if self.tokenizers and all(self.tokenizer_for(m) is not None for m in served)
                    else "text")
        for m in MODES:
            self.metrics.tokenizer_mode.labels(m).set(1 if m == mode else 0)

    def tokenizer_for(self, model: str | None) -> Any:
        """The tokenizer that hashes a request for `model`: --tokenizer's, else its workers'; None: text hashes."""
        if self.tokenizer is not None:
            return self.tokenizer
        model = self.adapters.get(model, model) if model is not None else None  # an adapter's is its base's
        if model is None and len(self.tokenizers) == 1:
            return next(iter(self.tokenizers.values()))
        return self.tokenizers.get(model) or self.tokenizers.get(None)

    def _pool_changed(self) -> None:
        self.metrics.workers_ready.set(len(self.pool.ready()))
        self.adapters = self.pool.adapter_bases()
        if self.session is not None and self.tokenizer is None and source_of(self.options.tokenizer) == "workers":
            for worker in self.pool.ready():
                # A worker that does not list its models (another server) may still serve its tokenizer: the
                # tokenizer of unknown models (None), fetched from any worker.
                wanted: set[str | None] = ({self.adapters.get(m, m) for m in worker.models}
                                           if worker.cards is not None else {None})
                for model in wanted - set(self._tokenizer_tasks):
                    fetcher = WorkersTokenizer(self.pool, functools.partial(self._fetched, model),
                                               self.options.worker_api_key, model=model)
                    self._tokenizer_tasks[model] = asyncio.create_task(fetcher.run(self.session))
        self._set_tokenizer_mode()
        if self.flow is not None:
            self.flow.pump_all()

    def _fetched(self, model: str | None, tokenizer: Any, url: str) -> None:
        self.tokenizers[model] = tokenizer
        self._set_tokenizer_mode()

    def served_models(self) -> set[str]:
        """What the router answers to: the models of its workers (ready or not), its aliases, --served-model and
        the models it can scale from zero."""
        return set().union(*(w.models for w in self.pool.workers.values())) | set(self.aliases) | self.declared_models()

    def declared_models(self) -> set[str]:
        """Models served whether or not a worker of them has been seen: --served-model, scale targets, the
        InferenceDeployments the cluster router fronts."""
        return set(self.options.served_model) | set(self.scalers) | set(self.declared)

    def unknown_model(self, model: str | None) -> bool:
        """A model no worker serves, once every worker has said what it serves (before that, or with no worker at
        all, a request is held as for a known model: a worker that appears may serve it)."""
        if model is None or model in self.aliases or model in self.declared_models():
            return False
        known = self.pool.known_models()
        return bool(self.pool.workers) and known is not None and model not in known

    def resolve(self, model: str | None, hashes: list[int]) -> str | None:
        """The model a request for `model` goes to: an alias's target (chosen by its prompt's first block), or
        itself."""
        targets = self.aliases.get(model) if model is not None else None
        if not targets:
            return model
        return pick_target(targets, hashes[0] if hashes else None)

    # -- choosing -----------------------------------------------------------------------------
    def choose(self, candidates: list[Worker], hashes: list[int], policy: str,
               exact: bool = True, model: str | None = None) -> policies.Decision:
        """Among `candidates` (the ready workers of `model`): the policies see only them, so load bounds and prefix
        affinity are per model; a LoRA adapter's request prefers the workers using it, then those with a free
        adapter slot (policies.lora_rank)."""
        states = [w.state() for w in candidates]
        adapter = model if model in self.adapters else None
        if policy == "round-robin":
            decision = policies.round_robin(states, self._rr.get(model, 0))
            self._rr[model] = self._rr.get(model, 0) + 1
        elif policy == "least-load":
            decision = policies.least_load(states, adapter=adapter)
        else:
            matched = self.index.match(hashes, [s.url for s in states], exact)
            eviction = {s.url: self.index.eviction_cost(s.url, len(hashes), exact) for s in states}
            decision = policies.prefix(states, matched, self.options.load_factor, affinity=hashes[0] if hashes else None,
                                       min_slack=self.options.min_slack, eviction=eviction,
                                       host_matched=self.index.host_match(hashes, matched) if exact else None,
                                       host_weight=self.options.host_hit_weight, adapter=adapter)
        assert decision is not None
        if adapter is not None:
            chosen = next(s for s in states if s.url == decision.url)
            self.metrics.lora_routed.labels(policies.LORA_RANK_NAMES[policies.lora_rank(chosen, adapter)]).inc()
        return decision

    # -- proxying -----------------------------------------------------------------------------
    async def proxy(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        payload: Any = None
        if body:
            try:
                payload = json.loads(body)
            except ValueError:
                payload = None
        hashes: list[int] = []
        exact = True
        policy = self.options.policy
        asked = payload.get("model") if isinstance(payload, dict) and isinstance(payload.get("model"), str) else None
        if self.unknown_model(asked):
            assert asked is not None
            response = model_not_found(asked, self.served_models()).response()
            self.metrics.responses.labels(str(response.status)).inc()
            return response
        model = asked
        if isinstance(payload, dict) and request.method == "POST":
            if policy == "prefix" or asked in self.aliases:
                hashes, exact = await self._hash(payload, body, asked)
            model = self.resolve(asked, hashes)
            if model != asked:
                payload["model"] = model
                body = json.dumps(payload).encode()
                if policy == "prefix" and model in self.adapters:  # an alias of an adapter: the adapter's blocks
                    hashes, exact = await self._hash(payload, body, model)
        elif policy == "prefix":
            policy = "least-load"
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROP_REQUEST}
        if self.options.api_key:  # the client showed the router's key: the workers get theirs, never that one
            headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
            if self.options.worker_api_key:
                headers["Authorization"] = f"Bearer {self.options.worker_api_key}"
        if self.flow is not None and request.method == "POST" and self.pool.ready(model=model):
            response = await self._flow(request, payload, body, headers, hashes, policy, exact, model)
        else:  # no ready worker of the model: held as without flow control (scale from zero)
            response = await self._route(request, body, headers, hashes, policy, exact, model)
        self.metrics.responses.labels(str(response.status)).inc()
        return response

    async def _hash(self, payload: dict, body: bytes, model: str | None) -> tuple[list[int], bool]:
        """The block hashes of a request's prompt for `model`. An alias's target is chosen by the prompt's first
        block: hashed with the alias's first target's tokenizer (a canary serves the same tokenizer). A LoRA
        adapter's blocks chain from the adapter's name, as the workers' prefix caches key them."""
        target = self.aliases[model][0][0] if model in self.aliases else model
        tokenizer = self.tokenizer_for(target)
        args = (payload, tokenizer, self.options.block_size, self.options.text_chunk_bytes, body,
                model if model in self.adapters else None)
        # Hashing ids or text is cheap, tokenizing is not: a thread hop only for the tokenizer's long prompts.
        if tokenizer is None or len(body) <= _INLINE_TOKENIZE_BYTES:
            return request_hashes(*args)
        return await asyncio.get_running_loop().run_in_executor(None, request_hashes, *args)

    async def _flow(self, request: web.Request, payload: Any, body: bytes, headers: dict[str, str],
                    hashes: list[int], policy: str, exact: bool, model: str | None) -> web.StreamResponse:
        """Through the router's queue (flow.py): a slot first, or a 429."""
        assert self.flow is not None
        tenant = tenant_of(request.headers, self.options.tenant_header, bool(self.options.api_key))
        header = self.options.priority_class_header
        try:
            priority = priority_of(payload, request.headers.get(header, "").strip() if header else None,
                                   self.options.priority_classes)
        except ValueError as exc:
            return _error(400, str(exc), "invalid_request_error")
        try:
            await self.flow.acquire(model, tenant, priority)
        except Shed as shed:
            return _error(429, f"the router is saturated ({shed.reason}); retry later", "rate_limit_exceeded",
                          {"Retry-After": str(self.options.retry_after_s)})
        try:
            return await self._route(request, body, headers, hashes, policy, exact, model)
        finally:
            self.flow.release(model, tenant)

    async def _route(self, request: web.Request, body: bytes, headers: dict[str, str], hashes: list[int],
                     policy: str, exact: bool = True, model: str | None = None) -> web.StreamResponse:
        tried: set[str] = set()
        refusal: tuple[int, dict[str, str], bytes] | None = None
        deadline = time.monotonic() + self.options.hold_timeout_s
        for _ in range(self.options.max_attempts):
            candidates = self.pool.ready(tried, model)
            if not candidates:
                if tried and self.pool.ready(model=model):
                    break  # every ready worker of the model has refused this request
                candidates = await self._hold(tried, deadline, model)
                if not candidates:
                    if self.unknown_model(model):  # the workers that came up serve other models
                        assert model is not None
                        return model_not_found(model, self.served_models()).response()
                    break
            decision = self.choose(candidates, hashes, policy, exact, model)
            if logger.isEnabledFor(logging.DEBUG):  # the decisions of a run, to replay one
                logger.debug("route %s exact=%s first=%x blocks=%d matched=%d loads=%s", decision.url, exact,
                             hashes[0] if hashes else 0, len(hashes), decision.matched_blocks,
                             {w.url[-5:]: w.state().load for w in candidates})
            worker = self.pool.workers[decision.url]
            tried.add(worker.url)
            route = None
            if policy == "prefix":
                self.metrics.prefix_query_tokens.inc(len(hashes) * self.options.block_size)
                self.metrics.prefix_matched_tokens.labels(worker.url).inc(
                    decision.matched_blocks * self.options.block_size)
                route = self.index.record_route(worker.url, hashes, exact)
            try:
                return await self._attempt(request, worker, body, headers, policy, model)
            except Retry as retry:
                self.metrics.retries.labels(worker.url, retry.reason).inc()
                refusal = retry.response or refusal
                logger.info("retrying %s elsewhere: %s from %s", request.path, retry.reason, worker.url)
            finally:
                if route is not None:
                    self.index.ended(route)
        if refusal is not None:
            status, resp_headers, data = refusal
            return web.Response(status=status, body=data, headers=resp_headers)
        if not self.pool.ready(model=model):
            what = f"no worker of `{model}` is ready" if model is not None else "no worker is ready"
            return _error(503, f"{what}; try again later", "service_unavailable",
                          {"Retry-After": str(self.options.retry_after_s)})
        return _error(502, "no worker could take the request", "bad_gateway",
                      {"Retry-After": str(self.options.retry_after_s)})

    async def _hold(self, tried: set[str], deadline: float, model: str | None = None) -> list[Worker]:
        # Only reached with no ready worker of the model (_route): with a scale target for it, ask for one at once.
        self.metrics.held.inc()
        self.metrics.held_total.inc()
        scaler = self.scalers.get(model, self.scaler) if model is not None else self.scaler
        if scaler is not None:
            scaler.held_started()
        start = time.monotonic()
        try:
            return await self.pool.wait_ready(tried, deadline, model, give_up=lambda: self.unknown_model(model))
        finally:
            if scaler is not None:
                scaler.held_ended()
            self.metrics.held.dec()
            self.metrics.hold_seconds.observe(time.monotonic() - start)

    async def _attempt(self, request: web.Request, worker: Worker, body: bytes, headers: dict[str, str],
                       policy: str, model: str | None = None) -> web.StreamResponse:
        assert self.session is not None
        opts = self.options
        self.metrics.routed.labels(worker.url, policy).inc()
        worker.in_flight += 1
        adapter = model if model in self.adapters else None
        if adapter is not None:
            worker.sent_adapters[adapter] += 1
        self.metrics.in_flight.labels(worker.url).inc()
        sent = time.monotonic()
        upstream: aiohttp.ClientResponse | None = None
        try:
            try:
                upstream = await asyncio.wait_for(
                    self.session.request(request.method, worker.url + request.path_qs, data=body or None,
                                         headers=headers,
                                         timeout=aiohttp.ClientTimeout(total=None, sock_connect=opts.connect_timeout_s)),
                    opts.first_byte_timeout_s)
                if upstream.status in _REFUSED:
                    data = await upstream.read()
                    keep = {k: v for k, v in upstream.headers.items() if k.lower() not in _DROP_RESPONSE}
                    raise Retry(f"status {upstream.status}", (upstream.status, keep, data))
                first = await asyncio.wait_for(upstream.content.readany(), opts.first_byte_timeout_s)
            except asyncio.TimeoutError:
                raise Retry("timeout") from None
            except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError) as exc:
                self.pool.mark_down(worker.url, f"request failed: {exc.__class__.__name__}")
                raise Retry("connect") from None
            except (aiohttp.ClientError, OSError) as exc:
                raise Retry(exc.__class__.__name__) from None
            self.metrics.ttft.labels(worker.url).observe(time.monotonic() - sent)
            # From here on the response is this worker's: no other attempt.
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for k, v in upstream.headers.items():
                if k.lower() not in _DROP_RESPONSE:
                    response.headers.add(k, v)
            if upstream.content_length is not None and "content-encoding" not in upstream.headers:
                response.content_length = upstream.content_length
            await response.prepare(request)
            chunk = first
            try:
                while chunk:
                    await response.write(chunk)
                    chunk = await upstream.content.readany()
            except (aiohttp.ClientError, OSError) as exc:
                # The stream broke after bytes went back: end the client's connection without a clean end of the
                # response, so the client sees a truncated answer rather than a short one.
                logger.warning("stream from %s broke: %s", worker.url, exc.__class__.__name__)
                if request.transport is not None:
                    request.transport.abort()
                return response
            await response.write_eof()
            return response
        finally:
            worker.in_flight -= 1
            if adapter is not None:
                worker.sent_adapters[adapter] -= 1
                if not worker.sent_adapters[adapter]:
                    del worker.sent_adapters[adapter]
            self.metrics.in_flight.labels(worker.url).dec()
            if upstream is not None:
                upstream.close()  # a response not read to the end closes its connection: the worker aborts

    # -- plain endpoints ----------------------------------------------------------------------
    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def list_models(self, request: web.Request) -> web.Response:
        """The union of the workers' models (ready or not: a model scaled to zero is still served, held), and the
        aliases and models declared to the router. Before any worker has said what it serves (a router just
        started), held like a request until one is ready."""
        if self.pool.workers and all(w.cards is None for w in self.pool.workers.values()):
            await self.pool.wait_ready((), time.monotonic() + self.options.hold_timeout_s)
        return web.json_response({"object": "list", "data": self._cards()})

    def _cards(self) -> list[dict]:
        return union_cards((w.cards or () for w in self.pool.workers.values()),
                           [*self.aliases, *sorted(self.declared_models())])

    async def get_model(self, request: web.Request) -> web.Response:
        name = request.match_info["model"]
        for card in self._cards():
            if card["id"] == name:
                return web.json_response(card)
        return model_not_found(name, self.served_models()).response()

    async def readyz(self, request: web.Request) -> web.Response:
        # Ready with no worker too: requests are held, which is what scale-from-zero needs.
        return web.json_response({"status": "ready", "workers_ready": len(self.pool.ready()),
                                  "workers": len(self.pool.workers)})

    async def metrics_endpoint(self, request: web.Request) -> web.Response:
        for url, worker in self.pool.workers.items():
            self.metrics.index_blocks.labels(url).set(self.index.count(url))
            self.metrics.pending_blocks.labels(url).set(len(self.index.pending(url)))
            self.metrics.reports_blocks.labels(url).set(1 if worker.reports_blocks else 0)
            self.metrics.host_blocks.labels(url).set(len(self.index.host_blocks(url)))
            feed = self.pool.feeds.get(url)
            self.metrics.kv_events_live.labels(url).set(1 if feed is not None and feed.live else 0)
        if self.flow is not None:
            queued = self.flow.queued()
            self.metrics.queued.clear()
            for priority, n in queued.items():
                self.metrics.queued.labels(str(priority)).set(n)
        data = generate_latest(self.metrics.registry)
        return web.Response(body=data, headers={"Content-Type": CONTENT_TYPE_LATEST})

    # -- life cycle ---------------------------------------------------------------------------
    async def on_startup(self, app: web.Application) -> None:
        self.session = aiohttp.ClientSession(auto_decompress=False,
                                             connector=aiohttp.TCPConnector(limit=0, force_close=False))
        await self.pool.start(self.session)
        if self.tokenizer is None and source_of(self.options.tokenizer) == "workers":
            logger.info("tokenizer: the workers' (GET /v1/tokenizer/files from the first ready worker of each model, "
                        "loaded in the background); prompt text hashed until then")

    async def on_cleanup(self, app: web.Application) -> None:
        tasks = list(self._tokenizer_tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.pool.stop()
        if self.session is not None:
            await self.session.close()


@web.middleware
async def api_error_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    """The CORS middleware's refusals (APIError) as OpenAI-shaped error responses."""
    try:
        return await handler(request)
    except APIError as exc:
        return exc.response()


def create_app(router: Router) -> web.Application:
    opts = router.options
    policy = cors.CorsPolicy.from_options(opts.allowed_origins, opts.allowed_methods, opts.allowed_headers,
                                          opts.allow_credentials)
    host_policy = hosts.HostPolicy.from_options(opts.allowed_hosts, opts.host, bool(opts.api_key))
    app = web.Application(client_max_size=64 * 1024 * 1024,
                          middlewares=[api_error_middleware, hosts.host_middleware(host_policy),
                                       cors.cors_middleware(policy), api_key_middleware(opts.api_key, ("/v1/",))])
    cors.install(app, policy)
    app.router.add_get("/healthz", router.healthz)
    app.router.add_get("/readyz", router.readyz)
    app.router.add_get("/metrics", router.metrics_endpoint)
    app.router.add_get("/v1/models", router.list_models)
    app.router.add_get("/v1/models/{model:.+}", router.get_model)  # served names may contain "/"
    app.router.add_route("*", "/v1/{tail:.*}", router.proxy)
    app.on_startup.append(router.on_startup)
    app.on_cleanup.append(router.on_cleanup)
    return app


def make_runner(app: web.Application, shutdown_grace_s: float = 60.0) -> web.AppRunner:
    # handler_cancellation: a client that disconnects cancels its handler, which closes the upstream request.
    # shutdown_timeout: on cleanup (SIGTERM) requests in flight and held still get this long to finish.
    return web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=shutdown_grace_s)


def build(options: RouterOptions) -> tuple[Router, web.Application]:
    source = source_of(options.tokenizer)
    tokenizer = load_tokenizer(options.tokenizer) if source == "folder" else None
    if source == "folder" and tokenizer is not None:
        logger.info("tokenizer: exact prefix hashes with %s", options.tokenizer)
    elif source != "workers":
        logger.info("tokenizer: none; prompts are hashed as text chunks (approximate prefix index)")
    router = Router(options, tokenizer)
    return router, create_app(router)
