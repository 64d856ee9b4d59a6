"""`scheduling_policy="priority"`: the waiting queue in (priority, arrival) order, preemption of the lowest
priority, and a request of higher priority taking the place of a lower one when max_num_seqs is full (vLLM's
gap). Driven through kv_model.Sim, which checks the KV contents and the queue order at every step."""

from __future__ import annotations

import pytest
from kv_model import Sim

from hetero_infer.worker.core.block_manager import BlockManager
from hetero_infer.worker.core.scheduler import Scheduler
from hetero_infer.worker.core.sequence import SequenceStatus


def running_ids(sim: Sim) -> set[int]:
    return {s.seq_id for s in sim.sched.running}


def test_a_higher_priority_request_preempts_when_max_num_seqs_is_full():
    sim = Sim(num_blocks=64, block_size=4, max_num_seqs=4, budget=64, policy="priority")
    low = [sim.add([i, i + 1, i + 2], max_tokens=40, priority=10) for i in range(6)]
    sim.step()
    sim.step()
    assert running_ids(sim) == {s.seq_id for s in low[:4]}
    high = sim.add([9, 9, 9], max_tokens=3, priority=0)
    out = sim.step()
    assert high.status is SequenceStatus.RUNNING and any(s.seq is high for s in out.scheduled)
    assert out.num_preempted == 1 and low[3].status is SequenceStatus.WAITING  # the latest of the lowest
    assert list(sim.sched.waiting)[0] is low[3]  # back ahead of the later arrivals of its priority
    while not high.is_finished:
        sim.step()
    assert len(high.output_token_ids) == 3
    sim.run()


def test_fcfs_keeps_a_high_priority_request_waiting_behind_a_full_batch():
    sim = Sim(num_blocks=64, block_size=4, max_num_seqs=4, budget=64, policy="fcfs")
    for i in range(4):
        sim.add([i, i + 1, i + 2], max_tokens=40, priority=10)
    sim.step()
    high = sim.add([9, 9, 9], max_tokens=3, priority=0)
    for _ in range(5):
        assert sim.step().num_preempted == 0
    assert high.status is SequenceStatus.WAITING
    sim.run()


def test_equal_or_lower_priority_never_preempts():
    sim = Sim(num_blocks=64, block_size=4, max_num_seqs=2, budget=64, policy="priority")
    first = [sim.add([i, i], max_tokens=10, priority=5) for i in range(2)]
    sim.step()
    same = sim.add([7, 7], max_tokens=2, priority=5)
    lower = sim.add([8, 8], max_tokens=2, priority=9)
    for _ in range(3):
        assert sim.step().num_preempted == 0
    assert running_ids(sim) == {s.seq_id for s in first}
    assert list(sim.sched.waiting) == [same, lower]
    sim.run()


def test_the_queue_is_ordered_by_priority_then_arrival():
    sim = Sim(num_blocks=64, block_size=4, max_num_seqs=1, budget=64, policy="priority")
    blocker = sim.add([1, 1], max_tokens=30, priority=-5)
    sim.step()
    a = sim.add([2, 2], max_tokens=1, priority=3)
    b = sim.add([3, 3], max_tokens=1, priority=1)
    c = sim.add([4, 4], max_tokens=1, priority=3)
    d = sim.add([5, 5], max_tokens=1, priority=1)
    assert list(sim.sched.waiting) == [b, d, a, c]
    finished = []
    while sim.sched.has_unfinished():
        sim.step()
        finished += [s for s in (blocker, a, b, c, d) if s.is_finished and s not in finished]
    assert finished == [blocker, b, d, a, c]


def test_memory_preemption_takes_the_lowest_priority_first():
    # 8 blocks of 4: each sequence grows to 5 blocks, so the pool runs out and someone is preempted.
    sim = Sim(num_blocks=8, block_size=4, max_num_seqs=4, budget=64, memory_threshold=1.0, policy="priority")
    low = sim.add([1, 2, 3, 4], max_tokens=16, priority=9)
    high = sim.add([5, 6, 7, 8], max_tokens=16, priority=1)
    while not high.is_finished:
        out = sim.step()
        assert high.num_preemptions == 0
        if out.num_preempted:
            assert low.status is SequenceStatus.WAITING
    sim.run()
    assert low.num_preemptions >= 1


def test_an_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="fcfs or priority"):
        Scheduler(BlockManager(8, 4), 2, 16, policy="lottery")
