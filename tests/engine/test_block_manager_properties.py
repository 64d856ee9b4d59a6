"""Property tests of the block manager and scheduler invariants (no model: a simulated step)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from kv_model import check_refcounts

from hetero_infer.contracts.sampling_params import SamplingParams
from hetero_infer.worker.core.block_manager import BlockManager
from hetero_infer.worker.core.scheduler import Scheduler
from hetero_infer.worker.core.sequence import Sequence, SequenceStatus


def fake_token(seq: Sequence) -> int:
    return (seq.token_ids[-1] * 7 + seq.num_tokens) % 50


@settings(max_examples=60, deadline=None)
@given(
    num_blocks=st.integers(8, 40),
    block_size=st.sampled_from([1, 2, 4, 16]),
    max_num_seqs=st.integers(1, 8),
    budget=st.integers(1, 64),
    requests=st.lists(
        st.tuples(st.integers(1, 40), st.integers(1, 12), st.integers(1, 3), st.integers(0, 3)),
        min_size=1, max_size=12,
    ),
    abort_steps=st.sets(st.integers(0, 60), max_size=5),
)
def test_scheduler_and_block_invariants(num_blocks, block_size, max_num_seqs, budget, requests, abort_steps):
    bm = BlockManager(num_blocks, block_size)
    sched = Scheduler(bm, max_num_seqs, budget, memory_threshold=0.9)
    live: list[Sequence] = []
    for i, (prompt_len, max_tokens, n, prefix_kind) in enumerate(requests):
        if bm.blocks_for(prompt_len + max_tokens) > num_blocks:
            continue  # the engine rejects what cannot fit alone
        prompt = [prefix_kind] * min(prompt_len, 8) + [(i * 13 + j) % 50 for j in range(max(prompt_len - 8, 0))]
        params = SamplingParams(max_tokens=max_tokens, n=n)
        samples = [Sequence(str(i), list(prompt), len(prompt), params, max_tokens, sample_index=k) for k in range(n)]
        for seq in samples:  # fanned out as LLMEngine.add_request does
            seq.prompt_leader = samples[0] if seq is not samples[0] else None
            sched.add(seq)
            live.append(seq)

    for step in range(400):
        if not sched.has_unfinished():
            break
        out = sched.schedule()
        assert out.num_tokens <= budget
        assert len(sched.running) <= max_num_seqs  # every sample of an n > 1 request counts
        assert len({s.seq.seq_id for s in out.scheduled}) == len(out.scheduled)
        assert out.scheduled or out.num_preempted or not sched.running, "running sequences but nothing scheduled"
        for item in out.scheduled:
            seq = item.seq
            assert seq.status is SequenceStatus.RUNNING
            assert len(seq.block_table) * block_size >= seq.num_computed_tokens + item.num_new_tokens
        check_refcounts(bm, [s for s in live if not s.is_finished])
        for item in out.scheduled:
            seq = item.seq
            samples = item.samples
            seq.num_computed_tokens += item.num_new_tokens
            bm.register_computed_blocks(seq)
            if not samples:
                continue
            seq.token_ids.append(fake_token(seq) + seq.sample_index)
            if seq.num_output_tokens >= seq.max_tokens:
                sched.finish(seq, "length")
        if step in abort_steps:
            victims = [s for s in live if not s.is_finished][:1]
            for v in victims:
                sched.finish(v, "abort")
        check_refcounts(bm, [s for s in live if not s.is_finished])
    assert not sched.has_unfinished(), "requests left unfinished: starvation or deadlock"
    assert bm.num_free_blocks == num_blocks, "blocks leaked"
    assert all(b.ref_count == 0 for b in bm.blocks)


def test_prefix_cache_reuses_and_evicts_lru():
    bm = BlockManager(num_blocks=6, block_size=4)
    a = Sequence("a", list(range(10)), 10, SamplingParams(), 4)
    bm.admit(a, bm.lookup_prefix(a))
    assert bm.allocate_slots(a, 10)
    a.num_computed_tokens = 10
    bm.register_computed_blocks(a)
    bm.free(a)
    b = Sequence("b", list(range(9)) + [99], 10, SamplingParams(), 4)
    hits = bm.lookup_prefix(b)
    assert len(hits) == 2  # two full blocks of 4 shared
    bm.admit(b, hits)
    assert b.num_computed_tokens == 8
    # fresh allocations take the oldest free blocks first and evict their hashes
    c = Sequence("c", [7] * 16, 16, SamplingParams(), 4)
    bm.admit(c, bm.lookup_prefix(c))
    assert bm.allocate_slots(c, 16)
    assert bm.num_free_blocks == 0
    assert not bm.allocate_slots(b, 5)  # no room: no change
    assert len(b.block_table) == 2


def test_copy_on_write_for_shared_partial_block():
    bm = BlockManager(num_blocks=8, block_size=4)
    parent = Sequence("p", [1, 2, 3, 4, 5, 6], 6, SamplingParams(n=2), 4)
    bm.admit(parent, [])
    bm.allocate_slots(parent, 6)
    parent.num_computed_tokens = 6
    child = Sequence("p", list(parent.token_ids), 6, SamplingParams(n=2), 4)
    bm.fork(parent, child)
    assert bm.take_table_updates() == {parent.seq_id: (0, parent.block_table), child.seq_id: (0, child.block_table)}
    assert bm.blocks[parent.block_table[1]].ref_count == 2
    parent.token_ids.append(9)
    assert bm.allocate_slots(parent, 1)
    copies = bm.take_pending_copies()
    assert len(copies) == 1 and copies[0][0] == child.block_table[1]
    assert parent.block_table[0] == child.block_table[0] and parent.block_table[1] != child.block_table[1]
    assert bm.take_table_updates() == {parent.seq_id: (1, parent.block_table[1:])}  # the block replaced
    child.token_ids.append(8)
    assert bm.allocate_slots(child, 1)  # now the sole owner: writes in place
    assert bm.take_pending_copies() == [] and bm.take_table_updates() == {}


def test_kv_waste_is_at_most_one_partial_block_per_sequence():
    bm = BlockManager(num_blocks=64, block_size=16)
    seqs = []
    for n in (1, 15, 16, 17, 100):
        s = Sequence(str(n), [3] * n, n, SamplingParams(), 1)
        bm.admit(s, [])
        bm.allocate_slots(s, n)
        seqs.append(s)
    allocated, wasted = bm.slot_waste(seqs)
    assert allocated == 16 * (1 + 1 + 1 + 2 + 7)
    assert wasted == 15 + 1 + 0 + 15 + 12


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 40), min_size=0, max_size=12, unique=True), st.integers(0, 200)),
                min_size=0, max_size=8))
def test_slot_waste_counts_each_block_once_with_its_first_holder(tables):
    """Against the definition, block by block: shared blocks (prefix caching, n > 1) count once, with the
    tokens of the first sequence that holds them; blocks past a sequence's tokens (allocated ahead) hold none."""
    bm = BlockManager(num_blocks=64, block_size=16)
    seqs = []
    for i, (table, n) in enumerate(tables):
        s = Sequence(str(i), [3] * max(n, 1), max(n, 1), SamplingParams(), 1)
        s.block_table = list(table)
        seqs.append(s)
    seen, used = set(), 0
    for s in seqs:
        for j, b in enumerate(s.block_table):
            if b not in seen:
                seen.add(b)
                used += min(16, max(s.num_tokens - 16 * j, 0))
    assert bm.slot_waste(seqs) == (16 * len(seen), 16 * len(seen) - used)
