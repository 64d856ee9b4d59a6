"""The workers' KV events, as the router takes them in: a ZMQ SUB per worker that advertises them in its block
report (`kv_events`: endpoint, topic, seq; docs/router.md), each batch decoded with the wire contract
(hetero_infer/contracts/kv_events.py, vLLM's msgpack format) into its net change per tier (`net_changes`) and
applied to the index at once, rather than at the next block-report poll.

Batches are numbered. `EventsSync` (pure) says what to apply: a batch that continues the last one is applied; a
gap (a batch lost past the publisher's high-water mark, a subscriber that joined late) switches to *syncing*:
batches are buffered until a snapshot of the block report, which names the batches its state holds (`seq`), is
applied; the buffered batches from that `seq` on are applied after it, and the stream is live again. A batch
older than the stream's position (already in a snapshot) is skipped. A worker that restarts publishes from 0
again, starting with `AllBlocksCleared`: the stream continues from there (the index entry starts over).

Media: "GPU" (or none) is the device pool; any other ("CPU": the host tier, --kv-offloading-size) is the host
tier behind it.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from hetero_infer.contracts import kv_events

if TYPE_CHECKING:
    from hetero_infer.router.index import PrefixIndex

logger = logging.getLogger("hetero_infer.router.kv_events")

_WILDCARDS = {"*", "0.0.0.0", "::", "[::]", ""}


@dataclass
class TierChanges:
    """The net change of a batch of events: `cleared` (everything before it is gone), then the hashes that entered
    and left the device pool and the host tier."""

    cleared: bool = False
    added: list[int] = field(default_factory=list)
    removed: list[int] = field(default_factory=list)
    host_added: list[int] = field(default_factory=list)
    host_removed: list[int] = field(default_factory=list)


def net_changes(events: Iterable[kv_events.KVCacheEvent]) -> TierChanges:
    """The batch's net change per tier (a block stored and removed in one batch is removed)."""
    cleared = False
    state: dict[tuple[int, bool], bool] = {}  # (hash, host tier) -> held after the batch
    for event in events:
        if isinstance(event, kv_events.AllBlocksCleared):
            cleared = True
            state.clear()
            continue
        host = (event.medium or kv_events.DEVICE_MEDIUM) != kv_events.DEVICE_MEDIUM
        held = isinstance(event, kv_events.BlockStored)
        for h in event.block_hashes:
            state[h, host] = held
    out = TierChanges(cleared)
    for (h, host), held in state.items():
        if host:
            (out.host_added if held else out.host_removed).append(h)
        else:
            (out.added if held else out.removed).append(h)
    return out


def subscribe_endpoint(advertised: str, worker_url: str) -> str:
    """Where to connect for a worker's events: its advertised endpoint, the worker's own host in place of a
    wildcard address (a worker that binds tcp://*:5557 is reached where its HTTP is)."""
    scheme, sep, rest = advertised.partition("://")
    if not sep or scheme != "tcp":
        return advertised
    host, _, port = rest.rpartition(":")
    if host not in _WILDCARDS:
        return advertised
    worker_host = urlsplit(worker_url).hostname or "127.0.0.1"
    if ":" in worker_host:
        worker_host = f"[{worker_host}]"
    return f"tcp://{worker_host}:{port}"


class EventsSync:
    """One worker's event stream against its block reports (module docstring): `receive` each batch, `synced`
    after a snapshot report is applied. `expected`: the next batch's number while live; None while syncing."""

    def __init__(self, max_buffered: int = 4096) -> None:
        self.expected: int | None = None
        self.buffer: deque[tuple[int, TierChanges]] = deque(maxlen=max_buffered)

    @property
    def live(self) -> bool:
        return self.expected is not None

    def receive(self, seq: int, changes: TierChanges) -> list[TierChanges] | None:
        """The changes to apply now ([] while syncing, or for a batch a snapshot holds already); None: a gap,
        syncing from now on (ask for a snapshot)."""
        if self.expected is None:
            self.buffer.append((seq, changes))
            return []
        if seq == self.expected or (seq == 0 and changes.cleared):  # the next batch, or a restarted worker's first
            self.expected = seq + 1
            return [changes]
        if seq < self.expected:
            return []
        self.expected = None
        self.buffer.clear()
        self.buffer.append((seq, changes))
        return None

    def synced(self, seq: int) -> list[TierChanges] | None:
        """A snapshot holding the batches before `seq` was applied: the buffered changes to apply after it (live
        again), or None when the buffer does not continue it (batches lost: still syncing, ask again)."""
        while self.buffer and self.buffer[0][0] < seq:
            self.buffer.popleft()
        out = []
        expected = seq
        for n, changes in self.buffer:
            if n != expected:
                self.buffer.clear()
                return None
            out.append(changes)
            expected += 1
        self.buffer.clear()
        self.expected = expected
        return out

    def lost(self) -> None:
        """Batches may have been missed (the subscription broke): syncing."""
        self.expected = None
        self.buffer.clear()


class EventFeed:
    """A ZMQ SUB to one worker's events, applied to `index` through an `EventsSync`. `on_gap` is called when the
    stream needs a snapshot (the pool polls the worker's block report at once)."""

    def __init__(self, url: str, endpoint: str, topic: str, index: PrefixIndex,
                 on_gap: Callable[[], None] | None = None) -> None:
        self.url = url
        self.endpoint = endpoint
        self.topic = topic
        self.index = index
        self.on_gap = on_gap
        self.sync = EventsSync()
        self.batches = 0  # batches received
        self.resyncs = 0  # gaps seen
        self.reported: int | None = None  # the batches the last block report said were published
        self.stalls = 0  # polls that found the stream still short of what the report before had said
        self._last_tick: int | None = None  # the index's clock when the previous batch arrived
        self._task: asyncio.Task | None = None

    @property
    def live(self) -> bool:
        return self.sync.live

    @property
    def alive(self) -> bool:
        """Its subscriber runs (it has not failed)."""
        return self._task is not None and not self._task.done()

    def check(self, seq: int | None) -> bool:
        """A block report says `seq` batches were published: False when the stream has not even reached what the
        report before it said (batches that never arrive: a port the router cannot reach, a dead subscription),
        and it syncs again."""
        stalled = (self.live and seq is not None and self.reported is not None
                   and self.sync.expected is not None and self.sync.expected < self.reported)
        self.reported = seq
        if stalled:
            self.stalls += 1
            self.sync.lost()
        return not stalled

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    def take(self, seq: int, payload: bytes) -> None:
        """One message of the stream."""
        self.batches += 1
        try:
            changes = net_changes(kv_events.decode_batch(payload).events)
        except Exception as exc:  # a batch that does not decode is a lost batch
            logger.warning("KV events of %s: batch %d does not decode (%s): resync", self.url, seq, exc)
            self.sync.lost()
            self._gap()
            return
        out = self.sync.receive(seq, changes)
        if out is None:
            logger.info("KV events of %s: batch %d after a gap: resync from its block report", self.url, seq)
            self._gap()
            return
        self.apply(out)

    def synced(self, seq: int) -> bool:
        """A snapshot report holding the batches before `seq` was applied to the index: live again if the buffered
        batches continue it (applied now)."""
        out = self.sync.synced(seq)
        if out is None:
            self.resyncs += 1
            return False
        self.apply(out)
        return True

    def apply(self, changes: list[TierChanges]) -> None:
        for c in changes:
            asked, self._last_tick = self._last_tick, self.index.now()
            self.index.apply_events(self.url, c, asked)

    def _gap(self) -> None:
        self.resyncs += 1
        if self.on_gap is not None:
            self.on_gap()

    async def _run(self) -> None:
        import zmq
        import zmq.asyncio

        context = zmq.asyncio.Context.instance()
        socket = context.socket(zmq.SUB)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SUBSCRIBE, self.topic.encode())
        socket.connect(self.endpoint)
        logger.info("KV events of %s: subscribed to %s (topic %r)", self.url, self.endpoint, self.topic)
        try:
            while True:
                frames = await socket.recv_multipart()
                if len(frames) != 3 or len(frames[1]) != 8:
                    logger.warning("KV events of %s: a message of %d frames is not a batch", self.url, len(frames))
                    continue
                self.take(int.from_bytes(frames[1], "big"), frames[2])
        finally:
            socket.close(0)


def zmq_available() -> bool:
    try:
        import zmq.asyncio  # noqa: F401
    except ImportError:
        return False
    return True
