"""The index's pending blocks (routed to a reporting worker, not yet in a report), their reconciliation by the
worker's reports, and what a placement would evict: the index against `BlockLog` alone."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hetero_infer.contracts.block_hashes import BlockLog, BlockReport
from hetero_infer.router.index import PrefixIndex


def poll(index: PrefixIndex, name: str, log: BlockLog) -> None:
    asked = index.now()
    report = log.report(*(index.cursor(name) or (None, None)))
    if not index.apply(name, report, asked):
        assert index.apply(name, log.report(), asked)


def test_a_route_is_seen_before_any_report_and_confirmed_by_the_one_that_holds_it():
    index, log = PrefixIndex(), BlockLog(epoch="e")
    poll(index, "w", log)
    route = index.record_route("w", [1, 2, 3])
    assert index.match([1, 2, 3, 4], ["w", "v"]) == {"w": 3, "v": 0}
    assert index.pending("w") == {1, 2, 3} and index.blocks("w") == frozenset()
    log.apply([1, 2], [])  # the worker cached two of them so far
    poll(index, "w", log)
    assert index.blocks("w") == {1, 2} and index.pending("w") == {3}  # 3: its request is still running
    index.ended(route)
    poll(index, "w", log)
    assert index.blocks("w") == {1, 2} and index.pending("w") == frozenset()  # never cached: dropped


def test_a_report_asked_for_before_the_request_ended_keeps_its_pending_blocks():
    index, log = PrefixIndex(), BlockLog(epoch="e")
    poll(index, "w", log)
    route = index.record_route("w", [5, 6])
    asked = index.now()
    report = log.report(*index.cursor("w"))
    index.ended(route)  # the request ended while the report was on its way
    assert index.apply("w", report, asked)
    assert index.pending("w") == {5, 6}
    log.apply([5, 6], [])
    poll(index, "w", log)
    assert index.blocks("w") == {5, 6} and index.pending("w") == frozenset()


def test_a_block_already_reported_is_not_pending_and_pending_is_bounded_by_the_pool():
    index, log = PrefixIndex(), BlockLog(epoch="e")
    log.apply([1], [])
    poll(index, "w", log)
    index.set_pool("w", 3)
    index.record_route("w", [1, 2, 3, 4, 5])
    assert index.pending("w") == {3, 4, 5}  # the oldest beyond the pool's size forgotten; 1 is confirmed
    assert index.match([1, 2], ["w"]) == {"w": 1}


def test_a_worker_that_leaves_takes_its_pending_blocks_with_it():
    index, log = PrefixIndex(), BlockLog(epoch="e")
    poll(index, "w", log)
    index.record_route("w", [1])
    index.drop("w")
    assert index.match([1], ["w"]) == {"w": 0} and index.pending("w") == frozenset()


# A worker that caches any subset of what is routed to it, evicts anything, and is polled at any moment.
op = st.one_of(
    st.tuples(st.just("route"), st.lists(st.integers(0, 20), max_size=5), st.just(())),
    st.tuples(st.just("cache"), st.integers(0, 50), st.just(())),  # cache some of an open route's blocks
    st.tuples(st.just("evict"), st.integers(0, 20), st.just(())),
    st.tuples(st.just("end"), st.integers(0, 50), st.just(())),
    st.tuples(st.just("poll"), st.just(0), st.just(())),
)


@settings(max_examples=120, deadline=None)
@given(st.lists(op, max_size=50))
def test_pending_blocks_are_exactly_the_open_routes_unreported_blocks_after_a_poll(ops):
    """After any interleaving: a poll leaves as pending only blocks of routes still open (or ended after the poll
    was asked for) that the worker does not hold, the confirmed blocks are the worker's, and once every route
    has ended and a poll followed, nothing is pending."""
    index, log = PrefixIndex(), BlockLog(epoch="e")
    poll(index, "w", log)
    open_routes: list[tuple[object, list[int]]] = []
    for kind, arg, _ in ops:
        if kind == "route":
            open_routes.append((index.record_route("w", arg), arg))
        elif kind == "cache" and open_routes:
            _, hashes = open_routes[arg % len(open_routes)]
            log.apply([h for h in hashes if h not in log.present], [])
        elif kind == "evict" and arg in log.present:
            log.apply([], [arg])
        elif kind == "end" and open_routes:
            index.ended(open_routes.pop(arg % len(open_routes))[0])
        elif kind == "poll":
            poll(index, "w", log)
            assert index.blocks("w") == log.present
            open_blocks = {h for _, hashes in open_routes for h in hashes}
            assert index.pending("w") <= open_blocks - log.present
        assert not index.pending("w") & index.blocks("w")
    for route, _ in open_routes:
        index.ended(route)
    poll(index, "w", log)
    assert index.pending("w") == frozenset() and index.blocks("w") == log.present


def test_eviction_cost_fills_free_room_evenly_then_prefers_the_stalest_blocks():
    index = PrefixIndex()
    for w in ("a", "b"):
        index.apply(w, BlockReport("e", 0, None, ()))
        index.set_pool(w, 10)
    assert index.eviction_cost("a", 3) == -3  # empty: fits three times
    index.record_route("a", [1, 2, 3, 4])
    assert index.eviction_cost("a", 3) == -2 and index.eviction_cost("b", 3) == -3  # pending blocks take room
    index.apply("a", BlockReport("e", 1, 0, tuple(range(1, 9))))
    assert index.eviction_cost("a", 3) == -2  # 5..8 never routed (generated tokens): free room
    index.record_route("b", list(range(20, 28)))
    index.apply("b", BlockReport("e", 1, 0, tuple(range(20, 28))))
    index.record_route("a", [1, 2])  # routed again: now a's freshest
    # a: free 6, routed blocks 3, 4 (stalest), 1, 2; b: free 2, routed blocks 20..27 (routed after 3 and 4)
    assert index.eviction_cost("a", 7) < index.eviction_cost("b", 3)  # displaces 3 vs 20
    assert index.eviction_cost("a", 9) > index.eviction_cost("b", 3)  # displaces 1, routed after b's
    assert index.eviction_cost("a", 20) > index.eviction_cost("a", 9)  # more than it can free: the costliest


def test_text_chunk_memory_is_sized_from_the_workers_pool():
    index = PrefixIndex(approx_capacity=100, text_chunks_per_block=2.0)
    index.set_pool("w", 3)
    index.record_route("w", list(range(10)), exact=False)
    assert index.match(list(range(4, 10)), ["w"], exact=False) == {"w": 6}  # 3 blocks: 6 chunks kept
    assert index.match([3], ["w"], exact=False) == {"w": 0}
    index.record_route("v", list(range(10)), exact=False)  # pool unknown: the approximate capacity
    assert index.match(list(range(10)), ["v"], exact=False) == {"v": 10}
