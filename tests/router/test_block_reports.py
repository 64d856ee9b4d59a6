"""From the engine's prefix cache to the router's index, without I/O: real `BlockManager`s (small pools, so
blocks are evicted), their cache changes handed over into a `BlockLog` (what the busy loop and the engine client
do), reported and polled into a `PrefixIndex` (what the worker's endpoint and the router's poll loop do).

Hypothesis drives any interleaving of requests (shared prefixes, evictions), frees, hand-overs, polls, lost
reports, worker deaths and restarts: after each hand-over the log holds exactly the engine's cached hashes, and
once every live worker has been polled the index holds exactly the union of their caches, per worker."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hetero_infer.contracts.block_hashes import BlockLog, block_hashes
from hetero_infer.router.index import PrefixIndex
from hetero_infer.worker.core.block_manager import BlockManager
from hetero_infer.worker.core.sequence import Sequence

BLOCK = 4
WORKERS = ("w0", "w1")
PREFIXES = ([1] * 8, [2] * 8, [3, 4] * 6)


class Engine:
    """One worker's engine side: a block manager serving requests, and the client-side log of its cache."""

    def __init__(self, life: int) -> None:
        self.bm = BlockManager(num_blocks=10, block_size=BLOCK)
        self.log = BlockLog(epoch=f"life-{life}")
        self.running: list[Sequence] = []
        self.alive = True
        self.n = 0

    def run(self, prefix: int, tail: list[int], decode: int, keep: bool) -> None:
        """Admit a request, prefill it, decode `decode` tokens; it finishes, or with `keep` stays running
        (holding its blocks)."""
        bm = self.bm
        ids = PREFIXES[prefix] + tail
        self.n += 1
        seq = Sequence(str(self.n), list(ids), len(ids), None, 64)
        hits = bm.lookup_prefix(seq)
        if not bm.can_admit(seq, hits, len(ids) - len(hits) * BLOCK):
            return
        bm.admit(seq, hits)
        for _ in range(decode + 1):
            new = seq.num_tokens - seq.num_computed_tokens
            if not bm.allocate_slots(seq, new):
                break
            seq.num_computed_tokens = seq.num_tokens
            bm.register_computed_blocks(seq)
            seq.token_ids.append(5 + len(seq.token_ids) % 3)
        if keep:
            self.running.append(seq)
        else:
            bm.free(seq)

    def finish_oldest(self) -> None:
        if self.running:
            self.bm.free(self.running.pop(0))

    def hand_over(self) -> None:
        self.log.apply(*self.bm.take_cache_changes())
        assert self.log.present == set(self.bm.hash_to_block)

    def cached(self) -> frozenset[int]:
        return frozenset(self.bm.hash_to_block)


def poll(index: PrefixIndex, name: str, engine: Engine) -> None:
    """The router's poll: ask from its cursor; a refused delta is followed by a snapshot."""
    report = engine.log.report(*(index.cursor(name) or (None, None)))
    if not index.apply(name, report):
        assert index.apply(name, engine.log.report())


op = st.one_of(
    st.tuples(st.just("run"), st.sampled_from(WORKERS),
              st.tuples(st.integers(0, len(PREFIXES) - 1), st.lists(st.integers(6, 9), max_size=9),
                        st.integers(0, 6), st.booleans())),
    st.tuples(st.just("finish"), st.sampled_from(WORKERS), st.none()),
    st.tuples(st.just("hand_over"), st.sampled_from(WORKERS), st.none()),
    st.tuples(st.just("poll"), st.sampled_from(WORKERS), st.none()),
    st.tuples(st.just("lost"), st.sampled_from(WORKERS), st.none()),
    st.tuples(st.just("die"), st.sampled_from(WORKERS), st.none()),
    st.tuples(st.just("restart"), st.sampled_from(WORKERS), st.none()),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(op, max_size=60))
def test_after_polls_the_index_is_exactly_each_live_engines_cache(ops):
    lives = iter(range(10**6))
    engines = {w: Engine(next(lives)) for w in WORKERS}
    index = PrefixIndex()
    for kind, name, arg in ops:
        engine = engines[name]
        if kind == "restart":
            index.drop(name)  # the router saw it leave; the new life starts with an empty cache and a new epoch
            engines[name] = Engine(next(lives))
        elif not engine.alive:
            continue
        elif kind == "run":
            engine.run(*arg)
        elif kind == "finish":
            engine.finish_oldest()
        elif kind == "hand_over":
            engine.hand_over()
        elif kind == "poll":
            engine.hand_over()
            poll(index, name, engine)
            assert index.blocks(name) == engine.cached()
        elif kind == "lost":
            engine.hand_over()
            engine.log.report(*(index.cursor(name) or (None, None)))  # answered, never arrived
        elif kind == "die":
            engine.alive = False
            index.drop(name)
    for name, engine in engines.items():
        if engine.alive:
            engine.hand_over()
            poll(index, name, engine)
    union = set().union(*(engines[w].cached() for w in WORKERS if engines[w].alive))
    assert set().union(*(index.blocks(w) for w in WORKERS)) == union
    for name, engine in engines.items():
        assert index.blocks(name) == (engine.cached() if engine.alive else frozenset())


def test_the_engines_hashes_are_the_routers_hashes_of_the_prompt():
    engine = Engine(0)
    engine.run(2, [7, 8, 9, 6, 7], 0, True)
    prompt = PREFIXES[2] + [7, 8, 9, 6, 7]
    engine.hand_over()
    assert engine.log.present == set(block_hashes(prompt, BLOCK))
