"""KV cache events, version 1: the wire format vLLM publishes (vllm/distributed/kv_events.py) and llm-d's
precise prefix-cache producer reads, so a subscriber written for vLLM reads a hetero-infer worker unchanged.

One ZMQ PUB message per engine step that changed the cache: three frames, `[topic, seq, payload]`, `seq` an
8-byte big-endian counter (a gap tells a subscriber it missed a batch) and `payload` a msgpack `KVEventBatch`
(arrays, not maps; each event tagged with its class name). Block hashes are this project's chain hashes
(contracts/block_hashes.py), the ones the router's index and the block reports use. `medium` names the tier:
"GPU" is the engine's device pool (whatever the device), "CPU" the host tier behind it (--kv-offloading-size).
A host-tier `BlockStored` carries no token ids (the block was saved at eviction, away from its sequence).
`lora_id` is the LoRA adapter's `lora_int_id` for blocks computed under an adapter (as vLLM fills it; their hashes
chain from the adapter's root, contracts/block_hashes.py, so they never equal the base model's), None for the
base model's.

Torch-free: the router decodes these too."""

from __future__ import annotations

from typing import Any

import msgspec

VERSION = 1
DEVICE_MEDIUM = "GPU"
HOST_MEDIUM = "CPU"


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """Base class of the events."""


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(KVEventBatch)


def encode_batch(batch: KVEventBatch) -> bytes:
    return _ENCODER.encode(batch)


def decode_batch(payload: bytes) -> KVEventBatch:
    return _DECODER.decode(payload)


def seq_frame(seq: int) -> bytes:
    return seq.to_bytes(8, "big")


def apply(blocks: dict[str, set[int]], batch: KVEventBatch) -> None:
    """A subscriber's view of one worker: the block hashes each medium holds, updated by a batch."""
    for event in batch.events:
        if isinstance(event, BlockStored):
            blocks.setdefault(event.medium or DEVICE_MEDIUM, set()).update(event.block_hashes)
        elif isinstance(event, BlockRemoved):
            blocks.setdefault(event.medium or DEVICE_MEDIUM, set()).difference_update(event.block_hashes)
        else:
            blocks.clear()


class KVEventsConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """vLLM's --kv-events-config (its KVEventsConfig fields; replay is not served)."""

    enable_kv_cache_events: bool = False
    publisher: str = "zmq"  # "zmq", or "null": events recorded, nothing sent
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000  # ZMQ's send high-water mark: a subscriber that falls this far behind loses batches
    max_queue_size: int = 100_000
    topic: str = ""

    @classmethod
    def parse(cls, text: str) -> KVEventsConfig:
        """From a JSON object, or the path of a file holding one; ValueError saying what is wrong."""
        import json
        import os

        source = text
        if not text.lstrip().startswith("{") and os.path.isfile(text):
            with open(text) as f:
                source = f.read()
        try:
            config = msgspec.convert(json.loads(source), cls)
        except (ValueError, msgspec.ValidationError) as exc:
            raise ValueError(f"kv_events_config is not a valid KV events configuration: {exc}") from None
        if config.publisher not in ("zmq", "null"):
            raise ValueError(f"kv_events_config: publisher must be 'zmq' or 'null', not {config.publisher!r}")
        if config.replay_endpoint:
            raise ValueError("kv_events_config: replay_endpoint is not supported (subscribers see gaps in seq)")
        return config
