"""Routing policies: pure functions over (request, endpoint states).

`load` is how busy a worker is: the larger of the router's own count of requests in flight to it (fresh) and
the queue it last reported (running + waiting; it also counts other routers' requests). A worker whose KV usage
is at or above `kv_full` ranks after every other (new requests would only queue there).

`prefix` follows consistent hashing with bounded loads: no worker may take a request that would put it above
`ceil(load_factor * (total load + 1) / workers)`, so one hot prefix spills onto the next-best worker instead of
queueing on one; among the workers under the bound (and below `kv_full`), the longest cached prefix wins, then the least loaded.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from hetero_infer.router.hashing import rendezvous

Policy = Literal["prefix", "least-load", "round-robin"]
POLICIES: tuple[str, ...] = ("prefix", "least-load", "round-robin")


@dataclass(frozen=True)
class EndpointState:
    url: str
    in_flight: int = 0  # requests the router has open to it
    running: int = 0  # last scraped hetero_infer_num_requests_running
    waiting: int = 0  # last scraped hetero_infer_num_requests_waiting
    kv_usage: float = 0.0  # last scraped hetero_infer_kv_cache_usage_ratio

    @property
    def load(self) -> int:
        return max(self.in_flight, self.running + self.waiting)


@dataclass(frozen=True)
class Decision:
    url: str
    matched_blocks: int = 0


def load_key(e: EndpointState, kv_full: float = 0.95) -> tuple[bool, int, int, float, str]:
    return (e.kv_usage >= kv_full, e.load, e.waiting, e.kv_usage, e.url)


def least_load(endpoints: Sequence[EndpointState], kv_full: float = 0.95) -> Decision | None:
    if not endpoints:
        return None
    return Decision(min(endpoints, key=lambda e: load_key(e, kv_full)).url)


def round_robin(endpoints: Sequence[EndpointState], counter: int) -> Decision | None:
    """The `counter`-th endpoint in URL order (the caller advances the counter after each pick)."""
    if not endpoints:
        return None
    ordered = sorted(endpoints, key=lambda e: e.url)
    return Decision(ordered[counter % len(ordered)].url)


def load_bound(endpoints: Sequence[EndpointState], load_factor: float) -> int:
    """The most load any one worker may reach by taking the next request."""
    total = sum(e.load for e in endpoints) + 1
    return max(1, math.ceil(load_factor * total / len(endpoints)))


def prefix(endpoints: Sequence[EndpointState], matched: Mapping[str, int], load_factor: float = 1.25,
           kv_full: float = 0.95, affinity: int | None = None) -> Decision | None:
    """The worker under the load bound holding the most leading blocks (`matched`: url -> blocks); ties and
    cold prefixes go to the least loaded, and among equally loaded ones to the highest rendezvous rank for
    `affinity` (the prompt's first block hash): a new prefix lands on a stable worker, different ones spread."""
    if not endpoints:
        return None
    bound = load_bound(endpoints, load_factor)
    under = [e for e in endpoints if e.load + 1 <= bound] or list(endpoints)

    def key(e: EndpointState) -> tuple:
        rank = -rendezvous(affinity, e.url) if affinity is not None else 0
        return (e.kv_usage >= kv_full, -matched.get(e.url, 0), e.load, rank, *load_key(e, kv_full))

    best = min(under, key=key)
    return Decision(best.url, matched.get(best.url, 0))
