"""The routing policies as pure functions: no I/O, endpoint states built by hand."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from hetero_infer.router.policies import EndpointState, least_load, load_bound, prefix, round_robin

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


def test_prefix_cold_or_tied_goes_to_the_least_loaded():
    eps = states(a=2, b=1, c=3)
    assert prefix(eps, {}).url == B
    assert prefix(eps, {A: 4, C: 4}).url == A


def test_prefix_respects_the_load_bound():
    # b holds the prefix but is far above the average: the request spills to the next best under the bound.
    eps = states(a=1, b=6, c=2)
    assert load_bound(eps, 1.25) == 5
    d = prefix(eps, {A: 0, B: 9, C: 3})
    assert (d.url, d.matched_blocks) == (C, 3)


@given(st.lists(st.integers(0, 20), min_size=1, max_size=6), st.integers(1, 200), st.floats(1.0, 2.0))
def test_one_hot_prefix_never_piles_up_on_one_worker(initial, n_requests, factor):
    """Every request shares one prefix, held by worker 0 only: no worker's load ever exceeds the bound."""
    loads = Counter({f"http://w{i}": v for i, v in enumerate(initial)})
    for _ in range(n_requests):
        eps = [EndpointState(u, in_flight=v) for u, v in loads.items()]
        bound = load_bound(eps, factor)
        d = prefix(eps, {"http://w0": 50}, factor)
        if loads[d.url] + 1 > bound:  # only when every worker already is at the bound
            assert all(v + 1 > bound for v in loads.values())
        loads[d.url] += 1


@given(st.dictionaries(st.sampled_from([A, B, C]), st.integers(0, 10), min_size=1),
       st.dictionaries(st.sampled_from([A, B, C]), st.integers(0, 10)))
def test_prefix_picks_a_maximal_match_among_workers_under_the_bound(loads, matched):
    eps = [EndpointState(u, in_flight=v) for u, v in loads.items()]
    bound = load_bound(eps, 1.25)
    d = prefix(eps, matched)
    under = [e for e in eps if e.load + 1 <= bound]
    assert d.url in {e.url for e in under}
    assert d.matched_blocks == max(matched.get(e.url, 0) for e in under)


def test_cold_prefixes_spread_by_rendezvous_and_each_stays_put():
    eps = states(a=0, b=0, c=0)
    picks = {h: prefix(eps, {}, affinity=h).url for h in range(40)}
    assert set(picks.values()) == {A, B, C}
    assert all(prefix(list(reversed(eps)), {}, affinity=h).url == u for h, u in picks.items())
    assert prefix(states(a=0, b=1, c=1), {}, affinity=next(h for h, u in picks.items() if u == B)).url == A
