"""A scheduled step's model inputs (`step_inputs`) and the CPU backend's metadata from them, on a step with two
decodes and two prefill chunks (one after a cached prefix), against values worked out by hand."""

from __future__ import annotations

from hetero_infer.contracts.sampling_params import SamplingParams
from hetero_infer.worker.core.scheduler import ScheduledSeq, SchedulerOutput
from hetero_infer.worker.core.sequence import Sequence
from hetero_infer.worker.core.step_plan import launch_step
from hetero_infer.worker.runner.attention.cpu_backend import CpuBackend
from hetero_infer.worker.runner.inputs import step_inputs

BS = 4


def _seq(tokens: list[int], computed: int, table: list[int]) -> Sequence:
    seq = Sequence("r", tokens, len(tokens), SamplingParams(), 16)
    seq.num_computed_tokens, seq.block_table = computed, table
    return seq


def _step() -> SchedulerOutput:
    a = _seq([10, 11, 12, 13, 14, 15], 5, [7, 2])  # decode of position 5: block 2, offset 1
    b = _seq([20, 21, 22, 23], 3, [9])  # decode of position 3: block 9, offset 3
    c = _seq([30, 31, 32, 33, 34, 35, 36], 4, [5, 1])  # a chunk after a cached block: positions 4-6
    d = _seq([40, 41, 42, 43, 44], 0, [3, 6])  # the first 3 of 5 prompt tokens: no logits
    return SchedulerOutput([ScheduledSeq(a, 1), ScheduledSeq(b, 1), ScheduledSeq(c, 3), ScheduledSeq(d, 3)])


def _inputs(sched: SchedulerOutput):
    """The executor's inputs, with the tables it keeps (no block manager here: the sequences' own)."""
    return step_inputs(launch_step(sched)[0], {s.seq.seq_id: s.seq.block_table for s in sched.scheduled}, BS)


def test_tokens_positions_slots_and_sampled_rows() -> None:
    step = _inputs(_step())
    assert step.token_ids.tolist() == [15, 23, 34, 35, 36, 40, 41, 42]
    assert step.batch.positions.tolist() == [5, 3, 4, 5, 6, 0, 1, 2]
    assert step.batch.slot_mapping.tolist() == [2 * 4 + 1, 9 * 4 + 3, 1 * 4 + 0, 1 * 4 + 1, 1 * 4 + 2, 12, 13, 14]
    assert step.logits_index.tolist() == [0, 1, 4]  # d's chunk ends before its prompt does
    assert [(s.start, s.num_tokens, s.is_prefill) for s in step.batch.spans] == [
        (5, 1, False), (3, 1, False), (4, 3, True), (0, 3, True)]
    assert step.token_ids.dtype == step.batch.positions.dtype == step.logits_index.dtype == "int64"


def test_cpu_metadata_gives_every_row_its_sequences_table() -> None:
    meta = CpuBackend(rope=None).prepare(_inputs(_step()).batch)
    assert meta.block_tables.tolist() == [[7, 2], [9, 0], [5, 1], [5, 1], [5, 1], [3, 6], [3, 6], [3, 6]]
    assert meta.context_lens.tolist() == [6, 4, 5, 6, 7, 1, 2, 3]
    assert meta.positions.tolist() == [5, 3, 4, 5, 6, 0, 1, 2]
    assert meta.slot_mapping.tolist() == [9, 39, 4, 5, 6, 12, 13, 14]


def test_decode_step_tables_one_row_a_sequence() -> None:
    step = SchedulerOutput(_step().scheduled[:2])
    meta = CpuBackend(rope=None).prepare(_inputs(step).batch)
    assert meta.block_tables.tolist() == [[7, 2], [9, 0]] and meta.block_tables.is_contiguous()
    assert str(meta.block_tables.dtype) == str(meta.context_lens.dtype) == "torch.int32"


def test_the_step_contract_is_plain_data_copied_from_the_sequences() -> None:
    """What the executor gets (`launch_step`): each sequence's new tokens, start, whether it samples, the tables
    the scheduler changed, the prompt (and sample index) of a sequence's first step, the prompt logprobs owed;
    copies (the core changes its sequences at once: they count the step's tokens as computed), and it pickles (an
    executor in another process)."""
    import pickle

    from hetero_infer.contracts.step import STEP_CONTRACT_VERSION, PromptLogprobsRows, StepPlan

    sched = _step()
    a, b, c, d = (item.seq for item in sched.scheduled)
    c.num_cached_tokens = 4  # admitted with a cached block, computing from there: its first step
    d.prompt_logprobs_top = 2
    sched.block_copies = [(4, 8)]
    sched.block_table_updates = {a.seq_id: (1, [2])}
    d.sample_index = 1
    plan, rows, first = launch_step(sched, [99])
    assert isinstance(plan, StepPlan) and plan.version == STEP_CONTRACT_VERSION
    assert plan.seq_ids == [a.seq_id, b.seq_id, c.seq_id, d.seq_id]
    assert plan.token_ids == [[15], [23], [34, 35, 36], [40, 41, 42]] and plan.starts == [5, 3, 4, 0]
    assert plan.block_table_updates == {a.seq_id: (1, [2])}
    assert plan.is_prefill == [False, False, True, True] and plan.samples == [True, True, True, False]
    assert plan.new_prompts == {c.seq_id: c.token_ids, d.seq_id: d.token_ids} and plan.sample_indexes == {d.seq_id: 1}
    assert plan.prompt_logprobs == {d.seq_id: PromptLogprobsRows("r", 0, [41, 42, 43], 2)}
    assert plan.block_copies == [(4, 8)] and plan.finished_seq_ids == [99] and plan.num_tokens == 8
    assert plan.sampled_seq_ids == [a.seq_id, b.seq_id, c.seq_id]
    # the step's work counted on the sequences: what the engine hands on (rows that sample, first steps)
    assert [s.num_computed_tokens for s in (a, b, c, d)] == [6, 4, 7, 3] and d.prompt_logprob_rows == 3
    assert rows == [a, b, c] and first == [c, d]
    a.token_ids.append(16)
    assert plan.token_ids[0] == [15]  # copies
    assert plan.new_prompts[c.seq_id] is not c.token_ids
    assert pickle.loads(pickle.dumps(plan)) == plan


def test_an_executor_keeps_its_block_tables_from_the_updates() -> None:
    """`apply_block_table_updates`: a table sent whole (index 0: a first step), extended (blocks appended), cut
    and extended (a block replaced by copy-on-write), dropped when its sequence finishes; the executor's lists
    are its own."""
    from hetero_infer.contracts.step import StepPlan, apply_block_table_updates

    tables: dict[int, list[int]] = {}
    sent = [4, 5]
    apply_block_table_updates(tables, StepPlan(block_table_updates={1: (0, sent), 2: (0, [7])}))
    sent.append(99)
    assert tables == {1: [4, 5], 2: [7]}
    apply_block_table_updates(tables, StepPlan(block_table_updates={1: (2, [6]), 2: (0, [8, 9])}))
    assert tables == {1: [4, 5, 6], 2: [8, 9]}
    apply_block_table_updates(tables, StepPlan(block_table_updates={1: (1, [3, 6])}, finished_seq_ids=[2, 42]))
    assert tables == {1: [4, 3, 6]}
