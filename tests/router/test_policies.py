"""The routing policies as pure functions: no I/O, endpoint states built by hand."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from hetero_infer.router.policies import (
    EndpointState,
    least_load,
    load_bound,
    prefix,
    round_robin,
    worker_bound,
)

A, B, C = "http://a", "http://b", "http://c"


def states(**loads: int) -> list[EndpointState]:
    return [EndpointState(f"http://{k}", in_flight=v) for k, v in loads.items()]


def test_no_endpoint_no_decision():
    assert least_load([]) is None and round_robin([], 3) is None and prefix([], {}) is None


def test_least_load_counts_in_flight_and_the_reported_queue():
    eps = [EndpointState(A, in_flight=1, running=4, waiting=2), EndpointState(B, in_flight=3), EndpointState(C, running=5)]
    assert least_load(eps).url == B  # loads: a 6, b 3, c 5
    eps = [EndpointState(A, in_flight=7), EndpointState(B, running=3, waiting=5), EndpointState(C, in_flight=9)]
    assert least_load(eps).url == A  # loads 7, 8, 9


def test_least_load_ties_go_to_the_shorter_queue_then_lower_kv():
    eps = [EndpointState(A, running=2, waiting=2), EndpointState(B, running=4, kv_usage=0.5), EndpointState(C, running=4, kv_usage=0.2)]
    assert least_load(eps).url == C


def test_a_kv_full_worker_ranks_last():
    eps = [EndpointState(A, kv_usage=0.97), EndpointState(B, in_flight=1, kv_usage=0.3)]
    assert least_load(eps).url == B
    assert prefix(eps, {A: 10}).url == B


def test_round_robin_cycles_in_url_order_whatever_the_input_order():
    eps = [EndpointState(C), EndpointState(A), EndpointState(B)]
    assert [round_robin(eps, i).url for i in range(6)] == [A, B, C, A, B, C]


def test_prefix_prefers_the_longest_match():
    eps = states(a=1, b=1, c=1)
    d = prefix(eps, {A: 2, B: 5, C: 0})
    assert (d.url, d.matched_blocks) == (B, 5)


def test_prefix_ties_among_holders_go_to_the_least_loaded():
    eps = states(a=2, b=1, c=3)
    assert prefix(eps, {A: 4, C: 4}).url == A
    assert prefix(eps, {}).url == B  # no affinity, no cache information: the least loaded


def test_a_cold_prefix_goes_to_its_rendezvous_home_under_the_bound_whatever_the_loads():
    eps = states(a=0, b=0, c=0)
    picks = {h: prefix(eps, {}, affinity=h).url for h in range(40)}
    assert set(picks.values()) == {A, B, C}
    assert all(prefix(list(reversed(eps)), {}, affinity=h).url == u for h, u in picks.items())
    home_b = next(h for h, u in picks.items() if u == B)
    assert prefix(states(a=0, b=2, c=1), {}, affinity=home_b).url == B  # busier, but under the slack
    assert prefix(states(a=0, b=9, c=1), {}, affinity=home_b).url != B  # above the bound: elsewhere


def test_a_cold_prefix_prefers_free_room_then_the_least_loaded_then_the_stalest_cache():
    eps = states(a=0, b=0, c=0)
    home = next(h for h in range(100) if prefix(eps, {}, affinity=h).url == A)
    assert prefix(eps, {}, affinity=home, eviction={A: -1, B: -1, C: -2}).url == C  # fits twice there
    assert prefix(eps, {}, affinity=home, eviction={A: -2, B: -2, C: -2}).url == A  # a tie: its home
    assert prefix(states(a=3, b=0, c=0), {}, affinity=home, eviction={A: -1, B: 5, C: 9}).url == A  # room wins
    assert prefix(eps, {}, affinity=home, eviction={A: 50, B: 20, C: 30}).url == B  # must evict: the stalest
    busy = states(a=0, b=2, c=1)  # must evict everywhere: a full prefill, so the least loaded first
    assert prefix(busy, {}, affinity=home, eviction={A: 50, B: 20, C: 30}).url == A


def test_the_bound_is_the_fair_share_or_the_slack_while_the_worker_has_room():
    eps = states(a=1, b=6, c=2)
    assert load_bound(eps, 1.25) == 5
    assert worker_bound(eps[1], eps, 1.25, 4) == 5
    assert worker_bound(eps[0], eps, 1.25, 8) == 8
    capped = EndpointState(A, in_flight=1, max_num_seqs=3)
    assert worker_bound(capped, [capped, *eps[1:]], 1.25, 8) == 5  # the slack never exceeds its sequence slots
    waiting = EndpointState(A, running=1, waiting=1)
    assert worker_bound(waiting, [waiting, *eps[1:]], 1.25, 8) == 5  # a queue there: the fair share only


def test_a_prefix_that_fills_a_good_part_of_a_small_pool_may_take_twice_the_mean_at_its_home():
    eps = [EndpointState(u, in_flight=4, num_blocks=112) for u in (A, B, C)]
    assert worker_bound(eps[0], eps, 1.25, 4, matched_blocks=23) == 9  # ceil(2 * 13 / 3)
    assert worker_bound(eps[0], eps, 1.25, 4, matched_blocks=10) == 6  # 10 blocks of 112: a cheap duplicate
    roomy = [EndpointState(u, in_flight=4, num_blocks=640) for u in (A, B, C)]
    assert worker_bound(roomy[0], roomy, 1.25, 4, matched_blocks=23) == 6


def test_prefix_respects_the_load_bound():
    # b holds the prefix but is far above the average: the request spills to the next best under the bound.
    eps = states(a=1, b=6, c=2)
    d = prefix(eps, {A: 0, B: 9, C: 3})
    assert (d.url, d.matched_blocks) == (C, 3)


def test_a_worker_without_room_is_passed_over_while_another_has_room():
    eps = [EndpointState(A, running=2, max_num_seqs=2), EndpointState(B, in_flight=1, max_num_seqs=2)]
    assert prefix(eps, {A: 9}).url == B
    full = [EndpointState(A, running=2, max_num_seqs=2), EndpointState(B, running=2, waiting=1, max_num_seqs=2)]
    assert prefix(full, {A: 9}).url == A  # nobody has room: the holder, under its fair share


def flood(workers: int, cap: int, slack: int, requests: int, holders: int) -> list[int]:
    """One hot prefix held by the first `holders` workers: requests arrive, none ends; each worker runs up to
    `cap` and queues the rest. The loads it ends with."""
    loads = [0] * workers
    urls = [f"http://w{i}" for i in range(workers)]
    for _ in range(requests):
        eps = [EndpointState(u, running=min(v, cap), waiting=max(0, v - cap), max_num_seqs=cap, num_blocks=112)
               for u, v in zip(urls, loads)]
        d = prefix(eps, {u: 23 for u in urls[:holders]}, min_slack=slack)
        chosen = urls.index(d.url)
        if not eps[chosen].has_room:  # it queues there only when no worker with room is under its bound
            assert not any(e.has_room and e.load + 1 <= worker_bound(e, eps, 1.25, slack, 23 if i < holders else 0)
                           for i, e in enumerate(eps))
        loads[chosen] += 1
    return loads


@given(st.integers(2, 6), st.integers(1, 16), st.integers(1, 8), st.integers(1, 120), st.integers(1, 6))
def test_one_hot_prefix_spreads_once_its_home_is_saturated(workers, cap, slack, requests, holders):
    """Never more than twice the mean load (or the slack) on one worker, and a worker with a queue holds no more
    than the fair share (1.25 times the mean)."""
    loads = flood(workers, cap, slack, requests, min(holders, workers))
    mean = requests / workers
    assert max(loads) <= max(math.ceil(2 * mean), slack)
    assert all(v <= math.ceil(1.25 * mean) for v in loads if v > cap)


@given(st.dictionaries(st.sampled_from([A, B, C]), st.integers(0, 10), min_size=1),
       st.dictionaries(st.sampled_from([A, B, C]), st.integers(0, 10)), st.integers(1, 6))
def test_prefix_picks_a_maximal_match_among_workers_under_their_bound(loads, matched, slack):
    eps = [EndpointState(u, in_flight=v) for u, v in loads.items()]
    d = prefix(eps, matched, min_slack=slack)
    under = [e for e in eps if e.load + 1 <= worker_bound(e, eps, 1.25, slack, matched.get(e.url, 0))] or eps
    assert d.url in {e.url for e in under}
    assert d.matched_blocks == max(matched.get(e.url, 0) for e in under)
