"""The workers behind the router: readiness, load and block reports, polled per worker; waiting for a ready one.

A worker joins the pool when its /readyz answers 200 and leaves it at once when a request to it cannot connect
(`mark_down`) or /readyz fails; its index entry goes with it (a restarted worker starts with an empty cache).
Load comes from its /metrics (running, waiting, KV usage); its cached blocks, pool size and `max_num_seqs` from
`GET /v1/cache/blocks` when it serves that (see docs/router.md), else the index keeps an approximate entry. A
worker whose report advertises KV events (`kv_events`) is subscribed to (router/kv_events.py): its blocks then come
from its events, its reports only move the cursor on, and a gap in the events resyncs from a snapshot report at
once.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import aiohttp

from hetero_infer.contracts import metric_names
from hetero_infer.contracts.block_hashes import HASH_NAME, BlockReport
from hetero_infer.router.index import PrefixIndex
from hetero_infer.router.kv_events import EventFeed, subscribe_endpoint, zmq_available
from hetero_infer.router.lora import LoraInfo, adapter_bases, parse_lora_info
from hetero_infer.router.models import model_ids
from hetero_infer.router.policies import EndpointState

logger = logging.getLogger("hetero_infer.router")

LOAD_METRICS = {metric_names.REQUESTS_RUNNING: "running", metric_names.REQUESTS_WAITING: "waiting",
                metric_names.KV_CACHE_USAGE: "kv_usage"}
BLOCKS_PATH = "/v1/cache/blocks"
MODELS_PATH = "/v1/models"
_NAME_END = re.compile(r"[{\s]")
MAX_STALLS = 3  # polls a worker's events may stall without a batch ever arriving before block reports take over


@dataclass
class Worker:
    url: str
    ready: bool = False
    in_flight: int = 0
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    reports_blocks: bool | None = None  # None: not asked yet
    max_num_seqs: int | None = None  # from its block report
    num_blocks: int | None = None  # its KV pool, from its block report
    cards: list[dict] | None = None  # its GET /v1/models (None: not known yet; kept while it is away)
    lora: LoraInfo | None = None  # its vllm:lora_requests_info (None: it reports no adapter slots)
    # adapters of the requests the router has open to it: in use there before its next report says so
    sent_adapters: Counter[str] = field(default_factory=Counter)

    @property
    def models(self) -> set[str]:
        return {c["id"] for c in self.cards or ()}

    def serves(self, model: str | None) -> bool:
        """Whether a request for `model` may go here: any request while its models are not known (a worker that
        does not list them is sent everything, as before routing by model)."""
        return model is None or self.cards is None or model in self.models

    def state(self) -> EndpointState:
        adapters = frozenset(self.sent_adapters) | (self.lora.active if self.lora else frozenset())
        return EndpointState(self.url, self.in_flight, self.running, self.waiting, self.kv_usage, self.max_num_seqs,
                             self.num_blocks, self.lora.max_lora if self.lora else None, adapters)


def parse_load(text: str) -> dict[str, float]:
    """The load gauges of a worker's Prometheus exposition, summed over label sets. Only those gauges' lines are
    read: a worker's /metrics is hundreds of lines (histograms), and a full parse took tens of milliseconds of the
    router's event loop per poll."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("hetero_infer_"):
            continue
        m = _NAME_END.search(line)
        key = LOAD_METRICS.get(line[: m.start()]) if m else None
        if key is None:
            continue
        fields = line[line.rindex("}") + 1 :].split() if "}" in line else line[m.start() :].split()
        try:
            out[key] = out.get(key, 0.0) + float(fields[0])
        except (IndexError, ValueError):
            continue
    return out


def parse_capacity(data: dict) -> tuple[int | None, int | None]:
    """(max_num_seqs, num_blocks) from a block report; None where it does not say (an older worker)."""
    def positive(key: str) -> int | None:
        value = data.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

    return positive("max_num_seqs"), positive("num_blocks")


def parse_report(data: dict, block_size: int) -> BlockReport | None:
    """A block report, or None when it is in another hash scheme or block size (not comparable)."""
    if data.get("hash") != HASH_NAME or data.get("block_size") != block_size:
        return None

    def hashes(key: str) -> tuple[int, ...]:
        return tuple(int(h) for h in data.get(key, ()))

    return BlockReport(str(data["epoch"]), int(data["seq"]), None if data.get("since") is None else int(data["since"]),
                       hashes("added"), hashes("removed"), hashes("host_added"), hashes("host_removed"))


def parse_events(data: dict) -> tuple[str, str, int | None] | None:
    """(endpoint, topic, seq) of the KV events a block report advertises; None where it advertises none. `seq`:
    the batches its state holds (None: not known yet)."""
    info = data.get("kv_events")
    if not isinstance(info, dict) or not isinstance(info.get("endpoint"), str):
        return None
    seq = info.get("seq")
    return (info["endpoint"], str(info.get("topic") or ""),
            seq if isinstance(seq, int) and not isinstance(seq, bool) and seq >= 0 else None)


class WorkerPool:
    def __init__(self, urls: Iterable[str], index: PrefixIndex, block_size: int, interval_s: float,
                 on_change: Callable[[], None] | None = None, api_key: str | None = None,
                 kv_events: bool = True) -> None:
        self.workers = {u: Worker(u) for u in urls}
        self.kv_events = kv_events and zmq_available()  # subscribe to the workers' KV events they advertise
        if kv_events and not self.kv_events:
            logger.warning("pyzmq is not installed: the workers' KV events are not read (block reports only)")
        self.feeds: dict[str, EventFeed] = {}  # worker -> its KV events
        self.no_events: set[str] = set()  # workers whose advertised events never arrive: block reports only
        self._wake: dict[str, asyncio.Event] = {}  # worker -> set to poll it at once (a resync)
        self._auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.index = index
        self.block_size = block_size
        self.interval_s = interval_s
        self.on_change = on_change
        self._changed = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self.session: aiohttp.ClientSession | None = None

    # -- state --------------------------------------------------------------------------------
    def ready(self, exclude: Iterable[str] = (), model: str | None = None) -> list[Worker]:
        """The ready workers not in `exclude` that serve `model` (any, for None)."""
        skip = set(exclude)
        return [w for w in self.workers.values() if w.ready and w.url not in skip and w.serves(model)]

    def known_models(self) -> set[str] | None:
        """Every model a worker of the pool has listed (ready or not); None while a worker's list is not known (it
        may serve any model)."""
        if any(w.cards is None for w in self.workers.values()):
            return None
        return set().union(*(w.models for w in self.workers.values()))

    def adapter_bases(self) -> dict[str, str]:
        """adapter -> base model, from every worker's model cards (ready or not)."""
        return adapter_bases(w.cards or () for w in self.workers.values())

    def _set_ready(self, worker: Worker, ready: bool, why: str = "") -> None:
        if worker.ready == ready:
            return
        worker.ready = ready
        if not ready:
            self.index.drop(worker.url)
            self._stop_feed(worker.url)
            self.no_events.discard(worker.url)  # a restarted worker may publish where the router can reach
            worker.reports_blocks = None
            logger.warning("worker %s left the pool: %s", worker.url, why)
        else:
            logger.info("worker %s joined the pool", worker.url)
        self._notify()

    def wake(self) -> None:
        """Something the waiters depend on changed outside the pool (the models the router serves)."""
        self._notify()

    def _notify(self) -> None:
        """The pool changed (a worker joined or left, or its models did): tell the router, wake the waiters."""
        if self.on_change:
            self.on_change()
        self._changed.set()
        self._changed = asyncio.Event()

    def mark_down(self, url: str, why: str) -> None:
        """A request could not reach it: out of the pool until its /readyz answers again."""
        worker = self.workers.get(url)
        if worker is not None:  # else it was removed meanwhile (cluster.py: its InferenceDeployment deleted)
            self._set_ready(worker, False, why)

    def remove(self, url: str) -> None:
        """Forget a worker (not polled any more): its models too, which may leave a model unknown."""
        worker = self.workers.pop(url, None)
        if worker is not None:
            self._stop_feed(url)
            if worker.ready:
                self.index.drop(url)
            self._notify()

    async def wait_ready(self, exclude: Iterable[str], deadline: float, model: str | None = None,
                         give_up: Callable[[], bool] | None = None) -> list[Worker]:
        """Ready workers not in `exclude` serving `model`, waiting for one until `deadline` (time.monotonic) or until
        `give_up()` says so after a change; [] then."""
        while not (found := self.ready(exclude, model)):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (give_up is not None and give_up()):
                return []
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except asyncio.TimeoutError:
                pass
        return found

    # -- polling ------------------------------------------------------------------------------
    async def start(self, session: aiohttp.ClientSession) -> None:
        self.session = session
        self._tasks = [asyncio.create_task(self._watch(w)) for w in self.workers.values()]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(feed.stop() for feed in self.feeds.values()))
        self.feeds.clear()

    async def _watch(self, worker: Worker) -> None:
        while True:
            try:
                await self.check(worker)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a poll must never end the loop
                logger.debug("poll of %s failed: %s", worker.url, exc)
            await self.pause(worker)

    async def pause(self, worker: Worker) -> None:
        """Wait for the worker's next poll: `interval_s`, or less when its KV events need a resync."""
        wake = self._wake.setdefault(worker.url, asyncio.Event())
        try:
            await asyncio.wait_for(wake.wait(), self.interval_s)
        except asyncio.TimeoutError:
            pass
        wake.clear()

    # -- KV events ----------------------------------------------------------------------------
    def _follow_events(self, worker: Worker, advertised: tuple[str, str, int | None] | None) -> EventFeed | None:
        """The worker's event feed for what its report advertises: started, kept, restarted where the endpoint
        changed (a restarted worker), stopped where it advertises none."""
        feed = self.feeds.get(worker.url)
        if not self.kv_events or advertised is None or worker.url in self.no_events:
            if feed is not None:
                self._stop_feed(worker.url)
            return None
        endpoint, topic = subscribe_endpoint(advertised[0], worker.url), advertised[1]
        if feed is not None and (feed.endpoint, feed.topic) == (endpoint, topic) and feed.alive:
            if feed.check(advertised[2]):
                return feed
            if feed.stalls >= MAX_STALLS and not feed.batches:
                logger.warning("worker %s: its KV events (%s) never arrive: block reports only", worker.url, endpoint)
                self.no_events.add(worker.url)
                self._stop_feed(worker.url)
                return None
            return feed
        self._stop_feed(worker.url)
        wake = self._wake.setdefault(worker.url, asyncio.Event())
        feed = self.feeds[worker.url] = EventFeed(worker.url, endpoint, topic, self.index, wake.set)
        feed.start()
        return feed

    def _stop_feed(self, url: str) -> None:
        feed = self.feeds.pop(url, None)
        if feed is not None:
            self.index.resync(url)  # the entry was the events': block reports take it over from a snapshot
            asyncio.ensure_future(feed.stop())

    async def check(self, worker: Worker) -> None:
        """One round for one worker: readiness, then load, then its block report."""
        assert self.session is not None
        timeout = aiohttp.ClientTimeout(total=max(2.0, self.interval_s * 2))
        try:
            async with self.session.get(worker.url + "/readyz", timeout=timeout) as r:
                ok = r.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            ok, why = False, f"/readyz: {exc.__class__.__name__}"
        else:
            why = f"/readyz answered {r.status}"
        if not ok:
            self._set_ready(worker, False, why)
            return
        await self._poll_models(worker, timeout)
        async with self.session.get(worker.url + "/metrics", timeout=timeout) as r:
            if r.status == 200:
                text = await r.text()
                load = parse_load(text)
                worker.lora = parse_lora_info(text)
                worker.running = int(load.get("running", 0))
                worker.waiting = int(load.get("waiting", 0))
                worker.kv_usage = float(load.get("kv_usage", 0.0))
        if worker.reports_blocks is not False:
            await self._poll_blocks(worker, timeout)
        self._set_ready(worker, True)

    async def _poll_models(self, worker: Worker, timeout: aiohttp.ClientTimeout) -> None:
        """Its GET /v1/models, every round (adapters come and go); a worker that does not answer it keeps what it
        said last (None: it is sent requests for any model)."""
        assert self.session is not None
        async with self.session.get(worker.url + MODELS_PATH, timeout=timeout, headers=self._auth) as r:
            if r.status != 200:
                return
            try:
                cards = model_ids(await r.json(content_type=None))
            except ValueError as exc:
                logger.warning("worker %s answered GET %s with no model list: %s", worker.url, MODELS_PATH, exc)
                return
        if worker.cards is None or {c["id"] for c in cards} != worker.models:
            logger.info("worker %s serves %s", worker.url, ", ".join(sorted(c["id"] for c in cards)) or "nothing")
            worker.cards = cards
            self._notify()
        else:
            worker.cards = cards

    async def _poll_blocks(self, worker: Worker, timeout: aiohttp.ClientTimeout) -> None:
        assert self.session is not None
        feed = self.feeds.get(worker.url)
        cursor = self.index.cursor(worker.url) if feed is None or feed.live else None  # syncing: a snapshot
        for _ in range(2):  # a refused delta is followed by a snapshot
            params = {"epoch": cursor[0], "since": str(cursor[1])} if cursor else {}
            asked = self.index.now()  # requests that ended before this have their blocks in the answer
            async with self.session.get(worker.url + BLOCKS_PATH, params=params, timeout=timeout,
                                        headers=self._auth) as r:
                if r.status in (401, 403) and worker.reports_blocks is None:
                    logger.warning("worker %s refused the block report (%d): set --worker-api-key to the "
                                   "workers' key for the exact index; approximate index", worker.url, r.status)
                if r.status != 200:
                    worker.reports_blocks = False  # another server, or a worker without the endpoint
                    return
                data = await r.json()
                report = parse_report(data, self.block_size)
            if report is None:
                logger.warning("worker %s reports blocks in another scheme: approximate index", worker.url)
                worker.reports_blocks = False
                return
            worker.reports_blocks = True
            worker.max_num_seqs, worker.num_blocks = parse_capacity(data)
            if worker.num_blocks is not None:
                self.index.set_pool(worker.url, worker.num_blocks)
            advertised = parse_events(data)
            feed = self._follow_events(worker, advertised)
            last = self.index.cursor(worker.url)
            if feed is not None and feed.live and last is not None and report.epoch != last[0]:
                feed.sync.lost()  # the worker restarted: its batches count from 0 again, and 0 may have been missed
            if feed is not None and not feed.live and report.is_snapshot and advertised and advertised[2] is not None:
                self.index.apply(worker.url, report, asked)  # resync: the snapshot, then the batches after it
                feed.synced(advertised[2])
                return
            if self.index.apply(worker.url, report, asked, cursor_only=feed is not None and feed.live):
                return
            cursor = None
