"""The prefix policy's decisions replayed through the workers' own block managers, without I/O: issue 26's
workload (4 workers whose pools hold 3-4 of 12 shared prefixes, requests shuffled, 4 in flight) routed by the real
`PrefixIndex` + `policies.prefix` + the pool's bookkeeping, the workers' caches handed to `BlockLog`s and polled
into the index only now and then (the router's view between polls is its pending blocks). The cluster's hit rate
is the block managers' own counters, against one replica that never evicts."""

from __future__ import annotations

import random
from collections import deque

import pytest

from hetero_infer.contracts.block_hashes import BlockLog, block_hashes
from hetero_infer.router.hashing import rendezvous
from hetero_infer.router.index import PrefixIndex
from hetero_infer.router.policies import EndpointState, least_load, prefix
from hetero_infer.worker.core.block_manager import BlockManager
from hetero_infer.worker.core.sequence import Sequence

BLOCK = 16
POOL = 112
URLS = tuple(f"http://w{i}" for i in range(4))


def workload(seed: int, prefixes: int = 12, repeats: int = 20, prefix_tokens: int = 368,
             suffix_tokens: int = 26) -> list[list[int]]:
    rng = random.Random(seed)
    shared = [[rng.randrange(1000, 40000) for _ in range(prefix_tokens)] for _ in range(prefixes)]
    prompts = [p + [rng.randrange(1000, 40000) for _ in range(suffix_tokens)] for p in shared for _ in range(repeats)]
    rng.shuffle(prompts)
    return prompts


def ideal(prompts: list[list[int]]) -> float:
    """One replica with an unbounded cache (full blocks, the newest token always computed)."""
    seen: set[int] = set()
    hit = query = 0
    for p in prompts:
        hashes = block_hashes(p, BLOCK)
        n = 0
        while n < (len(p) - 1) // BLOCK and hashes[n] in seen:
            n += 1
        hit, query = hit + n * BLOCK, query + len(p)
        seen.update(hashes)
    return hit / query


class Worker:
    def __init__(self, url: str) -> None:
        self.url = url
        self.bm = BlockManager(POOL, BLOCK)
        self.log = BlockLog(epoch=url)
        self.in_flight = 0

    def serve(self, n: int, ids: list[int], decode: int) -> Sequence:
        seq = Sequence(str(n), list(ids), len(ids), None, 64)
        hits = self.bm.lookup_prefix(seq)
        assert self.bm.can_admit(seq, hits, len(ids) - len(hits) * BLOCK)
        self.bm.admit(seq, hits)
        for _ in range(decode + 1):
            assert self.bm.allocate_slots(seq, seq.num_tokens - seq.num_computed_tokens)
            seq.num_computed_tokens = seq.num_tokens
            self.bm.register_computed_blocks(seq)
            seq.token_ids.append(7)
        self.log.apply(*self.bm.take_cache_changes())  # the engine's hand-over
        return seq


def replay(prompts: list[list[int]], policy: str, in_flight: int = 4, poll_every: int = 25,
           decode: int = 16, warm: bool = False) -> tuple[float, int]:
    """(cluster hit rate, prefixes placed cold) with `in_flight` requests open (the oldest ends first) and every
    worker polled once per `poll_every` requests; `warm`: the pools start full of earlier traffic's blocks (a
    router restarted in front of busy workers)."""
    workers = {u: Worker(u) for u in URLS}
    if warm:
        for i, w in enumerate(workers.values()):
            for j, ids in enumerate(workload(100 + i, prefixes=6, repeats=1)):
                w.bm.free(w.serve(-j, ids, decode))
            w.bm.prefix_hits = w.bm.prefix_queries = 0
    index = PrefixIndex()
    open_: deque = deque()
    cold = 0
    for n, ids in enumerate(prompts):
        if len(open_) == in_flight:
            w, seq, route = open_.popleft()
            w.bm.free(seq)
            w.in_flight -= 1
            index.ended(route)
        if n % poll_every == 0:
            for w in workers.values():
                w.log.apply(*w.bm.take_cache_changes())
                asked = index.now()
                report = w.log.report(*(index.cursor(w.url) or (None, None)))
                assert index.apply(w.url, report, asked)
                index.set_pool(w.url, POOL)
        states = [EndpointState(w.url, w.in_flight, max_num_seqs=256, num_blocks=POOL) for w in workers.values()]
        hashes = block_hashes(ids, BLOCK)
        if policy == "prefix":
            matched = index.match(hashes, URLS)
            eviction = {u: index.eviction_cost(u, len(hashes)) for u in URLS}
            decision = prefix(states, matched, affinity=hashes[0], eviction=eviction)
            cold += decision.matched_blocks == 0
        else:
            decision = least_load(states)
        w = workers[decision.url]
        route = index.record_route(w.url, hashes)
        w.in_flight += 1
        open_.append((w, w.serve(n, ids, decode), route))
    hits = sum(w.bm.prefix_hits for w in workers.values())
    queries = sum(w.bm.prefix_queries for w in workers.values())
    return hits / queries, cold


@pytest.mark.parametrize("seed", range(5))
def test_small_pools_light_traffic_keep_each_prefix_on_one_worker(seed):
    prompts = workload(seed)
    best = ideal(prompts)
    rate, cold = replay(prompts, "prefix")
    assert cold == 12  # each prefix placed once, never duplicated
    assert rate >= 0.8 and rate >= 0.9 * best, (rate, best)
    assert replay(prompts, "least-load")[0] < 0.6  # the workload does need affinity


def test_a_router_started_in_front_of_full_pools_places_prefixes_as_well():
    """Blocks the router never routed count as free room: placement still fills the pools evenly."""
    prompts = workload(3)
    rate, cold = replay(prompts, "prefix", warm=True)
    assert cold == 12 and rate >= 0.9 * ideal(prompts)


def test_the_index_sees_its_own_routes_between_polls():
    """With a poll only every 1,000 requests, the pending blocks alone keep the placement: the same hit rate."""
    prompts = workload(11)
    assert replay(prompts, "prefix", poll_every=1000)[1] == 12


def test_cold_prefixes_fill_free_room_before_their_rendezvous_home_would_evict():
    """12 prefixes on 4 pools of room for 4: never 5 on one worker (pure rendezvous would, for this seed)."""
    prompts = workload(2)
    firsts = {}
    for p in prompts:
        firsts.setdefault(block_hashes(p, BLOCK)[0], p)
    pure = [max(URLS, key=lambda u: rendezvous(h, u)) for h in firsts]
    assert max(pure.count(u) for u in URLS) >= 5
    assert replay(prompts, "prefix")[1] == 12
