"""The host KV tier (--kv-offloading-size) in the block manager: cached blocks evicted from the pool are saved
there and restored instead of recomputed; the modelled pools (tests/engine/kv_model.py) check that every block a
sequence reads holds its own tokens, whatever order adds, steps, forks, preemptions and aborts come in, and
that the KV events rebuild both pools exactly."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kv_model import Sim
from test_scheduler_kv_contents import OPS

from hetero_infer.worker.core.block_manager import BlockManager, HostHit
from hetero_infer.worker.core.host_tier import HostTier


@settings(max_examples=300, deadline=None)
@given(
    num_blocks=st.integers(4, 16),
    block_size=st.sampled_from([1, 2, 4]),
    host_blocks=st.integers(1, 24),
    max_num_seqs=st.integers(1, 6),
    budget=st.integers(1, 32),
    ops=st.lists(OPS, min_size=1, max_size=24),
    defer_restored=st.booleans(),
)
def test_both_pools_hold_what_their_hashes_promise(num_blocks, block_size, host_blocks, max_num_seqs, budget, ops,
                                                   defer_restored):
    # defer_restored: a restored request computes from the next step (CUDA, whose tier copies are asynchronous)
    sim = Sim(num_blocks, block_size, max_num_seqs, budget, memory_threshold=0.9, host_blocks=host_blocks,
              record_events=True, defer_restored=defer_restored)
    sim.play(ops)
    assert all(s.is_finished for s in sim.seqs)
    assert len(sim.bm.host) <= host_blocks


def test_a_deferred_restore_computes_from_the_next_step():
    sim = Sim(num_blocks=8, block_size=4, max_num_seqs=2, host_blocks=8, defer_restored=True)
    first = list(range(1, 13))
    sim.add(first, max_tokens=1)
    sim.run()
    sim.add(list(range(50, 75)), max_tokens=1)  # 7 blocks: evicts the first prompt's blocks to the tier
    sim.run()
    decoder = sim.add([90, 91, 92, 93], max_tokens=6)
    sim.step()
    again = sim.add(first + [9], max_tokens=1)
    out = sim.step()
    assert out.block_moves.restores and [item.seq for item in out.scheduled] == [decoder]  # restored behind it
    assert again.num_computed_tokens == 12 and again.status.name == "RUNNING"
    out = sim.step()
    assert (again, 1) in [(item.seq, item.num_new_tokens) for item in out.scheduled]  # its last token only
    assert not out.block_moves.restores
    sim.run()
    # alone, a restored request is computed in the step that restores it (nothing to overlap)
    sim.add(list(range(50, 75)), max_tokens=1)
    sim.run()
    alone = sim.add(first + [9, 9], max_tokens=1)
    out = sim.step()
    assert out.block_moves.restores and [item.seq for item in out.scheduled] == [alone]


def test_an_evicted_prefix_is_restored_not_recomputed():
    sim = Sim(num_blocks=4, block_size=4, max_num_seqs=1, host_blocks=8, record_events=True)
    a = sim.add(list(range(1, 13)), max_tokens=1)  # 12 tokens: 3 blocks, 2 of them shareable by a repeat
    sim.run()
    sim.add([6, 6, 6, 6, 5, 5, 5, 5, 4, 4, 4, 4, 3], max_tokens=1)  # evicts a's blocks: saved to the host
    sim.run()
    assert sim.bm.blocks_saved >= 2 and not any(h in sim.bm.hash_to_block for h in a.block_hashes[:2])
    b = sim.add(list(range(1, 13)), max_tokens=1)
    sim.step()
    assert b.num_cached_tokens == 8 and sim.bm.host_hits == 8 and sim.bm.blocks_restored == 2
    sim.run()


def test_a_restore_in_a_full_tier_never_reuses_the_slot_it_reads():
    """Slots read by this step's restores are pinned: a save the restore's own allocation causes takes another
    slot, or none (the block is then simply not saved)."""
    tier = HostTier(2)
    a, b = tier.save(11), tier.save(12)
    tier.pin(a)
    tier.pin(b)
    assert tier.save(13) is None and 11 in tier and 12 in tier
    tier.unpin_all()
    assert tier.save(13) == a and 11 not in tier and tier.take_dropped() == [11]


def test_lookup_continues_in_the_host_tier_after_the_pool_misses():
    sim = Sim(num_blocks=3, block_size=2, max_num_seqs=1, host_blocks=4)
    bm = sim.bm
    first = sim.add([1, 2, 3, 4, 5], max_tokens=1)
    sim.run()
    sim.add([7, 7, 7, 7, 7], max_tokens=1)  # takes the whole pool: [1, 2] and [3, 4] are saved
    sim.run()
    again = sim.add([1, 2, 3, 4, 5], max_tokens=1)
    hits = bm.lookup_prefix(again)
    assert [type(h) for h in hits] == [HostHit, HostHit]
    assert [h.hash for h in hits] == first.block_hashes[:2]
    sim.run()


def test_a_failed_step_leaves_no_hash_on_blocks_it_did_not_copy():
    sim = Sim(num_blocks=3, block_size=2, max_num_seqs=1, host_blocks=4, record_events=True)
    sim.add([1, 2, 3, 4, 5], max_tokens=1)
    sim.run()
    sim.add([7, 7, 7, 7, 7], max_tokens=1)
    sim.run()
    again = sim.add([1, 2, 3, 4, 5], max_tokens=1)
    out = sim.sched.schedule()
    assert out.block_moves.restores
    sim.bm.discard_moves(out.block_moves)
    for _, block in out.block_moves.restores:
        assert sim.bm.blocks[block].hash is None
    sim.sched.finish(again, "abort")
    sim.check_events()
    assert not set(again.block_hashes[:2]) & set(sim.bm.hash_to_block)


@pytest.mark.parametrize("bad", [-1])
def test_a_negative_tier_is_refused(bad):
    with pytest.raises(ValueError):
        BlockManager(4, 4, host_blocks=bad)


def test_a_restore_takes_no_slot_a_save_of_the_same_step_writes():
    """A one-slot tier: restoring [1, 2] evicts one of [5, 5, 5, 5]'s cached blocks from the pool, whose save
    would take the only slot, the one being read (saves are copied before restores): it is not saved instead."""
    sim = Sim(num_blocks=3, block_size=2, max_num_seqs=1, host_blocks=1)
    sim.add([1, 2, 3], max_tokens=1)
    sim.run()
    sim.add([5, 5, 5, 5, 5], max_tokens=1)  # evicts [1, 2] into the slot
    sim.run()
    again = sim.add([1, 2, 3], max_tokens=1)
    sim.run()  # Sim.step checks that `again` reads its own tokens in the restored block
    assert again.num_cached_tokens == 2 and sim.bm.blocks_restored == 1
