"""Routing policies: pure functions over (request, endpoint states).

`load` is how busy a worker is: the larger of the router's own count of requests in flight to it (fresh) and
the queue it last reported (running + waiting; it also counts other routers' requests). A worker whose KV usage
is at or above `kv_full` ranks after every other (new requests would only queue there). A worker *has room* when
its running and waiting requests leave a sequence slot free (`max_num_seqs`, from its block report; unknown:
when nothing waits there): one more request runs at once.

`prefix` follows consistent hashing with bounded loads, where the bound is what a worker can absorb
(`worker_bound`): the fair share `ceil(load_factor * (total load + 1) / workers)` always; while the worker has
room, at least `min_slack` requests (at light traffic a prefix's home keeps its requests: a spill costs a
prefill and, in small pools, a duplicate that evicts other prefixes for good), and for a prefix that fills a good
part of its pool twice the mean load. So one hot prefix spills once its home is saturated, and never queues
there while another worker has room. Among the workers under their bound (those with room first) the longest
cached prefix wins, ties to the least loaded. A prefix nobody holds goes where it fits in free room (`eviction`
below 0: the most room first, so pools fill evenly), then to its rendezvous home: a stable worker per prefix,
different prefixes spread. Where it fits nowhere it costs a full prefill whatever the choice: the least loaded
first (so it does not wait behind another's prefill), then where it displaces the stalest blocks.

Tiers: a worker with a host KV tier (--kv-offloading-size) restores the blocks it holds there instead of computing
them, at the cost of a copy. A cached prefix is worth `tier_score`: its leading blocks on the device, plus
`host_weight` (< 1) times the blocks its host tier holds from there on. So a device hit beats a host hit of the
same length, a host hit beats no hit, and a host run more than 1/host_weight times longer than another worker's
device run beats it. The load bound applies before the score, as for device hits.

A request for a LoRA adapter (`adapter`) ranks the workers as llm-d's LoRA-affinity scorer does (`lora_rank`):
those whose requests use the adapter now (it is in a device slot), then those with a free adapter slot, then the
rest (the request would wait there for a slot). The load bound applies first, as for any request; a worker without
a slot for the adapter ranks after every worker with one, even one holding the prefix; among the others the best
cached prefix still wins (the prefix hashes include the adapter, so a holder of the prefix had it), then the
adapter's rank.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hetero_infer.router.hashing import rendezvous

# A prefix above 1/SMALL_POOL_SHARE of its home's pool is costly to duplicate (the pool holds only a few such
# prefixes): its home may take up to SMALL_POOL_FACTOR times the mean load while it has room.
SMALL_POOL_SHARE = 8
SMALL_POOL_FACTOR = 2.0
# A block restored from a host tier is worth this much of a block on the device (the router's --host-hit-weight).
HOST_HIT_WEIGHT = 0.5


@dataclass(frozen=True)
class EndpointState:
    url: str
    in_flight: int = 0  # requests the router has open to it
    running: int = 0  # last scraped hetero_infer_num_requests_running
    waiting: int = 0  # last scraped hetero_infer_num_requests_waiting
    kv_usage: float = 0.0  # last scraped hetero_infer_kv_cache_usage_ratio
    max_num_seqs: int | None = None  # sequences it runs at once (its block report; None: not known)
    num_blocks: int | None = None  # KV blocks in its pool (its block report; None: not known)
    max_lora: int | None = None  # its adapter slots (vllm:lora_requests_info; None: not known, no adapters)
    adapters: frozenset[str] = frozenset()  # adapters its requests use now (running, waiting, sent by the router)

    @property
    def load(self) -> int:
        return max(self.in_flight, self.running + self.waiting)

    @property
    def has_room(self) -> bool:
        """One more request would run at once: a sequence slot is free beyond those running and waiting (a request
        waits a step before it is scheduled, so a short queue is no saturation); with `max_num_seqs` unknown,
        nothing waits there."""
        if self.max_num_seqs is None:
            return self.waiting == 0
        return self.load < self.max_num_seqs


# lora_rank: the adapter is in use there, a slot is free for it, neither (it waits there for a slot)
LORA_ACTIVE, LORA_FREE_SLOT, LORA_NO_SLOT = 0, 1, 2
LORA_RANK_NAMES = ("active", "free_slot", "no_slot")


def lora_rank(e: EndpointState, adapter: str | None) -> int:
    """How ready `e` is for a request of `adapter` (None: the base model, ready anywhere). A worker that does not
    report its slots is taken to have one free."""
    if adapter is None or adapter in e.adapters:
        return LORA_ACTIVE
    if e.max_lora is None or len(e.adapters) < e.max_lora:
        return LORA_FREE_SLOT
    return LORA_NO_SLOT


@dataclass(frozen=True)
class Decision:
    url: str
    matched_blocks: int = 0  # leading blocks of the prompt on its device
    host_blocks: int = 0  # the blocks after those in its host tier


def tier_score(device_blocks: int, host_blocks: int, host_weight: float = HOST_HIT_WEIGHT) -> float:
    """What a worker's cached prefix is worth: blocks on the device count 1, blocks it restores from its host tier
    `host_weight` (0 <= host_weight < 1: a copy is cheaper than computing, dearer than nothing)."""
    return device_blocks + host_weight * host_blocks


def load_key(e: EndpointState, kv_full: float = 0.95) -> tuple[bool, int, int, float, str]:
    return (e.kv_usage >= kv_full, e.load, e.waiting, e.kv_usage, e.url)


def least_load(endpoints: Sequence[EndpointState], kv_full: float = 0.95,
               adapter: str | None = None) -> Decision | None:
    """The least loaded worker that has a slot for `adapter`, ties to one already using it."""
    if not endpoints:
        return None
    return Decision(min(endpoints, key=lambda e: (lora_rank(e, adapter) == LORA_NO_SLOT, *load_key(e, kv_full),
                                                  lora_rank(e, adapter))).url)


def round_robin(endpoints: Sequence[EndpointState], counter: int) -> Decision | None:
    """The `counter`-th endpoint in URL order (the caller advances the counter after each pick)."""
    if not endpoints:
        return None
    ordered = sorted(endpoints, key=lambda e: e.url)
    return Decision(ordered[counter % len(ordered)].url)


def load_bound(endpoints: Sequence[EndpointState], load_factor: float) -> int:
    """The fair share: the most load any one worker may reach by taking the next request."""
    total = sum(e.load for e in endpoints) + 1
    return max(1, math.ceil(load_factor * total / len(endpoints)))


def worker_bound(e: EndpointState, endpoints: Sequence[EndpointState], load_factor: float, min_slack: int,
                 matched_blocks: int = 0) -> int:
    """The most load `e` may reach by taking the next request (whose prompt it holds `matched_blocks` of)."""
    fair = load_bound(endpoints, load_factor)
    if not e.has_room:
        return fair
    relaxed = min_slack
    if matched_blocks and e.num_blocks and matched_blocks * SMALL_POOL_SHARE > e.num_blocks:
        relaxed = max(relaxed, load_bound(endpoints, SMALL_POOL_FACTOR))
    if e.max_num_seqs is not None:
        relaxed = min(relaxed, e.max_num_seqs)
    return max(fair, relaxed)


def prefix(endpoints: Sequence[EndpointState], matched: Mapping[str, int], load_factor: float = 1.25,
           kv_full: float = 0.95, affinity: int | None = None, min_slack: int = 4,
           eviction: Mapping[str, int] | None = None, host_matched: Mapping[str, int] | None = None,
           host_weight: float = HOST_HIT_WEIGHT, adapter: str | None = None) -> Decision | None:
    """The worker under its bound whose cached prefix is worth the most (`tier_score` of `matched`: url -> leading
    blocks on the device, and `host_matched`: url -> the blocks after those in its host tier) among those with a
    slot for `adapter`, ties to the one using the adapter already, then to the least loaded; a prefix no candidate
    holds goes to the lowest negative `eviction` cost (url ->
    `PrefixIndex.eviction_cost`: it fits in free room), else the least loaded and then the lowest cost, ties to the
    highest rendezvous rank for `affinity` (the prompt's first block hash)."""
    if not endpoints:
        return None
    host_matched = host_matched or {}
    under = [e for e in endpoints
             if e.load + 1 <= worker_bound(e, endpoints, load_factor, min_slack,
                                           matched.get(e.url, 0) + host_matched.get(e.url, 0))]
    candidates = [e for e in under if e.has_room] or under or list(endpoints)
    eviction = eviction or {}

    def key(e: EndpointState) -> tuple:
        m = tier_score(matched.get(e.url, 0), host_matched.get(e.url, 0), host_weight)
        rank = -rendezvous(affinity, e.url) if affinity is not None else 0
        if m:
            placement: tuple = (e.load, 0, 0)
        else:  # free room first; where it must evict, the request is a full prefill: the least loaded first
            cost = eviction.get(e.url, -1)
            placement = (min(cost, 0), e.load if cost >= 0 else 0, cost)
        lora = lora_rank(e, adapter)
        return (e.kv_usage >= kv_full, lora == LORA_NO_SLOT, -m, lora, *placement, rank, *load_key(e, kv_full))

    best = min(candidates, key=key)
    return Decision(best.url, matched.get(best.url, 0), host_matched.get(best.url, 0))
