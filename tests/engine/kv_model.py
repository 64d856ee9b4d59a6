"""A model of the KV cache's contents, driving the real BlockManager and Scheduler without a model.

The simulated executor does what the model runner does with a `SchedulerOutput`: apply the
copy-on-write block copies, then write every scheduled token's K/V into the slot its block table
names. A slot records the token sequence that produced it (`token_ids[: position + 1]`): the K/V
of a token depend on every token before it, so two writers agree only if they share the whole
prefix. Every read is checked against the reading sequence's own tokens, so a block that holds
another sequence's tokens, a stale prefix-cache hit or a slot not yet written fails at once.

With a host tier (`host_blocks`), the simulated executor first makes the step's moves, saves then restores,
between the pool's slots and a modelled host memory (slot -> the contents of each offset), so a restored block
that holds anything but what its hash promises fails the same read checks; with `record_events`, a subscriber's
view rebuilt from the KV events must equal both pools' actual contents after every step.

The simulated executor keeps its own block tables, as an executor does, from the steps' `block_table_updates`
alone, and every scheduled sequence's must equal the core's.

The step loop follows `LLMEngine._update`: count the computed tokens, offer full blocks to the
prefix cache, then append one token to every sequence that samples. An n > 1 request is n
sequences queued together, as `LLMEngine.add_request` fans it out (the later ones name the first
as their `prompt_leader`; their sample_index makes their tokens diverge).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from hetero_infer import SamplingParams
from hetero_infer.contracts import kv_events
from hetero_infer.contracts.step import StepPlan, apply_block_table_updates
from hetero_infer.worker.core.block_manager import BlockManager
from hetero_infer.worker.core.scheduler import Scheduler, SchedulerOutput
from hetero_infer.worker.core.sequence import Sequence, SequenceStatus

VOCAB = 7  # few token ids: unrelated prompts often share prefixes by chance


def next_token(seq: Sequence) -> int:
    """A deterministic 'sample': equal histories give equal tokens, forks (sample_index) diverge."""
    return (sum(seq.token_ids[-3:]) * 5 + seq.num_tokens + 3 * seq.sample_index) % VOCAB


@dataclass
class KVPool:
    block_size: int
    slots: dict[int, tuple[int, ...]] = field(default_factory=dict)  # slot -> tokens up to and incl. it

    def _slot(self, seq: Sequence, position: int) -> int:
        return seq.block_table[position // self.block_size] * self.block_size + position % self.block_size

    def copy_block(self, src: int, dst: int) -> None:
        bs = self.block_size
        for offset in range(bs):
            content = self.slots.get(src * bs + offset)
            if content is None:
                self.slots.pop(dst * bs + offset, None)
            else:
                self.slots[dst * bs + offset] = content

    def write(self, seq: Sequence, start: int, count: int) -> None:
        for position in range(start, start + count):
            self.slots[self._slot(seq, position)] = tuple(seq.token_ids[: position + 1])

    def save_block(self, block: int) -> tuple[tuple[int, ...] | None, ...]:
        return tuple(self.slots.get(block * self.block_size + offset) for offset in range(self.block_size))

    def restore_block(self, block: int, contents: tuple[tuple[int, ...] | None, ...]) -> None:
        for offset, content in enumerate(contents):
            if content is None:
                self.slots.pop(block * self.block_size + offset, None)
            else:
                self.slots[block * self.block_size + offset] = content

    def check_read(self, seq: Sequence, end: int, when: str) -> None:
        """The K/V of positions [0, end) that `seq` attends to hold exactly its own tokens."""
        for position in range(end):
            found = self.slots.get(self._slot(seq, position))
            expected = tuple(seq.token_ids[: position + 1])
            assert found == expected, (
                f"{when}: seq {seq.seq_id} position {position} (block "
                f"{seq.block_table[position // self.block_size]}) holds "
                f"{'nothing' if found is None else found} instead of {expected}"
            )


def check_refcounts(bm: BlockManager, live: list[Sequence]) -> None:
    owners = Counter(b for s in live for b in s.block_table)
    for block in bm.blocks:
        assert block.ref_count == owners.get(block.block_id, 0), "ref count differs from owners"
        assert (block.ref_count == 0) == (block.block_id in bm.free_blocks), "free list out of sync"
    for s in live:
        assert len(set(s.block_table)) == len(s.block_table), "a block owned twice by one sequence"
    for h, block_id in bm.hash_to_block.items():
        assert bm.blocks[block_id].hash == h


class Sim:
    """Requests through the real scheduler and block manager, the KV pool modelled slot by slot."""

    def __init__(self, num_blocks: int, block_size: int, max_num_seqs: int = 8, budget: int = 64,
                 memory_threshold: float | None = 0.9, enable_prefix_caching: bool = True,
                 policy: str = "fcfs", host_blocks: int = 0, record_events: bool = False,
                 defer_restored: bool = False) -> None:
        self.bm = BlockManager(num_blocks, block_size, enable_prefix_caching, host_blocks=host_blocks,
                               record_events=record_events)
        self.host: dict[int, tuple] = {}  # host slot -> the saved block's contents
        self.subscriber: dict[str, set[int]] = {}  # what a KV-events subscriber knows of each medium
        threshold = {} if memory_threshold is None else {"memory_threshold": memory_threshold}
        self.sched = Scheduler(self.bm, max_num_seqs, budget, **threshold, policy=policy)
        self.sched.defer_restored = defer_restored  # as with the CUDA executor's asynchronous tier copies
        self.kv = KVPool(block_size)
        self.seqs: list[Sequence] = []  # every sequence ever made, children included
        self.arrival: dict[int, int] = {}  # seq_id -> arrival rank of its request
        self.ever_ran: set[int] = set()  # seq_ids admitted at least once
        self.last_num_decodes = 0  # SchedulerOutput.num_decodes as the executor sees it
        self.tables: dict[int, list[int]] = {}  # the executor's block tables, from the steps' updates

    @property
    def live(self) -> list[Sequence]:
        return [s for s in self.seqs if not s.is_finished]

    def fits(self, prompt_len: int, max_tokens: int) -> bool:
        """What the engine admits at all: one request alone fits the pool."""
        return self.bm.blocks_for(prompt_len + max_tokens) <= self.bm.num_blocks

    def add(self, prompt: list[int], max_tokens: int, n: int = 1, priority: int = 0) -> Sequence:
        """Queue a request: its n samples, as the engine fans them out; returns the first."""
        rank = len(set(self.arrival.values()))
        params = SamplingParams(max_tokens=max_tokens, n=n, priority=priority)
        seqs = [Sequence(f"r{rank}", list(prompt), len(prompt), params, max_tokens, sample_index=i)
                for i in range(n)]
        for seq in seqs:
            seq.prompt_leader = seqs[0] if seq is not seqs[0] else None
            self.arrival[seq.seq_id] = rank
            self.seqs.append(seq)
            self.sched.add(seq)
        return seqs[0]

    def abort(self, seq: Sequence) -> None:
        if not seq.is_finished:
            self.sched.finish(seq, "abort")

    def step(self) -> SchedulerOutput:
        out = self.sched.schedule()
        self.last_num_decodes = out.num_decodes
        self.check_fcfs()
        for item in out.scheduled:
            assert item.seq.status is SequenceStatus.RUNNING
            self.ever_ran.add(item.seq.seq_id)
        check_refcounts(self.bm, self.live)
        apply_block_table_updates(self.tables, StepPlan(block_table_updates=out.block_table_updates))
        for item in out.scheduled:
            assert self.tables[item.seq.seq_id] == item.seq.block_table, "the executor's block table is stale"
        # the executor: moves to and from the host tier (saves, then restores), block copies, then each token's
        # K/V into its slot, then attention
        if out.block_moves:
            for block, slot in out.block_moves.saves:
                self.host[slot] = self.kv.save_block(block)
            for slot, block in out.block_moves.restores:
                self.kv.restore_block(block, self.host[slot])
        for src, dst in out.block_copies:
            self.kv.copy_block(src, dst)
        for item in out.scheduled:  # what a sequence reuses must be there before this step writes
            self.kv.check_read(item.seq, item.seq.num_computed_tokens, "before the step's writes")
        for item in out.scheduled:
            self.kv.write(item.seq, item.seq.num_computed_tokens, item.num_new_tokens)
        for item in out.scheduled:
            end = item.seq.num_computed_tokens + item.num_new_tokens
            self.kv.check_read(item.seq, end, "after the step's writes")
        self._update(out)
        check_refcounts(self.bm, self.live)
        self.check_events()
        return out

    def check_events(self) -> None:
        """A subscriber that applied every KV event batch knows exactly what each pool holds."""
        if self.bm.events is None:
            return
        kv_events.apply(self.subscriber, kv_events.decode_batch(kv_events.encode_batch(
            kv_events.KVEventBatch(ts=0.0, events=self.bm.take_events()))))
        assert self.subscriber.get(kv_events.DEVICE_MEDIUM, set()) == set(self.bm.hash_to_block)
        if self.bm.host is not None:
            assert self.subscriber.get(kv_events.HOST_MEDIUM, set()) == set(self.bm.host._slots)

    def _update(self, out: SchedulerOutput) -> None:
        sampling: list[Sequence] = []
        for item in out.scheduled:
            seq = item.seq
            if item.samples:  # before counting this step's tokens
                sampling.append(seq)
            seq.num_computed_tokens += item.num_new_tokens
            self.bm.register_computed_blocks(seq)
        for seq in sampling:
            seq.token_ids.append(next_token(seq))
            if seq.num_output_tokens >= seq.max_tokens:
                self.sched.finish(seq, "length")

    def check_fcfs(self) -> None:
        """Preempted sequences wait ahead of every request not yet admitted; those keep arrival order. Under the
        priority policy: every waiting sequence in (priority, arrival) order, preempted or not."""
        waiting = list(self.sched.waiting)
        if self.sched.policy == "priority":
            ranks = [(s.params.priority, self.arrival[s.seq_id], s.sample_index) for s in waiting]
            assert ranks == sorted(ranks), "waiting sequences out of priority order"
            return
        preempted = [s for s in waiting if s.seq_id in self.ever_ran]
        fresh = [s for s in waiting if s.seq_id not in self.ever_ran]
        assert waiting == preempted + fresh, "a preempted sequence waits behind a new request"
        ranks = [self.arrival[s.seq_id] for s in fresh]
        assert ranks == sorted(ranks), "new requests out of arrival order"
        ranks = [self.arrival[s.seq_id] for s in preempted]
        assert ranks == sorted(ranks), "preempted requests out of arrival order"

    def play(self, ops: list[tuple]) -> None:
        """The randomised tests' operations (test_scheduler_kv_contents.OPS) in order, then run to the end: adds of
        fresh prompts or of repeats of earlier sequences' tokens, steps, forks (n > 1) and aborts."""
        for op in ops:
            if op[0] == "add":
                _, length, max_tokens, n, seed = op
                prompt = [(seed + j * (seed % 3 + 1)) % 7 for j in range(length)]
                if self.fits(length, max_tokens):
                    self.add(prompt, max_tokens, n)
            elif op[0] == "repeat" and self.seqs:
                _, index, length, max_tokens = op
                source = self.seqs[index % len(self.seqs)]
                prompt = source.token_ids[:length]
                if self.fits(len(prompt), max_tokens):
                    self.add(prompt, max_tokens)
            elif op[0] == "step":
                for _ in range(op[1]):
                    self.step()
            elif op[0] == "abort" and self.live:
                self.abort(self.live[op[1] % len(self.live)])
        self.run()

    def run(self, max_steps: int = 500) -> None:
        for _ in range(max_steps):
            if not self.sched.has_unfinished():
                break
            self.step()
        assert not self.sched.has_unfinished(), "requests left unfinished: starvation or deadlock"
        assert self.bm.num_free_blocks == self.bm.num_blocks, "blocks leaked"
