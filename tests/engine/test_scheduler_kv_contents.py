"""The KV cache holds what each sequence reads: targeted cases and a property over random interleavings.

Everything runs the real Scheduler and BlockManager against the slot-by-slot KV model of
kv_model.py (no neural model): each case below fails when the bookkeeping it names is broken
(see docs/testing.md for the mutations each one kills).
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from kv_model import Sim

from hetero_infer.worker.core.sequence import SequenceStatus


def test_prefix_cache_never_offers_a_block_before_its_kv_is_computed():
    # A's 10-token prompt is prefilled in chunks of 6: after the first chunk block 1 holds only
    # positions 4-5. B, with the same prompt, may reuse block 0 but not block 1 yet.
    sim = Sim(num_blocks=16, block_size=4, budget=6)
    prompt = [1, 2, 3, 4, 5, 6, 0, 1, 2, 3]
    a = sim.add(prompt, max_tokens=2)
    sim.step()
    assert a.num_computed_tokens == 6
    b = sim.add(prompt, max_tokens=2)
    sim.step()  # B is admitted with its cached prefix and reads it before this step's writes
    assert b.num_cached_tokens == 4
    sim.run()
    assert a.output_token_ids == b.output_token_ids


def test_samples_of_one_request_share_full_prompt_blocks_and_write_their_own_partial_block():
    # n=3 samples share the prompt's full block 0 through the prefix cache; block 1 (partial) is each one's own
    sim = Sim(num_blocks=16, block_size=4)
    first = sim.add([1, 2, 3, 4, 5, 6], max_tokens=5, n=3)
    sim.step()  # the first sample's prompt
    sim.step()  # the others, from the cache
    samples = [s for s in sim.seqs if s.request_id == first.request_id]
    assert len({s.block_table[0] for s in samples}) == 1 and len({s.block_table[1] for s in samples}) == 3
    sim.run()
    assert len({tuple(s.output_token_ids) for s in samples}) == 3


def test_preempted_sequence_is_requeued_ahead_of_new_requests():
    # two running sequences grow until the pool is short; the newest is preempted and must
    # wait ahead of C, which arrived later and has never run
    sim = Sim(num_blocks=4, block_size=4, max_num_seqs=2, memory_threshold=1.0)
    a = sim.add([1, 2, 3], max_tokens=9)
    b = sim.add([4, 5, 6], max_tokens=9)
    c = sim.add([6, 5], max_tokens=2)
    for _ in range(20):
        out = sim.step()  # Sim.step checks the FCFS order of the waiting queue
        if out.num_preempted:
            break
    assert out.num_preempted == 1 and b.status is SequenceStatus.WAITING
    assert list(sim.sched.waiting) == [b, c]
    sim.run()
    assert a.num_preemptions == 0 and b.num_preemptions == 1


def test_forked_child_hashes_its_own_blocks_after_it_diverges():
    # parent and child diverge inside block 1; the child is preempted, then readmitted from the
    # prefix cache: its lookup must use hashes of its own tokens, never its parent's
    sim = Sim(num_blocks=4, block_size=4, memory_threshold=1.0)
    parent = sim.add([1, 2, 3, 4, 5, 6], max_tokens=8, n=2)
    sim.run()
    child = next(s for s in sim.seqs if s is not parent)
    assert child.num_preemptions >= 1
    assert child.output_token_ids != parent.output_token_ids
    assert parent.block_hashes[0] == child.block_hashes[0]
    assert parent.block_hashes[1] != child.block_hashes[1]


def test_prefix_hits_on_generated_tokens_hold_the_same_tokens():
    # a later prompt that repeats an earlier sequence's prompt and output reuses its full blocks
    sim = Sim(num_blocks=32, block_size=4)
    a = sim.add([3, 1, 4, 1, 5], max_tokens=8, n=2)
    sim.run()
    for seq in list(sim.seqs):
        sim.add(list(seq.token_ids), max_tokens=3)
    sim.run()
    later = sim.seqs[-2:]
    assert [s.num_cached_tokens for s in later] == [12, 12]
    assert a.num_tokens == 13


OPS = st.one_of(
    st.tuples(st.just("add"), st.integers(1, 24), st.integers(1, 10), st.integers(1, 3), st.integers(0, 6)),
    st.tuples(st.just("repeat"), st.integers(0, 50), st.integers(1, 30), st.integers(1, 6)),
    st.tuples(st.just("step"), st.integers(1, 4)),
    st.tuples(st.just("abort"), st.integers(0, 50)),
)


@settings(max_examples=300, deadline=None)
@given(
    num_blocks=st.integers(4, 24),
    block_size=st.sampled_from([1, 2, 4, 8]),
    max_num_seqs=st.integers(1, 6),
    budget=st.integers(1, 32),
    prefix_caching=st.booleans(),
    ops=st.lists(OPS, min_size=1, max_size=24),
)
def test_kv_contents_under_any_interleaving(num_blocks, block_size, max_num_seqs, budget, prefix_caching, ops):
    """Adds (fresh prompts or repeats of earlier sequences' tokens), steps, forks (n > 1) and aborts in
    any order, with a small pool (preemption): every read sees the reader's own tokens (Sim.step),
    the waiting queue keeps FCFS order, and everything finishes without leaking a block."""
    sim = Sim(num_blocks, block_size, max_num_seqs, budget, memory_threshold=0.9,
              enable_prefix_caching=prefix_caching)
    sim.play(ops)
    assert all(s.is_finished for s in sim.seqs)
