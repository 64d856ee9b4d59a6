"""Block manager edge cases that mutation testing found unchecked (docs/testing.md)."""

from __future__ import annotations

import pytest
from kv_model import Sim

from hetero_infer import SamplingParams
from hetero_infer.worker.core.block_manager import BlockManager
from hetero_infer.worker.core.sequence import Sequence


def seq(tokens: list[int]) -> Sequence:
    return Sequence("s", list(tokens), len(tokens), SamplingParams(), 4)


@pytest.mark.parametrize("num_blocks, block_size", [(0, 4), (4, 0), (0, 0)])
def test_an_empty_pool_or_block_is_rejected(num_blocks, block_size):
    with pytest.raises(ValueError):
        BlockManager(num_blocks, block_size)


def test_the_smallest_pool_works():
    sim = Sim(num_blocks=1, block_size=1)
    sim.add([3], max_tokens=1)
    sim.run()


def test_a_full_prompt_hit_still_computes_its_newest_token():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = seq(list(range(8)))
    bm.admit(a, bm.lookup_prefix(a))
    bm.allocate_slots(a, 8)
    a.num_computed_tokens = 8
    bm.register_computed_blocks(a)
    b = seq(list(range(8)))  # the same 8 tokens: block 1 holds the newest token, which must be computed
    assert bm.lookup_prefix(b) == a.block_table[:1]


def test_evicted_blocks_leave_the_prefix_cache():
    sim = Sim(num_blocks=4, block_size=4)
    a = sim.add([1, 2, 3, 4, 5, 6, 0, 1, 2], max_tokens=1)
    sim.run()
    sim.add([6] * 15, max_tokens=1)  # takes every block: a's cached blocks are evicted
    sim.run()
    again = sim.add(a.token_ids[:9], max_tokens=1)
    sim.run()  # Sim checks what it reads; nothing is left to hit
    assert again.num_cached_tokens == 0


def test_a_prefix_hit_stops_at_the_first_miss():
    # a and b computed the same first block at the same time: a's copy is registered, b's block 1
    # (other tokens) too. Once a's blocks are evicted, b's block 1 alone must not be a hit.
    bm = BlockManager(num_blocks=6, block_size=4)
    a, b = seq([0, 1, 2, 3, 4, 5, 6, 7, 1]), seq([0, 1, 2, 3, 9, 9, 9, 9, 1])
    for s in (a, b):
        bm.admit(s, bm.lookup_prefix(s))
        bm.allocate_slots(s, 9)
    for s in (a, b):
        s.num_computed_tokens = 8
        bm.register_computed_blocks(s)
    bm.free(a)
    d = seq([5] * 12)
    bm.admit(d, [])
    assert bm.allocate_slots(d, 12)  # evicts a's three blocks
    assert bm.lookup_prefix(seq(b.token_ids)) == []


def test_a_double_free_is_caught():
    bm = BlockManager(num_blocks=4, block_size=4)
    a = seq([1, 2, 3])
    bm.admit(a, [])
    bm.allocate_slots(a, 3)
    alias = seq([1, 2, 3])
    alias.block_table = list(a.block_table)  # shared without fork(): no reference taken
    bm.free(a)
    with pytest.raises(AssertionError, match="freed twice"):
        bm.free(alias)


def test_free_resets_the_sequence():
    bm = BlockManager(num_blocks=4, block_size=2)
    a = seq([1, 2, 3, 4, 5])
    bm.admit(a, [])
    bm.allocate_slots(a, 5)
    a.num_computed_tokens = 5
    bm.register_computed_blocks(a)
    assert a.num_registered_blocks == 2
    bm.free(a)
    assert (a.block_table, a.num_computed_tokens, a.num_registered_blocks) == ([], 0, 0)
    assert bm.num_free_blocks == 4


def test_usage_and_prefix_counters():
    bm = BlockManager(num_blocks=4, block_size=4)
    assert bm.usage == 0.0 and (bm.prefix_queries, bm.prefix_hits) == (0, 0)
    a = seq(list(range(9)))
    bm.admit(a, bm.lookup_prefix(a))
    bm.allocate_slots(a, 9)
    assert bm.usage == 0.75
    a.num_computed_tokens = 9
    bm.register_computed_blocks(a)
    b = seq(list(range(9)))
    bm.admit(b, bm.lookup_prefix(b))
    assert (bm.prefix_queries, bm.prefix_hits) == (18, 8)
    assert bm.usage == 0.75  # b shares a's two full blocks


def test_eviction_takes_the_least_recently_freed_block():
    bm = BlockManager(num_blocks=3, block_size=2)
    old, new = seq([1, 2, 7]), seq([3, 4, 7])
    for s in (old, new):
        bm.admit(s, [])
        bm.allocate_slots(s, 2)
        s.num_computed_tokens = 2
        bm.register_computed_blocks(s)
    new_block = new.block_table[0]
    bm.free(old)
    bm.free(new)
    fresh = seq([5, 6])
    bm.admit(fresh, [])
    bm.allocate_slots(fresh, 2)  # the never-used block, then...
    other = seq([8, 9])
    bm.admit(other, [])
    bm.allocate_slots(other, 2)  # ...old's block: new's stays cached
    assert bm.lookup_prefix(seq([3, 4, 7])) == [new_block]
    assert bm.lookup_prefix(seq([1, 2, 7])) == []
