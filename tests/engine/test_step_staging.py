"""A step's integer inputs packed into the executor's staging area and copied to the device at once
(worker/runner/staging.py), checked on the CPU:

- the views a step hands the model and the attention backends (Triton's and the PyTorch reference) hold what the
  code before the staging built with one tensor and one copy per array, over random batches of decodes,
  prefills, chunked prefills after cached prefixes, PLACEHOLDER inputs and block copies; staged (the CUDA path,
  with a CPU tensor standing in for the device buffer, grown from too small a start) and unstaged (the CPU path);
- on a stand-in device ("meta"), an eager step issues exactly one host-to-device copy and allocates no device
  tensor (every aten op on the device is a view, the copy, or an in-place write into the staging);
- the CUDA-graph decode runner's static inputs likewise, one copy a step;
- (tests/engine/test_overlap.py) the engine on a real tiny model with the staging forced on (and the overlap, as
  on CUDA) is token-identical to Hugging Face, with one copy per step;
- on a GPU (`-m gpu`): the packing allocates no CUDA memory and never synchronises, and the engine's greedy
  launches issue one copy each and never synchronise.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from hetero_infer.contracts.sampling_params import SamplingParams
from hetero_infer.worker.core.scheduler import ScheduledSeq, SchedulerOutput
from hetero_infer.worker.core.sequence import PLACEHOLDER, Sequence
from hetero_infer.worker.core.step_plan import launch_step
from hetero_infer.worker.runner.attention.torch_backend import TorchBackend
from hetero_infer.worker.runner.attention.triton_backend import TritonBackend
from hetero_infer.worker.runner.cuda_graphs import DecodeRunner
from hetero_infer.worker.runner.executor import TorchExecutor
from hetero_infer.worker.runner.inputs import StepInputs, step_inputs
from hetero_infer.worker.runner.models.rotary import RotaryEmbedding
from hetero_infer.worker.runner.staging import StagingArea

CPU = torch.device("cpu")
PREV = 12  # rows of the previous step's sampled tokens


@st.composite
def steps(draw, decodes_only: bool = False) -> tuple[StepInputs, dict[int, int]]:
    """A scheduled step (decodes first, then prefill chunks, some after a cached prefix) over random block tables,
    some newest tokens PLACEHOLDERs, some block copies; and each PLACEHOLDER sequence's row in the previous step's
    tokens."""
    bs = draw(st.sampled_from([1, 2, 4, 16]))
    rnd = draw(st.randoms(use_true_random=False))
    blocks = iter(rnd.sample(range(1000), 1000))
    n_dec = draw(st.integers(1 if decodes_only else 0, 6))
    n_pre = 0 if decodes_only else draw(st.integers(0 if n_dec else 1, 4))
    scheduled, prev_rows = [], {}
    for i in range(n_dec + n_pre):
        total = draw(st.integers(1 if i < n_dec else 2, 40))
        tokens = [rnd.randrange(5000) for _ in range(total)]
        if i < n_dec:
            computed, new = total - 1, 1
        else:
            computed = draw(st.integers(0, total - 2))  # a chunk after a cached (or computed) prefix
            new = draw(st.integers(1, total - computed))
        seq = Sequence("r", tokens, total, SamplingParams(), 64)
        seq.num_computed_tokens = computed
        seq.block_table = [next(blocks) for _ in range(-(-total // bs))]
        if computed + new == total and draw(st.booleans()):  # the newest token: sampled by the step in flight
            seq.token_ids[-1] = PLACEHOLDER
            prev_rows[seq.seq_id] = rnd.randrange(PREV)
        scheduled.append(ScheduledSeq(seq, new))
    copies = [(next(blocks), next(blocks)) for _ in range(draw(st.integers(0, 3)))]
    tables = {item.seq.seq_id: item.seq.block_table for item in scheduled}  # the executor's (no block manager here)
    return step_inputs(launch_step(SchedulerOutput(scheduled, copies))[0], tables, bs), prev_rows


# -- what the code before the staging built (one tensor, one copy each) ------------------------------------------
def old_input_ids(step: StepInputs, prev_tokens: torch.Tensor, prev_rows: dict[int, int]) -> torch.Tensor:
    ids = torch.tensor(step.token_ids)
    for row, seq_id in step.placeholders:
        ids[row] = prev_tokens[prev_rows[seq_id]]
    return ids


def pad(tables: list[list[int]]) -> torch.Tensor:
    out = torch.zeros(len(tables), max(len(t) for t in tables), dtype=torch.int32)
    for i, t in enumerate(tables):
        out[i, : len(t)] = torch.tensor(t)
    return out


def old_triton_metadata(step: StepInputs) -> dict:
    spans = step.batch.spans
    decodes = [s for s in spans if not s.is_prefill]
    prefills = spans[len(decodes):]
    meta = dict(slot_mapping=torch.tensor(step.batch.slot_mapping), positions=torch.tensor(step.batch.positions),
                num_decode_tokens=len(decodes))
    if decodes:
        meta["decode_block_tables"] = pad([s.block_table for s in decodes])
        meta["decode_context_lens"] = torch.tensor([s.end for s in decodes], dtype=torch.int32)
    if prefills:
        meta["prefill_block_tables"] = pad([s.block_table for s in prefills])
        meta["prefill_cu_seqlens_q"] = torch.tensor(np.cumsum([0] + [s.num_tokens for s in prefills]).astype(np.int32))
        meta["prefill_context_lens"] = torch.tensor([s.end for s in prefills], dtype=torch.int32)
    return meta


def old_torch_metadata(step: StepInputs, rope: RotaryEmbedding) -> dict:
    batch, bs = step.batch, step.batch.block_size
    decodes = [s for s in batch.spans if not s.is_prefill]
    gather_index = mask = None
    if decodes:
        table = pad([s.block_table for s in decodes])
        lens = torch.tensor([s.end for s in decodes], dtype=torch.int32)
        lmax = max(s.end for s in decodes)
        gather_index = (table.long()[:, :, None] * bs + torch.arange(bs)).flatten(1)[:, :lmax]
        mask = (torch.arange(lmax)[None, :] < lens[:, None])[:, None, None, :]
    chunks, row = [], len(decodes)
    for s in batch.spans[len(decodes):]:
        gather = None
        if s.start > 0:
            table = torch.tensor(s.block_table, dtype=torch.int64)
            allp = torch.arange(s.end)
            gather = table[allp // bs] * bs + allp % bs
        chunks.append((row, s.num_tokens, s.end, gather))
        row += s.num_tokens
    cos, sin = rope.at(torch.tensor(batch.positions))
    return dict(slot_mapping=torch.tensor(batch.slot_mapping), cos=cos, sin=sin, num_decode_tokens=len(decodes),
                decode_gather_index=gather_index, decode_mask=mask, prefill_chunks=chunks)


def same(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.cpu(), b.cpu())
    return a == b


class StandInExecutor:
    """The executor's step packing (`TorchExecutor._prepare`) around a backend, without a model."""

    _prepare = TorchExecutor._prepare

    def __init__(self, backend, staging: StagingArea, prev_tokens: torch.Tensor, prev_rows: dict[int, int]) -> None:
        self.backend, self.staging = backend, staging
        self._prev_tokens, self._prev_rows = prev_tokens, prev_rows
        self.copied: list[tuple[list[int], list[int]]] = []

    def _copy_blocks(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        self.copied.append((src, dst))  # views of the staging: read before the next step is packed


def rope_tables(positions: int = 64, dim: int = 8) -> RotaryEmbedding:
    g = torch.Generator().manual_seed(0)
    cos, sin = torch.randn(positions, dim, generator=g), torch.randn(positions, dim, generator=g)
    return RotaryEmbedding(cos, sin, torch.cat((cos[:, : dim // 2], sin[:, : dim // 2]), -1))


def check_step(ex: StandInExecutor, step: StepInputs, prev_rows: dict[int, int], backend_name: str,
               prepared=None) -> None:
    prev_tokens = ex._prev_tokens.cpu()
    input_ids, meta, logits_index = prepared or ex._prepare(step)
    assert same(input_ids, old_input_ids(step, prev_tokens, prev_rows))
    assert same(logits_index, torch.tensor(step.logits_index))
    if step.block_copies:
        src, dst = ex.copied[-1]
        assert (src.tolist(), dst.tolist()) == ([s for s, _ in step.block_copies], [d for _, d in step.block_copies])
    if backend_name == "triton":
        for name, want in old_triton_metadata(step).items():
            assert same(getattr(meta, name), want), name
        return
    want = old_torch_metadata(step, ex.backend.rope)
    for name in ("slot_mapping", "cos", "sin", "num_decode_tokens", "decode_gather_index", "decode_mask"):
        assert same(getattr(meta, name), want[name]), name
    got = [(c.q_start, c.q_len, c.context_len, c.gather_index) for c in meta.prefill_chunks]
    assert len(got) == len(want["prefill_chunks"])
    for g, w in zip(got, want["prefill_chunks"], strict=True):
        assert g[:3] == w[:3] and same(g[3], w[3])


@pytest.mark.parametrize("backend_name", ["triton", "torch"])
@settings(max_examples=30, deadline=None)
@given(batch=st.lists(steps(), min_size=1, max_size=4))
def test_a_steps_views_hold_what_the_old_code_built(backend_name, batch):
    """Several steps through one staging area (so both host buffers, and growth from 256 bytes, are used), and
    through the CPU's unstaged path."""
    backend = TritonBackend(None, CPU) if backend_name == "triton" else TorchBackend(rope_tables(), CPU)
    staged, direct = StagingArea(CPU, staged=True, nbytes=256), StagingArea(CPU)
    prev_tokens = torch.randint(0, 5000, (PREV,))
    for step, prev_rows in batch:
        for staging in (staged, direct):
            check_step(StandInExecutor(backend, staging, prev_tokens, prev_rows), step, prev_rows, backend_name)
    assert staged.copies == len(batch) and direct.copies == 0


def test_a_packed_view_keeps_its_values_while_the_next_step_is_packed():
    """Double buffering: step N+1 is written into the other host buffer, so step N's host bytes (whose copy may
    still be queued on a GPU) are untouched; the host buffers alternate."""
    staging = StagingArea(CPU, staged=True)
    host = staging.uploader.host_arrays
    first = staging.pack(lambda p: p.put([1, 2, 3]))
    used = [i for i in (0, 1) if host[i][:24].view(np.int64).tolist() == [1, 2, 3]]
    staging.pack(lambda p: p.put([7, 8, 9]))
    assert used == [0] and host[0][:24].view(np.int64).tolist() == [1, 2, 3]
    assert host[1][:24].view(np.int64).tolist() == [7, 8, 9]
    assert first.tolist() == [7, 8, 9]  # the device buffer is one: step N+1's copy lands after step N ran


def test_growth_repacks_the_whole_step():
    staging = StagingArea(CPU, staged=True, nbytes=64)
    a, b = staging.pack(lambda p: (p.put(np.arange(5)), p.put(np.arange(100, 140), np.int32)))
    assert a.tolist() == list(range(5)) and b.tolist() == list(range(100, 140)) and b.dtype == torch.int32
    assert staging.grows == 1 and staging.copies == 1 and staging.uploader.nbytes >= 64 + 160
    assert a.data_ptr() % 64 == 0 and b.data_ptr() % 64 == 0  # every array starts aligned


class OpLog(TorchDispatchMode):
    """Every aten op that touches a tensor on the stand-in device ("meta")."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, tuple[str, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        tensors = [a for a in (*args, *(kwargs or {}).values()) if isinstance(a, torch.Tensor)]
        out = func(*args, **(kwargs or {}))
        outs = [o for o in (out if isinstance(out, (tuple, list)) else [out]) if isinstance(o, torch.Tensor)]
        devices = tuple(t.device.type for t in tensors + outs)
        if "meta" in devices:
            self.ops.append((f"{func.overloadpacket.__name__}.{func._overloadname}", devices))
        return out


VIEWS = {"slice", "view", "select", "alias", "detach", "unbind", "as_strided", "t", "transpose", "permute", "unsqueeze"}


@settings(max_examples=20, deadline=None)
@given(step_and_rows=steps())
def test_one_host_to_device_copy_and_no_device_allocation_per_step(step_and_rows):
    step, prev_rows = step_and_rows
    meta = torch.device("meta")
    staging = StagingArea(meta, nbytes=1 << 16)
    assert staging.staged  # a device that is not the CPU
    ex = StandInExecutor(TritonBackend(None, meta), staging, torch.empty(PREV, dtype=torch.long, device=meta),
                         prev_rows)
    with OpLog() as log:
        ex._prepare(step)
    copies = [devices for name, devices in log.ops if name.startswith("copy_") and "cpu" in devices]
    assert copies == [("meta", "cpu", "meta")]  # dst, src, out: the one copy of the step
    others = {name for name, _ in log.ops if name.split(".")[0] not in VIEWS} - {"copy_.default"}
    # in-place writes into the staging (PLACEHOLDER inputs gathered into the pack's spare row)
    assert others <= ({"index_copy_.default", "index_select.out"} if step.placeholders else set()), others
    assert staging.copies == 1 and len(ex.copied) == (1 if step.block_copies else 0)


class RecordingModel:
    """Stands in for the model under the decode runner: records the static inputs each replay reads."""

    def __init__(self) -> None:
        self.seen: list[dict] = []

    def __call__(self, input_ids, backend, meta, kv_caches):
        self.seen.append(dict(ids=input_ids.clone(), positions=meta.positions.clone(),
                              slots=meta.slot_mapping.clone(), lens=meta.decode_context_lens.clone(),
                              tables=meta.decode_block_tables.clone()))
        return torch.zeros(input_ids.shape[0], 4)


@settings(max_examples=25, deadline=None)
@given(batch=st.lists(steps(decodes_only=True), min_size=1, max_size=4))
def test_the_decode_runner_fills_its_static_inputs_with_one_copy(batch):
    model = RecordingModel()
    runner = DecodeRunner(model, TritonBackend(None, CPU), None, max_batch=6, max_blocks_per_seq=40, device=CPU,
                          use_graphs=False)
    prev_tokens = torch.randint(0, 5000, (PREV,))
    copied = []
    for k, (step, prev_rows) in enumerate(batch, 1):
        runner.run_step(step, prev_tokens, prev_rows, lambda s, d: copied.append((s.tolist(), d.tolist())))
        assert runner.uploader.copies == k
        n, seen = len(step.token_ids), model.seen[-1]
        bucket = seen["ids"].shape[0]
        assert bucket == next(b for b in runner.buckets if b >= n)
        assert seen["ids"][:n].tolist() == old_input_ids(step, prev_tokens, prev_rows).tolist()
        assert seen["positions"][:n].tolist() == step.batch.positions.tolist()
        assert seen["slots"].tolist() == step.batch.slot_mapping.tolist() + [-1] * (bucket - n)
        assert seen["lens"].tolist() == [s.end for s in step.batch.spans] + [0] * (bucket - n)
        for row, span in enumerate(step.batch.spans):
            assert seen["tables"][row, : len(span.block_table)].tolist() == span.block_table
        if step.block_copies:
            assert copied[-1] == ([s for s, _ in step.block_copies], [d for _, d in step.block_copies])


@pytest.mark.gpu
@settings(max_examples=20, deadline=None)
@given(batch=st.lists(steps(), min_size=1, max_size=4))
def test_cuda_step_packing_neither_allocates_nor_synchronises(batch):
    """On CUDA: pinned staging, one copy, no device memory allocated and no synchronisation while a step is
    packed (torch's sync debug mode raises on any), and the views hold what the old code built."""
    cuda = torch.device("cuda")
    staging = StagingArea(cuda, nbytes=1 << 16)
    assert staging.uploader.host_arrays is not None and staging.uploader._host[0].is_pinned()
    prev_tokens = torch.randint(0, 5000, (PREV,), device=cuda)
    for step, prev_rows in batch:
        ex = StandInExecutor(TritonBackend(None, cuda), staging, prev_tokens, prev_rows)
        torch.cuda.synchronize()
        allocations = torch.cuda.memory_stats().get("allocation.all.allocated", 0)
        copies = staging.copies
        torch.cuda.set_sync_debug_mode("error")
        try:
            prepared = ex._prepare(step)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        assert torch.cuda.memory_stats().get("allocation.all.allocated", 0) == allocations
        assert staging.copies == copies + 1
        check_step(ex, step, prev_rows, "triton", prepared)


@pytest.mark.gpu
@pytest.mark.parametrize("eager", [False, True], ids=["graphs", "enforce-eager"])
def test_cuda_engine_steps_copy_once_and_synchronise_only_in_result(eager):
    """The engine on CUDA (the tiny Qwen3 shape, dummy weights, token ids): every greedy step is launched with no
    synchronisation (sync debug mode "error" around `execute_async`) and one host-to-device copy (the staging's
    or the decode runner's); prefills in chunks, decodes in graphs (or eager)."""
    from hetero_infer import LLM

    shape = Path(__file__).resolve().parents[2] / "benchmarks" / "shapes" / "tiny-qwen3"
    llm = LLM(str(shape), load_format="dummy", skip_tokenizer_init=True, device="cuda", dtype="bfloat16",
              max_num_blocks=256, max_num_seqs=16, max_num_batched_tokens=64, enforce_eager=eager)
    ex = llm.engine.executor
    launched = []
    launch = ex.execute_async

    def checked_launch(sched, sampling):
        before = ex.staging.copies + ex.decode_runner.uploader.copies
        torch.cuda.set_sync_debug_mode("error")
        try:
            handle = launch(sched, sampling)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        launched.append(ex.staging.copies + ex.decode_runner.uploader.copies - before)
        return handle
    ex.execute_async = checked_launch
    prompts = [[(7 * i + 13 * j) % 4000 + 10 for j in range(n)] for i, n in enumerate([5, 70, 33, 1, 120, 17])]
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=SamplingParams(temperature=0, max_tokens=12,
                                                                                 ignore_eos=True))
    assert all(len(o.outputs[0].token_ids) == 12 for o in outs)
    assert launched and set(launched) == {1}
    assert ex.decode_runner.num_steps > 0 and ex.staging.grows == 0  # 64 KiB holds a 64-token step
