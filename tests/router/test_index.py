"""The prefix index against simulated workers: after any interleaving of routes, evictions, polls, lost reports,
worker deaths and restarts, once every live worker has been polled, the index holds exactly each worker's
blocks (the workers' side is `BlockLog`, what a worker keeps to answer the report endpoint)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from hetero_infer.contracts.block_hashes import BlockLog, BlockReport
from hetero_infer.router.index import PrefixIndex

WORKERS = ("w0", "w1", "w2")


class SimWorker:
    def __init__(self, name: str, generation: int, max_events: int) -> None:
        self.log = BlockLog(max_events=max_events, epoch=f"{name}-{generation}")
        self.alive = True
        self.history = {0: frozenset()}  # seq -> blocks held then

    def change(self, h: int, add: bool) -> None:
        self.log.added(h) if add else self.log.removed(h)
        self.history[self.log.seq] = frozenset(self.log.present)


def check_consistent(index: PrefixIndex, workers: dict[str, SimWorker]) -> None:
    """At every moment the index holds what the last report it accepted from each live worker described, and
    nothing of a dead worker or an earlier life."""
    for name, worker in workers.items():
        cursor = index.cursor(name)
        if cursor is None or not worker.alive:
            assert index.blocks(name) == frozenset()
        else:
            assert cursor[0] == worker.log.epoch
            assert index.blocks(name) == worker.history[cursor[1]]


def poll(index: PrefixIndex, name: str, worker: SimWorker) -> None:
    """What the router's poll loop does: ask from its cursor; a refused delta is followed by a snapshot."""
    cursor = index.cursor(name)
    report = worker.log.report(*(cursor or (None, None)))
    if not index.apply(name, report):
        assert index.apply(name, worker.log.report())


op = st.one_of(
    st.tuples(st.just("route"), st.sampled_from(WORKERS), st.lists(st.integers(0, 30), max_size=6)),
    st.tuples(st.just("evict"), st.sampled_from(WORKERS), st.integers(0, 2**16)),
    st.tuples(st.just("poll"), st.sampled_from(WORKERS), st.just(0)),
    st.tuples(st.just("lost"), st.sampled_from(WORKERS), st.just(0)),
    st.tuples(st.just("die"), st.sampled_from(WORKERS), st.just(0)),
    st.tuples(st.just("restart"), st.sampled_from(WORKERS), st.just(0)),
    st.tuples(st.just("stale"), st.sampled_from(WORKERS), st.just(0)),
    st.tuples(st.just("overtaken"), st.sampled_from(WORKERS), st.integers(0, 30)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(op, max_size=60), st.integers(1, 8))
def test_index_equals_the_workers_blocks_after_any_interleaving(ops, max_events):
    index = PrefixIndex()
    generation = {w: 0 for w in WORKERS}
    workers = {w: SimWorker(w, 0, max_events) for w in WORKERS}
    old_reports: list[tuple[str, BlockReport]] = []
    for kind, name, arg in ops:
        worker = workers[name]
        if kind == "route" and worker.alive:
            for h in arg:
                worker.change(h, True)
        elif kind == "evict" and worker.alive and worker.log.present:
            for h in random.Random(arg).sample(sorted(worker.log.present), k=1 + arg % len(worker.log.present)):
                worker.change(h, False)
        elif kind == "poll" and worker.alive:
            poll(index, name, worker)
        elif kind == "lost" and worker.alive:  # a report computed, then lost on the way
            old_reports.append((name, worker.log.report(*(index.cursor(name) or (None, None)))))
        elif kind == "overtaken" and worker.alive:  # a report overtaken by the next one, then delivered
            slow = worker.log.report(*(index.cursor(name) or (None, None)))
            worker.change(arg, arg not in worker.log.present)
            poll(index, name, worker)
            index.apply(name, slow)
        elif kind == "die":
            worker.alive = False
            index.drop(name)
        elif kind == "restart":
            generation[name] += 1
            workers[name] = SimWorker(name, generation[name], max_events)
            index.drop(name)
        elif kind == "stale" and old_reports:  # a late delivery of a report lost earlier
            late_name, report = old_reports.pop(0)
            if not report.is_snapshot:
                index.apply(late_name, report)  # refused, or harmless when it continues the cursor
        check_consistent(index, workers)
    for name, worker in workers.items():
        if worker.alive:
            poll(index, name, worker)
        assert index.blocks(name) == (frozenset(worker.log.present) if worker.alive else frozenset())


def test_a_delta_that_skips_a_report_is_refused():
    index, log = PrefixIndex(), BlockLog(epoch="e")
    assert index.apply("w", log.report())
    log.added(1)
    skipped = log.report("e", 0)
    log.added(2)
    assert not index.apply("w", log.report("e", skipped.seq))
    assert index.blocks("w") == frozenset()


def test_a_delta_from_an_earlier_epoch_is_refused():
    index = PrefixIndex()
    assert index.apply("w", BlockReport("new", 0, None, ()))
    assert not index.apply("w", BlockReport("old", 5, 0, (7,), ()))
    assert index.blocks("w") == frozenset()


def test_approximate_entries_for_workers_that_do_not_report():
    index = PrefixIndex(approx_capacity=3)
    index.record_route("w", [1, 2])
    index.record_route("w", [3, 4])
    assert index.blocks("w") == {2, 3, 4}  # least recently routed dropped first
    index.record_route("w", [2])
    index.record_route("w", [5])
    assert index.blocks("w") == {2, 4, 5}
    index.apply("r", BlockReport("e", 0, None, (9,)))
    index.record_route("r", [1])  # a reporting worker's entry is only what it reports
    assert index.blocks("r") == {9}


def test_text_chunk_hashes_match_what_was_routed_even_to_reporting_workers():
    """Without a tokenizer a text prompt's hashes never appear in a report: they keep their own entries."""
    index = PrefixIndex()
    index.apply("r", BlockReport("e", 0, None, (9,)))
    index.record_route("r", [7, 8], exact=False)
    assert index.match([7, 8, 1], ["r", "s"], exact=False) == {"r": 2, "s": 0}
    assert index.match([7, 8], ["r"]) == {"r": 0} and index.blocks("r") == {9}
    index.drop("r")
    assert index.match([7, 8], ["r"], exact=False) == {"r": 0}


def test_match_counts_leading_blocks_only():
    index = PrefixIndex()
    index.apply("a", BlockReport("e", 0, None, (1, 2, 4)))
    index.apply("b", BlockReport("e", 0, None, (2, 3)))
    assert index.match([1, 2, 3, 4], ["a", "b", "c"]) == {"a": 2, "b": 0, "c": 0}


def test_a_report_in_another_scheme_or_block_size_is_not_taken():
    from hetero_infer.router.pool import parse_report

    log = BlockLog(epoch="e")
    log.added(5)
    assert parse_report(log.to_json(None, None, 16), 16) == BlockReport("e", 1, None, (5,), ())
    assert parse_report(log.to_json(None, None, 32), 16) is None
    assert parse_report({**log.to_json(None, None, 16), "hash": "python-hash"}, 16) is None


def test_the_text_index_remembers_what_a_pool_holds_of_text_denser_than_english():
    """Before the workers' tokenizer arrives prompts are hashed as 64-byte text chunks; the text index must not
    forget prefixes a pool still holds. Three prefixes of 368 tokens at 6.4 bytes a token (36 chunks each, 23 blocks
    each: 69 of a 112-block pool) with their tails are all still matched on their worker."""
    from hetero_infer.contracts.router_options import RouterOptions
    from hetero_infer.router.hashing import text_block_hashes

    options = RouterOptions()
    index = PrefixIndex(options.approx_capacity_blocks, options.text_chunks_per_block)
    index.set_pool("w", 112)
    rng = random.Random(5)
    prefixes = ["".join(rng.choice("abcdefghij klmnop") for _ in range(2360)) for _ in range(3)]
    for i in range(12):  # each prefix four times, each request with its own tail (a few chunks)
        prompt = prefixes[i % 3] + "".join(rng.choice("qrstuvwxyz ") for _ in range(280))
        index.ended(index.record_route("w", text_block_hashes(prompt, options.text_chunk_bytes), exact=False))
    for p in prefixes:
        hashes = text_block_hashes(p, options.text_chunk_bytes)
        assert index.match(hashes, ["w"], exact=False)["w"] == len(hashes)


def test_the_block_log_reports_the_host_tier_beside_the_pool() -> None:
    log = BlockLog()
    log.apply([1, 2], [], [3], [])
    first = log.report()
    assert (first.added, first.host_added) == ((1, 2), (3,))
    log.apply([], [2], [2, 4], [3])  # 2 evicted from the pool into the tier, 3 dropped from the tier
    delta = log.report(first.epoch, first.seq)
    assert (delta.added, delta.removed, delta.host_added, delta.host_removed) == ((), (2,), (2, 4), (3,))
    index = PrefixIndex()
    assert index.apply("w", first) and index.apply("w", delta)
    assert index.blocks("w") == {1} and index.host_blocks("w") == {2, 4}
    assert log.report().host_added == (2, 4)
