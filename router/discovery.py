"""Workers from a Service's EndpointSlices (`--discover-service NAME --namespace NS`), watched.

The EndpointSlice controller keeps one or more slices per Service, labelled
`kubernetes.io/service-name=<Service>`; each endpoint carries the pod's addresses and its readiness
(the pod's readiness probe). The router lists them, then watches from the list's resourceVersion;
after every event the union of the *ready* endpoints' URLs is the discovered set (`endpoint_urls`, pure).
A watch that ends is resumed from the last resourceVersion seen; a 410 Gone (history compacted) or a
failure starts over with a fresh list, after a back-off.

`Membership` applies the set to the `WorkerPool`: a new endpoint gets a poll loop (the pool's own
readiness, load and block-report check, so it joins once its /readyz answers); an endpoint that left
the set (not ready, terminating, or gone) leaves the pool at once. Workers given with --worker are never
touched. A worker that left keeps its (not ready) entry in the pool, so requests still open to it can
report their failure to the pool; it is polled again if it comes back.

Credentials: kube_api.py (the service account in a pod, else the kubeconfig). The router needs get/list/watch
on endpointslices in its namespace (the operator's Role grants that, and with scale from zero the scale of its
one InferenceDeployment: scale.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import quote

import aiohttp

from hetero_infer.router.kube_api import ApiAccess, api_access, in_cluster_namespace
from hetero_infer.router.pool import Worker, WorkerPool

logger = logging.getLogger("hetero_infer.router.discovery")

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
DEFAULT_PORT_NAME = "http"
WATCH_TIMEOUT_SECONDS = 300
MAX_EVENT_BYTES = 8 * 1024 * 1024  # one watch event is one JSON line; a slice holds up to 1000 endpoints


# -- EndpointSlices -> worker URLs (pure) ----------------------------------------------------------------

def _slice_port(eps: Mapping[str, Any], port: str | None) -> int | None:
    """The slice's port for the workers: the one named (or numbered) `port`, else `http`, else the first."""
    ports = [p for p in eps.get("ports") or [] if isinstance(p.get("port"), int)]
    if port is not None:
        chosen = [p for p in ports if p.get("name") == port or str(p["port"]) == port]
    else:
        chosen = [p for p in ports if p.get("name") == DEFAULT_PORT_NAME] or ports[:1]
    return int(chosen[0]["port"]) if chosen else None


def endpoint_urls(eps: Mapping[str, Any], port: str | None = None) -> set[str]:
    """The base URLs of one EndpointSlice's ready endpoints.

    Ready as the API defines it: `conditions.ready` true, or absent (unknown is to be read as ready);
    a terminating pod's endpoint has ready false. Each address of an endpoint is the same pod, so only
    its first is used.
    """
    number = _slice_port(eps, port)
    if number is None:
        return set()
    out = set()
    for endpoint in eps.get("endpoints") or []:
        if (endpoint.get("conditions") or {}).get("ready") is False:
            continue
        addresses = endpoint.get("addresses") or []
        if not addresses:
            continue
        host = addresses[0]
        if eps.get("addressType") == "IPv6" or ":" in host:
            host = f"[{host}]"
        out.add(f"http://{host}:{number}")
    return out


def ready_urls(slices: Iterable[Mapping[str, Any]], port: str | None = None) -> set[str]:
    """The union over a Service's slices (an endpoint may sit in two slices while it moves)."""
    return set().union(*(endpoint_urls(s, port) for s in slices))


# -- the pool's members -----------------------------------------------------------------------------------

class Membership:
    """Applies a discovered set of URLs to the pool (see the module docstring)."""

    def __init__(self, pool: WorkerPool) -> None:
        self.pool = pool
        self.static = set(pool.workers)  # --worker URLs: polled by the pool itself, never removed here
        self.polls: dict[str, asyncio.Task[None]] = {}

    @property
    def urls(self) -> set[str]:
        return set(self.polls)

    def apply(self, urls: set[str]) -> None:
        for url in sorted(urls - self.static - set(self.polls)):
            worker = self.pool.workers.setdefault(url, Worker(url))
            logger.info("discovered worker %s", url)
            self.polls[url] = asyncio.create_task(self._poll(worker))
        for url in sorted(set(self.polls) - urls):
            self.polls.pop(url).cancel()
            worker = self.pool.workers[url]
            if worker.ready:
                self.pool.mark_down(url, "no longer a ready endpoint of the Service")

    async def _poll(self, worker: Worker) -> None:
        while True:
            try:
                await self.pool.check(worker)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a poll must never end the loop
                logger.debug("poll of %s failed: %s", worker.url, exc)
            await self.pool.pause(worker)

    async def forget(self) -> None:
        """Stop polling every discovered worker and remove them from the pool (their Service is gone for good)."""
        urls = set(self.polls)
        await self.stop()
        self.polls.clear()
        for url in sorted(urls):
            self.pool.mark_down(url, "its InferenceDeployment is gone")
            self.pool.remove(url)

    async def stop(self) -> None:
        tasks = list(self.polls.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# -- the API server ---------------------------------------------------------------------------------------

class WatchGone(Exception):
    """The resourceVersion is too old (410): list again."""


class ListWatcher:
    """List + watch of the objects at `path` matching `selector` (a label selector), kept in `objects` by name:
    `changed()` runs after the first list and after every event. A watch that ends is resumed from the last
    resourceVersion; a 410 Gone lists again at once, any other failure after a back-off."""

    def __init__(self, access: ApiAccess, path: str, selector: str | None, what: str,
                 backoff_s: float = 1.0) -> None:
        self.access = access
        self.path = path
        self.selector = selector
        self.what = what  # for the log
        self.backoff_s = backoff_s
        self.objects: dict[str, Mapping[str, Any]] = {}
        self.synced = asyncio.Event()  # set after the first successful list

    def wanted(self, obj: Mapping[str, Any]) -> bool:
        """Whether a watched object is one of ours (a server that ignores the selector sends every one)."""
        return True

    def changed(self) -> None:
        raise NotImplementedError

    def _params(self) -> dict[str, str]:
        return {"labelSelector": self.selector} if self.selector else {}

    async def run(self) -> None:
        async with aiohttp.ClientSession(read_bufsize=MAX_EVENT_BYTES) as session:
            version: str | None = None
            while True:
                try:
                    if version is None:
                        version = await self._list(session)
                    version = await self._watch(session, version)
                except asyncio.CancelledError:
                    raise
                except WatchGone:
                    version = None
                except Exception as exc:  # the API server restarted, a network blip, a refused token...
                    logger.warning("watching %s failed (%s: %s); listing again in %gs", self.what,
                                   exc.__class__.__name__, exc, self.backoff_s)
                    version = None
                    await asyncio.sleep(self.backoff_s)

    async def _list(self, session: aiohttp.ClientSession) -> str:
        async with session.get(self.access.host + self.path, params=self._params(),
                               headers=self.access.headers(), ssl=self.access.ssl,
                               timeout=aiohttp.ClientTimeout(total=30)) as r:
            if r.status != 200:
                raise RuntimeError(f"list answered {r.status}: {(await r.text())[:200]}")
            data = await r.json(content_type=None)
        self.objects = {item["metadata"]["name"]: item for item in data.get("items") or [] if self.wanted(item)}
        self.changed()
        self.synced.set()
        return str((data.get("metadata") or {}).get("resourceVersion") or "")

    async def _watch(self, session: aiohttp.ClientSession, version: str) -> str:
        """Follow events until the server ends the watch; returns the last resourceVersion seen."""
        params = {**self._params(), "watch": "true", "allowWatchBookmarks": "true",
                  "timeoutSeconds": str(WATCH_TIMEOUT_SECONDS)}
        if version:
            params["resourceVersion"] = version
        timeout = aiohttp.ClientTimeout(total=None, connect=30, sock_read=WATCH_TIMEOUT_SECONDS + 30)
        async with session.get(self.access.host + self.path, params=params, headers=self.access.headers(),
                               ssl=self.access.ssl, timeout=timeout) as r:
            if r.status == 410:
                raise WatchGone()
            if r.status != 200:
                raise RuntimeError(f"watch answered {r.status}: {(await r.text())[:200]}")
            async for line in r.content:
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise WatchGone()
                    raise RuntimeError(f"watch error: {obj.get('message')}")
                meta = obj.get("metadata") or {}
                version = str(meta.get("resourceVersion") or version)
                if kind == "BOOKMARK" or not self.wanted(obj):
                    continue
                if kind == "DELETED":
                    self.objects.pop(meta.get("name"), None)
                elif kind in ("ADDED", "MODIFIED"):
                    self.objects[meta["name"]] = obj
                self.changed()
        return version


class EndpointSliceWatcher(ListWatcher):
    """One Service's EndpointSlices, calling `on_change(urls)` whenever the ready set changes."""

    def __init__(self, access: ApiAccess, namespace: str, service: str, on_change: Callable[[set[str]], None],
                 port: str | None = None, backoff_s: float = 1.0) -> None:
        super().__init__(access, f"/apis/discovery.k8s.io/v1/namespaces/{quote(namespace, safe='')}/endpointslices",
                         f"{SERVICE_NAME_LABEL}={service}", f"the EndpointSlices of {service}", backoff_s)
        self.service = service
        self.port = port
        self.on_change = on_change
        self.current: set[str] | None = None

    @property
    def slices(self) -> dict[str, Mapping[str, Any]]:
        return self.objects

    def wanted(self, obj: Mapping[str, Any]) -> bool:
        return ((obj.get("metadata") or {}).get("labels") or {}).get(SERVICE_NAME_LABEL) == self.service

    def changed(self) -> None:
        urls = ready_urls(self.objects.values(), self.port)
        if urls != self.current:
            logger.info("service %s: %d ready endpoint(s)", self.service, len(urls))
            self.current = urls
            self.on_change(urls)


class Discovery:
    """`--discover-service`: the watch task and the pool membership it drives."""

    def __init__(self, pool: WorkerPool, service: str, namespace: str | None = None, port: str | None = None,
                 access: ApiAccess | None = None) -> None:
        self.membership = Membership(pool)
        self.namespace = namespace or in_cluster_namespace() or "default"
        self.service = service
        self.port = port
        self.access = access
        self.watcher: EndpointSliceWatcher | None = None
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        access = self.access or api_access()
        self.watcher = EndpointSliceWatcher(access, self.namespace, self.service, self.membership.apply, self.port)
        logger.info("discovering workers from the EndpointSlices of %s/%s", self.namespace, self.service)
        self.task = asyncio.create_task(self.watcher.run())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        await self.membership.stop()
