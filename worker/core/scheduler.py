"""Continuous batching: a token budget per step, decodes first, chunked prefill, preemption.

Each step runs, in order: running decodes, running prefill chunks, then newly admitted
waiting sequences (FCFS: the queue head is never skipped, so nothing starves). When the
pool runs short, the most recently admitted running sequence is preempted (its blocks are
freed and it is recomputed later from its tokens, ahead of newer requests).

Under `policy="priority"` (vLLM's `--scheduling-policy priority`) the waiting queue is ordered by (the request's
`priority`, lower first; arrival), a preempted sequence goes back to its place in that order, the victim of a
preemption is the running sequence of the lowest priority (latest arrival among equals), and a waiting sequence of
higher priority than a running one takes its place when `max_num_seqs` or the memory threshold keeps it out
(vLLM's gap: a full batch of low-priority streams would otherwise keep it waiting until one of them ends).

With LoRA adapters (`max_loras` set), no more than `max_loras` distinct adapters are ever running (the base model
takes no slot), so no step runs more than the device holds: a waiting sequence whose adapter would be one too many
waits at the head of the queue, FCFS across adapters, until every running sequence of some adapter has ended.

A request with n > 1 is n sequences queued together (vLLM V1's fan-out): each is admitted on
its own, so every one counts against max_num_seqs. The later ones wait at the head of the
queue until the first has computed the prompt's full blocks, then take them from the prefix
cache instead of computing them again.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from hetero_infer.worker.core.block_manager import BlockManager, BlockMoves, HostHit
from hetero_infer.worker.core.sequence import Sequence, SequenceStatus


@dataclass(slots=True)
class ScheduledSeq:
    seq: Sequence
    num_new_tokens: int  # tokens whose K/V this step computes (1 for a decode)

    @property
    def samples(self) -> bool:
        """Whether this step reaches the sequence's newest token, so a new token is sampled."""
        return self.seq.num_computed_tokens + self.num_new_tokens == self.seq.num_tokens


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)  # decodes first, then prefill chunks
    block_copies: list[tuple[int, int]] = field(default_factory=list)
    # seq_id -> (index, block ids): the block tables changed by this schedule, from index on (the step contract's)
    block_table_updates: dict[int, tuple[int, list[int]]] = field(default_factory=dict)
    # saves to and restores from the host tier, copied before the step's forward (and before block_copies)
    block_moves: BlockMoves | None = None
    num_preempted: int = 0
    total_tokens: int | None = None  # the scheduled tokens, counted by `schedule()` (None: `num_tokens` adds them)

    @property
    def num_tokens(self) -> int:
        if self.total_tokens is not None:
            return self.total_tokens
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def num_decodes(self) -> int:
        n = 0
        for s in self.scheduled:
            if s.seq.is_prefill:
                break
            n += 1
        return n


SchedulingPolicy = Literal["fcfs", "priority"]


def rank(seq: Sequence) -> tuple[int, int]:
    """Scheduling order under the priority policy: priority (lower first), then arrival."""
    return (seq.params.priority, seq.seq_id)


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        memory_threshold: float = 0.9,
        policy: SchedulingPolicy = "fcfs",
        max_loras: int | None = None,
    ) -> None:
        """max_loras: the most distinct LoRA adapters running at once (None: no adapters)."""
        if policy not in ("fcfs", "priority"):
            raise ValueError(f"unknown scheduling policy {policy!r}: fcfs or priority")
        self.policy = policy
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.memory_threshold = memory_threshold
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admission order
        self.num_preemptions_total = 0
        self.max_loras = max_loras
        # a request restored from the host tier computes from the step after the one that restores its blocks, so
        # the restore overlaps that step's other work (the executor's copies are asynchronous: CUDA;
        # runner/tier_copies.py); a step with nothing else to run computes it at once
        self.defer_restored = False
        self.running_loras: dict[str, int] = {}  # adapter -> its running sequences

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        if self.policy == "priority":
            self._enqueue(seq)
        else:
            self.waiting.append(seq)

    def _enqueue(self, seq: Sequence) -> None:
        """Into the waiting queue at its rank (priority policy)."""
        self.waiting.insert(bisect.bisect_right(self.waiting, rank(seq), key=rank), seq)

    def _victim(self, skip: set[int]) -> Sequence:
        """The running sequence to preempt, not one in `skip`: the most recently admitted (fcfs), the lowest ranked
        (priority)."""
        if self.policy == "priority":
            return max((s for s in self.running if s.seq_id not in skip), key=rank)
        return next(s for s in reversed(self.running) if s.seq_id not in skip)

    def _preempt_for_priority(self) -> int:
        """Priority policy: while the head of the queue is kept out by max_num_seqs or the memory threshold and
        outranks a running sequence, that sequence makes room for it. How many were preempted."""
        bm = self.block_manager
        preempted = 0
        while self.waiting and self.running:
            head = self.waiting[0]
            if len(self.running) < self.max_num_seqs and bm.usage < self.memory_threshold:
                break  # it is admitted the ordinary way
            victim = self._victim(set())
            if rank(victim) <= rank(head):
                break
            self._preempt(victim)
            preempted += 1
        return preempted

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def _started(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)
        if seq.lora_name is not None:
            self.running_loras[seq.lora_name] = self.running_loras.get(seq.lora_name, 0) + 1

    def _stopped(self, seq: Sequence) -> None:
        self.running.remove(seq)
        name = seq.lora_name
        if name is not None:
            left = self.running_loras[name] - 1
            if left:
                self.running_loras[name] = left
            else:
                del self.running_loras[name]

    def _waits_for_lora_slot(self, seq: Sequence) -> bool:
        name = seq.lora_name
        return (name is not None and name not in self.running_loras and self.max_loras is not None
                and len(self.running_loras) >= self.max_loras)

    def _preempt(self, seq: Sequence) -> None:
        self._stopped(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions_total += 1
        if self.policy == "priority":
            self._enqueue(seq)
        else:
            self.waiting.appendleft(seq)

    def schedule(self) -> SchedulerOutput:
        # (the hot path of every step: its output built once at the end, positionally)
        bm = self.block_manager
        num_preempted = 0
        if self.policy == "priority" and self.waiting:
            num_preempted = self._preempt_for_priority()
        out_of_memory = False
        budget = self.max_num_batched_tokens
        decodes, prefills = [], []
        for s in self.running:
            (prefills if len(s.token_ids) - s.num_computed_tokens > 1 else decodes).append(s)
        scheduled_ids: set[int] | None = None  # what a preemption may not take: built at the first one
        running = SequenceStatus.RUNNING
        allocate_slots = bm.allocate_slots
        scheduled: list[ScheduledSeq] = []

        for seq in decodes + prefills if prefills else decodes:
            if budget == 0:
                break
            if seq.status is not running:
                continue  # preempted earlier in this loop
            num_tokens = len(seq.token_ids)
            if num_tokens - seq.num_prompt_tokens >= seq.max_tokens:
                continue  # its newest token, still on the device (a PLACEHOLDER), is its last
            num_new = min(num_tokens - seq.num_computed_tokens, budget)
            allocated = allocate_slots(seq, num_new)
            while not allocated:
                if scheduled_ids is None:
                    scheduled_ids = {item.seq.seq_id for item in scheduled}
                # seq itself is never scheduled yet, so a victim always exists
                victim = self._victim(scheduled_ids)
                self._preempt(victim)
                num_preempted += 1
                out_of_memory = True
                if victim is seq:
                    break
                allocated = bm.allocate_slots(seq, num_new)
            if not allocated:
                continue
            scheduled.append(ScheduledSeq(seq, num_new))
            if scheduled_ids is not None:
                scheduled_ids.add(seq.seq_id)
            budget -= num_new

        if not out_of_memory:
            while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
                if self.running and bm.usage >= self.memory_threshold:
                    break
                seq = self.waiting[0]
                if self._waits_for_prompt_leader(seq) or self._waits_for_lora_slot(seq):
                    break
                # a prompt whose logprobs are owed computes every token: a cached block has no logits
                hits = bm.lookup_prefix(seq) if seq.prompt_logprobs_top is None else []
                num_new = min(seq.num_tokens - len(hits) * bm.block_size, budget)
                if not bm.can_admit(seq, hits, num_new):
                    break
                self.waiting.popleft()
                bm.admit(seq, hits)
                ok = bm.allocate_slots(seq, num_new)
                assert ok
                self._started(seq)
                if self.defer_restored and scheduled and hits and isinstance(hits[-1], HostHit):
                    continue  # running, its blocks on their way behind this step's work: computed from the next
                scheduled.append(ScheduledSeq(seq, num_new))
                budget -= num_new

        # decodes first, then prefill chunks (newly admitted ones included)
        if prefills or len(scheduled) > len(decodes):
            scheduled.sort(key=lambda s: s.seq.is_prefill)
        return SchedulerOutput(scheduled, bm.take_pending_copies(), bm.take_table_updates(),
                               bm.take_block_moves() if bm.host is not None else None, num_preempted,
                               self.max_num_batched_tokens - budget)

    def _waits_for_prompt_leader(self, seq: Sequence) -> bool:
        """Whether `seq`, a later sample of an n > 1 request, should wait for its first sample: until the steps
        that compute the request's prompt logprobs are launched, if it has any; and while the first sample runs and
        has not registered the prompt's shareable full blocks in the prefix cache yet (the engine registers blocks
        once the step that computes their K/V has ended on the host's side, so not in the step that computes them)."""
        leader = seq.prompt_leader
        if leader is None:
            return False
        if leader.prompt_logprobs_top is not None and leader.status is not SequenceStatus.FINISHED:
            return True  # the request's prompt logprobs come before any of its samples' tokens (first delta)
        bm = self.block_manager
        if not bm.enable_prefix_caching or leader.status is not SequenceStatus.RUNNING:
            return False
        shareable = (seq.num_prompt_tokens - 1) // bm.block_size * bm.block_size  # as lookup_prefix finds them
        return leader.num_registered_blocks * bm.block_size < shareable

    def finish(self, seq: Sequence, reason: str, stop_reason: int | str | None = None) -> None:
        """Finish a sequence and free its blocks at once (running or waiting)."""
        if seq.status is SequenceStatus.RUNNING:
            self._stopped(seq)
        elif seq.status is SequenceStatus.WAITING:
            try:
                self.waiting.remove(seq)
            except ValueError:
                pass
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.stop_reason = stop_reason
