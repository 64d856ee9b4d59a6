"""Publishes the block manager's KV events (contracts/kv_events.py) over ZMQ PUB, one batch per engine step that
changed the cache, as vLLM's ZmqEventPublisher does: `[topic, seq, msgpack batch]`. Sends never block the
engine: past the high-water mark a slow subscriber loses batches (and sees the gap in `seq`)."""

from __future__ import annotations

import logging
import time

from hetero_infer.contracts.kv_events import (
    KVCacheEvent,
    KVEventBatch,
    KVEventsConfig,
    encode_batch,
    seq_frame,
)

log = logging.getLogger(__name__)


class KVEventPublisher:
    def __init__(self, config: KVEventsConfig) -> None:
        self.config = config
        self.topic = config.topic.encode()
        self.seq = 0
        self.dropped = 0  # batches a full send queue refused
        self._socket = None
        self.endpoint: str | None = None  # bound (tcp://*:5557 as bound, a port picked for tcp://host:*)
        if config.publisher == "zmq":
            import zmq

            self._zmq = zmq
            self._context = zmq.Context.instance()
            self._socket = self._context.socket(zmq.PUB)
            self._socket.setsockopt(zmq.SNDHWM, config.hwm)
            self._socket.setsockopt(zmq.LINGER, 0)
            self._socket.bind(config.endpoint)
            self.endpoint = self._socket.getsockopt(zmq.LAST_ENDPOINT).decode()
            log.info("KV events: publishing on %s (topic %r)", self.endpoint, config.topic)

    @property
    def address(self) -> tuple[str, str] | None:
        """(endpoint, topic) for subscribers (the block report advertises it to the router); None: nothing sent."""
        return None if self.endpoint is None else (self.endpoint, self.config.topic)

    def publish(self, events: list[KVCacheEvent]) -> None:
        if not events:
            return
        payload = encode_batch(KVEventBatch(ts=time.time(), events=events))
        if self._socket is not None:
            try:
                self._socket.send_multipart([self.topic, seq_frame(self.seq), payload], flags=self._zmq.NOBLOCK)
            except self._zmq.Again:
                self.dropped += 1
        self.seq += 1

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close(linger=0)
            self._socket = None
