"""The scheduler's rules one at a time: token budget, max_num_seqs, memory threshold, order, counters.

Each case drives the real Scheduler and BlockManager through kv_model.Sim (which also checks the
KV contents and FCFS order at every step) and pins one rule that a mutation of scheduler.py
would break.
"""

from __future__ import annotations

from kv_model import Sim

from hetero_infer.worker.core.sequence import SequenceStatus


def decoding_pair(budget: int) -> Sim:
    sim = Sim(num_blocks=16, block_size=4, budget=budget)
    sim.add([1, 2], max_tokens=6)
    sim.add([3, 4], max_tokens=6)
    while any(s.is_prefill or s.status is SequenceStatus.WAITING for s in sim.live):
        sim.step()
    return sim


def test_decodes_share_the_token_budget_exactly():
    out = decoding_pair(budget=2).step()
    assert [s.num_new_tokens for s in out.scheduled] == [1, 1]
    sim = decoding_pair(budget=2)
    sim.sched.max_num_batched_tokens = 1
    out = sim.step()  # the budget runs out after the first decode: no zero-token entry for the second
    assert [s.num_new_tokens for s in out.scheduled] == [1]


def test_no_admission_once_the_budget_is_spent():
    sim = decoding_pair(budget=2)
    late = sim.add([5, 6], max_tokens=2)
    out = sim.step()
    assert late.status is SequenceStatus.WAITING and all(s.seq is not late for s in out.scheduled)


def test_num_decodes_counts_the_leading_decodes():
    sim = decoding_pair(budget=8)
    sim.add([1, 2, 3, 4, 5, 6, 0], max_tokens=2)
    out = sim.step()
    assert [s.num_new_tokens for s in out.scheduled] == [1, 1, 6]
    assert sim.last_num_decodes == 2 and out.num_tokens == 8


def test_admission_stops_at_max_num_seqs():
    sim = Sim(num_blocks=32, block_size=4, max_num_seqs=2, budget=64)
    seqs = [sim.add([i, i + 1], max_tokens=3) for i in range(3)]
    out = sim.step()
    assert [s.seq for s in out.scheduled] == seqs[:2] and len(sim.sched.running) == 2
    sim.run()


def test_default_memory_threshold_admits_while_the_pool_has_room():
    sim = Sim(num_blocks=10, block_size=4, memory_threshold=None)  # the Scheduler's default (0.9)
    seqs = [sim.add([i] * 6, max_tokens=2) for i in range(4)]  # 2 blocks each: up to 60% before the 4th
    out = sim.step()
    assert [s.seq for s in out.scheduled] == seqs
    sim.run()


def test_default_memory_threshold_holds_back_admission_at_90_percent():
    sim = Sim(num_blocks=10, block_size=4, memory_threshold=None)
    a = sim.add([1] * 33, max_tokens=2)  # 9 blocks
    b = sim.add([2], max_tokens=1)  # would fit in the 10th
    out = sim.step()
    assert [s.seq for s in out.scheduled] == [a] and b.status is SequenceStatus.WAITING
    sim.run()


def test_memory_threshold_holds_back_admission_only_while_something_runs():
    sim = Sim(num_blocks=8, block_size=4, budget=64, memory_threshold=0.5)
    a = sim.add([1] * 16, max_tokens=4)  # 4 blocks: exactly 50% used
    b = sim.add([2], max_tokens=1)
    out = sim.step()
    assert [s.seq for s in out.scheduled] == [a]
    assert b.status is SequenceStatus.WAITING
    sim.run()  # once a finishes, b gets in with nothing running, whatever the usage
    assert b.is_finished and b.num_output_tokens == 1


def test_aborting_a_waiting_request_takes_it_off_the_queue():
    sim = Sim(num_blocks=8, block_size=4, max_num_seqs=1)
    a = sim.add([1, 2], max_tokens=3)
    b = sim.add([3, 4], max_tokens=3)
    sim.step()
    sim.abort(b)
    assert list(sim.sched.waiting) == [] and b.finish_reason == "abort"
    sim.run()
    assert b.num_computed_tokens == 0 and b.num_output_tokens == 0 and a.num_output_tokens == 3


def test_preemption_counts_once_per_preemption():
    sim = Sim(num_blocks=4, block_size=4, max_num_seqs=2, memory_threshold=1.0)
    sim.add([1, 2, 3], max_tokens=9)
    b = sim.add([4, 5, 6], max_tokens=9)
    preempted = 0
    while sim.sched.has_unfinished():
        preempted += sim.step().num_preempted
    assert preempted == b.num_preemptions == sim.sched.num_preemptions_total == 1


def test_every_sample_of_an_n_request_counts_against_max_num_seqs():
    sim = Sim(num_blocks=32, block_size=4, max_num_seqs=2, budget=64)
    a = sim.add([1, 2], max_tokens=3, n=3)  # a 2-token prompt has no full block to share: no waiting
    b = sim.add([3, 4], max_tokens=3)
    out = sim.step()
    assert [(s.seq.request_id, s.seq.sample_index) for s in out.scheduled] == [("r0", 0), ("r0", 1)]
    assert len(sim.sched.running) == 2 and b.status is SequenceStatus.WAITING
    while sim.sched.has_unfinished():
        sim.step()
        assert len(sim.sched.running) <= 2
    assert a.is_finished and b.is_finished


def test_later_samples_wait_for_the_first_to_compute_the_prompt_then_hit_the_prefix_cache():
    # 9 prompt tokens: two full blocks the later samples can share, the 9th token each computes itself
    sim = Sim(num_blocks=32, block_size=4, budget=64)
    first = sim.add(list(range(9)), max_tokens=3, n=3)
    late = sim.add([5, 6], max_tokens=2)
    out = sim.step()
    assert [s.seq for s in out.scheduled] == [first] and late.status is SequenceStatus.WAITING  # FCFS kept
    out = sim.step()
    others = [s for s in sim.seqs if s.request_id == "r0" and s is not first]
    assert [(s.seq, s.num_new_tokens) for s in out.scheduled] == [(first, 1), *((o, 1) for o in others), (late, 2)]
    assert [o.num_cached_tokens for o in others] == [8, 8]
    assert all(o.block_table[:2] == first.block_table[:2] for o in others)
    sim.run()


def test_later_samples_do_not_wait_without_prefix_caching():
    sim = Sim(num_blocks=32, block_size=4, budget=64, enable_prefix_caching=False)
    sim.add(list(range(9)), max_tokens=3, n=3)
    out = sim.step()
    assert [s.num_new_tokens for s in out.scheduled] == [9, 9, 9]
    sim.run()
