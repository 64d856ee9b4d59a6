"""The order of the host tier's copies on their own CUDA streams (worker/runner/tier_copies.py), checked without a
GPU: a fake GPU runs the three streams' operations in any order their events allow (hypothesis picks the
interleaving), over many steps left in flight; every forward must read what the sequential semantics (saves, then
restores, then the forward, step after step: the CPU path) says, and the tier must end up holding the same. And:
the step's stream never waits for a transfer to the host (only, when the staging ring wraps, for an old one), a
restore waits only on the saves of the slots it reads, and a deferred restore (its sequence computes from the
next step) is waited on by the next step only."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero_infer.worker.runner.tier_copies import COMPUTE, RESTORE, SAVE, CopyPlanner, Op

NUM_BLOCKS, NUM_SLOTS = 8, 6


@st.composite
def steps(draw, deferred: bool = False):
    """Per step: saves (device block, host slot: distinct slots and blocks) and restores (host slot already
    written, distinct device blocks). Deferred: the blocks restored by a step are read by the next one's forward,
    so that step neither evicts them nor restores into them (they belong to a running sequence)."""
    out, written, busy = [], set(), set()
    free = st.integers(0, NUM_BLOCKS - 1).filter(lambda b: b not in busy)
    for _ in range(draw(st.integers(1, 8))):
        save_blocks = draw(st.lists(free, unique=True, max_size=4))
        slots = draw(st.lists(st.integers(0, NUM_SLOTS - 1), unique=True, min_size=len(save_blocks),
                              max_size=len(save_blocks)))
        saves = list(zip(save_blocks, slots))
        written |= set(slots)
        readable = sorted(written)
        restores = []
        if readable:
            targets = draw(st.lists(free, unique=True, max_size=3))
            restores = [(draw(st.sampled_from(readable)), b) for b in targets]
        out.append((saves, restores))
        if deferred:
            busy = {b for _, b in restores}
    return out


class Event:
    def __init__(self, n: int) -> None:
        self.n = n
        self.stream: str | None = None  # where it was recorded

    def __repr__(self) -> str:
        return f"e{self.n}"


def plan_all(planner: CopyPlanner, schedule, deferred: bool = False):
    """Each step's ops, then its forward on the compute stream: it reads the restored blocks (deferred: those the
    step before restored) and writes the evicted ones (their new owners)."""
    ops, fresh, earlier = [], itertools.count(1000), set()
    for k, (saves, restores) in enumerate(schedule):
        step_ops = planner.plan(saves, restores, deferred)
        for op in step_ops:
            if op.kind == "record":
                op.args[0].stream = op.stream
        restored = {b for _, b in restores}
        reads = earlier if deferred else restored
        writes = tuple((b, next(fresh)) for b, _ in saves if b not in restored)
        ops.append((step_ops, Op(COMPUTE, "forward", (k, tuple(sorted(reads)), writes))))
        earlier = restored
    return ops


def sequential(schedule, ops) -> tuple[dict, dict, dict]:
    device = {b: ("init", b) for b in range(NUM_BLOCKS)}
    host: dict[int, object] = {}
    reads = {}
    for (saves, restores), (_, forward) in zip(schedule, ops):
        for b, slot in saves:
            host[slot] = device[b]
        for slot, b in restores:
            device[b] = host[slot]
        k, rd, writes = forward.args
        reads[k] = tuple(device[b] for b in rd)
        for b, value in writes:
            device[b] = value
    return device, host, reads


def on_fake_gpu(ops, choose) -> tuple[dict, dict, dict]:
    queues = {COMPUTE: [], SAVE: [], RESTORE: []}
    for step_ops, forward in ops:
        for op in step_ops:
            queues[op.stream].append(op)
        queues[COMPUTE].append(forward)
    device = {b: ("init", b) for b in range(NUM_BLOCKS)}
    host: dict[int, object] = {}
    staging: dict[int, object] = {}
    reads = {}
    recorded = set()
    while any(queues.values()):
        runnable = [s for s, q in queues.items() if q and (q[0].kind != "wait" or q[0].args[0] in recorded)]
        assert runnable, "the streams wait on each other: deadlock"
        op = queues[choose(runnable)].pop(0)
        if op.kind == "record":
            recorded.add(op.args[0])
        elif op.kind == "gather":
            for b, i in zip(*op.args):
                staging[i] = device[b]
        elif op.kind == "d2h":
            for i, slot in zip(*op.args):
                host[slot] = staging[i]
        elif op.kind == "h2d":
            for slot, b in zip(*op.args):
                device[b] = host[slot]
        elif op.kind == "forward":
            k, rd, writes = op.args
            reads[k] = tuple(device[b] for b in rd)
            for b, value in writes:
                device[b] = value
    return device, host, reads


@settings(max_examples=400, deadline=None)
@given(deferred=st.booleans(), staging=st.integers(1, 6), data=st.data())
def test_any_interleaving_the_events_allow_reads_what_the_sequential_copies_would(deferred, staging, data):
    schedule = data.draw(steps(deferred))
    counter = itertools.count()
    ops = plan_all(CopyPlanner(staging, lambda: Event(next(counter))), schedule, deferred)
    expected = sequential(schedule, ops)
    got = on_fake_gpu(ops, lambda runnable: data.draw(st.sampled_from(sorted(runnable))))
    assert got == expected


@settings(max_examples=200, deadline=None)
@given(schedule=steps())
def test_the_step_never_waits_for_a_transfer_to_the_host_and_restores_wait_only_for_their_slots(schedule):
    counter = itertools.count()
    planner = CopyPlanner(64, lambda: Event(next(counter)))  # a ring that does not wrap here
    saved_by: dict[int, Event] = {}
    for saves, restores in schedule:
        step_ops = planner.plan(saves, restores)
        for op in step_ops:
            if op.kind == "record":
                op.args[0].stream = op.stream
        assert not [op for op in step_ops if op.stream == COMPUTE and op.kind == "wait"
                    and op.args[0].stream == SAVE], "the step waits for a save's transfer"
        for op in step_ops:
            if op.kind == "record" and op.stream == SAVE:
                for _, slot in saves:
                    saved_by[slot] = op.args[0]
        needed = {id(saved_by[slot]) for slot, _ in restores}
        waited = {id(op.args[0]) for op in step_ops if op.stream == RESTORE and op.kind == "wait"
                  and op.args[0].stream == SAVE}
        assert waited == needed


def test_a_small_ring_makes_the_step_wait_for_the_oldest_transfer_only() -> None:
    counter = itertools.count()
    planner = CopyPlanner(2, lambda: Event(next(counter)))
    first = planner.plan([(0, 0), (1, 1)], [])
    second = planner.plan([(2, 2)], [])
    assert [op.kind for op in first] == ["gather", "record", "wait", "d2h", "record"]
    assert second[0] == Op(COMPUTE, "wait", (first[-1].args[0],))  # staging block 0 is reused
    with pytest.raises(ValueError):
        CopyPlanner(0, object)


def test_a_deferred_restore_is_waited_on_by_the_next_step_only() -> None:
    counter = itertools.count()
    planner = CopyPlanner(4, lambda: Event(next(counter)))
    planner.plan([(0, 0)], [])
    now = planner.plan([], [(0, 3)], deferred=True)
    assert not [op for op in now if op.stream == COMPUTE and op.kind == "wait"]  # this step's forward overlaps it
    assert planner.pending
    restored = [op for op in now if op.stream == RESTORE and op.kind == "record"][0].args[0]
    assert planner.plan([], []) == [Op(COMPUTE, "wait", (restored,))] and not planner.pending
