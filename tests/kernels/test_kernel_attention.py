"""Paged attention (decode, prefill) and the KV-cache write: Triton kernels and the
PyTorch reference against naive float64 oracles."""

from __future__ import annotations

import pytest
import torch
from kernel_testing import (
    DTYPES,
    assert_close,
    dense_kv,
    make_paged_kv,
    naive_attention_rows,
    poison,
    randn,
    strided_view,
)

from hetero_infer import kernels
from hetero_infer.kernels import reference
from hetero_infer.kernels._backend import next_pow2

gpu = pytest.mark.gpu

# (context_lens, num_heads, num_kv_heads, head_dim, block_size)
DECODE_CASES = [
    pytest.param(([1, 17, 64, 130], 4, 4, 64, 16), id="mha-odd-lens"),
    pytest.param(([5, 33, 100], 8, 2, 32, 8), id="gqa4"),
    pytest.param(([1, 203], 8, 1, 64, 16), id="mqa8-split"),
    pytest.param(([77], 6, 2, 80, 4), id="hd80-bs4"),
    pytest.param(([10, 23], 4, 2, 32, 3), id="bs3"),
    pytest.param(([1, 1000, 4096, 16384], 32, 8, 128, 16), id="llama-long", marks=gpu),
    pytest.param(([3000] * 16 + [1, 15, 16, 17], 64, 8, 128, 16), id="gqa8-batch", marks=gpu),
    pytest.param(([2048, 777, 9], 16, 16, 64, 16), id="mha-hd64", marks=gpu),
    pytest.param(([513, 4097], 8, 1, 256, 16), id="mqa-hd256", marks=gpu),
    pytest.param(([300] * 64, 9, 3, 64, 16), id="smollm-shape", marks=gpu),
]

# (q_lens, context_lens, num_heads, num_kv_heads, head_dim, block_size)
PREFILL_CASES = [
    pytest.param(([5, 1, 20], [5, 30, 40], 8, 2, 64, 16), id="prefix-decode-mix"),
    pytest.param(([17, 33], [17, 33], 4, 4, 32, 8), id="plain-odd"),
    pytest.param(([1, 1, 1], [3, 50, 17], 8, 1, 64, 16), id="all-decode-mqa8"),
    pytest.param(([40], [100], 4, 2, 80, 4), id="chunk-hd80"),
    pytest.param(([3, 0, 4], [3, 9, 10], 4, 2, 32, 16), id="empty-seq"),
    pytest.param(([1000, 17, 1], [1000, 2065, 4000], 32, 8, 128, 16), id="llama-mix", marks=gpu),
    pytest.param(([4096], [4096], 32, 8, 128, 16), id="prefill-4k", marks=gpu),
    pytest.param(([512] * 8, [512 * k for k in range(1, 9)], 16, 2, 64, 16), id="chunks", marks=gpu),
    pytest.param(([300, 301], [300, 1000], 8, 8, 256, 16), id="hd256", marks=gpu),
]


def _decode_oracle(q, batch, scale, window=None):
    out = torch.zeros(q.shape, dtype=torch.float64)
    for b in range(q.shape[0]):
        n = int(batch.context_lens[b])
        if n == 0:
            continue
        k, v = dense_kv(batch, b)
        out[b] = naive_attention_rows(q[b : b + 1], k, v, [n - 1], scale, window)[0]
    return out


def _prefill_oracle(q, batch, q_lens, scale, window=None):
    out = torch.zeros(q.shape, dtype=torch.float64)
    start = 0
    for b, ql in enumerate(q_lens):
        n = int(batch.context_lens[b])
        if ql:
            k, v = dense_kv(batch, b)
            positions = list(range(n - ql, n))
            out[start : start + ql] = naive_attention_rows(q[start : start + ql], k, v, positions, scale, window)
        start += ql
    return out


# --------------------------------------------------------------------------- decode


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", DECODE_CASES)
def test_decode_triton(case, dtype, device, triton_backend):
    lens, h, kvh, d, bs = case
    batch = make_paged_kv(lens, kvh, d, bs, dtype, device)
    q = randn(len(lens), h, d, dtype=dtype, device=device)
    scale = d**-0.5
    out = poison(torch.empty_like(q))
    got = kernels.paged_attention_decode(q, batch.k_cache, batch.v_cache, batch.block_tables, batch.context_lens, scale, out)
    assert got is out
    assert_close(out, _decode_oracle(q, batch, scale), dtype, what="decode")


@pytest.mark.parametrize("hint", [None, 40])
@pytest.mark.parametrize("num_splits", [1, 3, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_split_counts(num_splits, hint, dtype, device, triton_backend):
    """The split-KV path (partials + reduce) for fixed split counts, including splits that
    fall entirely past a short sequence's end, and a planning bound (40) below the longest
    context (97), which the last partition must absorb."""
    from hetero_infer.kernels import _triton_attention

    lens = [1, 40, 97]
    batch = make_paged_kv(lens, 2, 32, 16, dtype, device)
    q = randn(3, 4, 32, dtype=dtype, device=device)
    out = poison(torch.empty_like(q))
    _triton_attention.paged_attention_decode(
        q, batch.k_cache, batch.v_cache, batch.block_tables, batch.context_lens, 0.3, out,
        max_context_len=hint, num_splits=num_splits,
    )
    assert_close(out, _decode_oracle(q, batch, 0.3), dtype, what=f"decode splits={num_splits}")


def test_decode_split_planning(device):
    from hetero_infer.kernels._backend import num_sms
    from hetero_infer.kernels._triton_attention import MAX_SPLITS, plan_decode_splits

    target = 2 * num_sms(device)  # the device's SMs; a nominal 8 in the interpreter
    # plenty of (sequence, KV head) programs: no split, whatever the contexts
    assert plan_decode_splits(target, 8, device, max_len=40960, min_partition=256) == 1
    assert plan_decode_splits(target // 8, 8, device, max_len=10**6, min_partition=256) == 1
    for batch, heads in [(1, 8), (1, 1), (3, 2), (target // 8 - 1, 8)]:
        want = min(-(-target // (batch * heads)), MAX_SPLITS)
        # from the batch alone: a CUDA graph's table (max_model_len wide) plans what a tight table plans
        for max_len in (None, 40960, 131072, want * 256):
            assert plan_decode_splits(batch, heads, device, max_len=max_len, min_partition=256) == want, max_len
        # a host bound below the splits' reach caps them (never below one)
        assert plan_decode_splits(batch, heads, device, max_len=300, min_partition=256) == min(want, 2)
        assert plan_decode_splits(batch, heads, device, max_len=0, min_partition=256) == 1
    # the tuner's knobs
    assert plan_decode_splits(4, 2, device, target_programs=64, max_splits=64) == 8
    assert plan_decode_splits(1, 1, device, target_programs=1000, max_splits=5) == 5
    assert plan_decode_splits(64, 2, device, target_programs=64) == 1


#: A CUDA graph's block-table width for Qwen3 (max_model_len 40,960 tokens in 16-token blocks).
GRAPH_WIDTH = 2560


def _widened(tables: torch.Tensor, width: int = GRAPH_WIDTH) -> torch.Tensor:
    """``tables`` padded with zeros (block 0) to ``width`` columns, as the CUDA-graph runner's static tables."""
    wide = torch.zeros(tables.shape[0], width, dtype=tables.dtype, device=tables.device)
    wide[:, : tables.shape[1]] = tables
    return wide


def test_decode_partitions_ignore_the_table_width(device, triton_backend):
    """A tight table and one max_model_len wide (a CUDA graph's) give the same output: the wide one may plan more
    splits (the width only loosens the cap on them), but each sequence cuts its own context into the same
    partitions and the extra splits are empty (test_decode_partitions_follow_each_context reads the partitions).
    Not bit for bit on a GPU: the reduce over 2 or 64 splits may contract its multiply-adds differently."""
    from hetero_infer.kernels import _triton_attention as A

    lens = [1, 300]
    batch = make_paged_kv(lens, 2, 16, 16, torch.float32, device)
    q = randn(2, 4, 16, dtype=torch.float32, device=device)
    grids, outs = [], []
    real = A._decode_kernel

    class Recorder:
        def __getitem__(self, grid):
            grids.append(grid)
            return real[grid]

    A._decode_kernel = Recorder()
    try:
        for table in (batch.block_tables[:, : -(-max(lens) // 16)], _widened(batch.block_tables)):
            outs.append(poison(torch.empty_like(q)))
            A.paged_attention_decode(q, batch.k_cache, batch.v_cache, table, batch.context_lens, 0.3, outs[-1])
    finally:
        A._decode_kernel = real
    assert grids[0][:2] == grids[1][:2] and grids[1][2] >= grids[0][2] > 1, grids
    torch.testing.assert_close(outs[0], outs[1], rtol=2e-6, atol=2e-6)


# Ragged contexts: a one-token sequence, around one block (16), a few tiles, many tiles; 0 is a padding row.
RAGGED = [1, 15, 16, 17, 300, 2000, 0]


def _ragged(dtype, device, width=None, d=16):
    batch = make_paged_kv([max(n, 1) for n in RAGGED], 2, d, 16, dtype, device)
    batch.context_lens = torch.tensor(RAGGED, dtype=batch.block_tables.dtype, device=device)
    if width is not None:
        batch.block_tables = _widened(batch.block_tables, width)
    return batch, randn(len(RAGGED), 4, d, dtype=dtype, device=device)


# 64-token tiles keep the interpreter quick over 2,000 tokens; the 16-token ones are covered above
@pytest.mark.parametrize(
    "width,num_splits,window,config",
    [
        # 40,960 tokens wide, the plan from the batch (7 x 2 programs against 64: 5 splits)
        pytest.param(GRAPH_WIDTH, None, None, {"TARGET_PROGRAMS": 64, "BLOCK_N": 64}, id="graph-table"),
        pytest.param(None, 8, None, {"BLOCK_N": 64, "MIN_PARTITION": 64}, id="8-splits"),
        pytest.param(GRAPH_WIDTH, 8, 100, {"BLOCK_N": 64, "MIN_PARTITION": 64}, id="window-8-splits"),
    ],
)
def test_decode_ragged_contexts(width, num_splits, window, config, device, triton_backend):
    """Contexts from 0 to 2,000 tokens in one batch, each cut into its own partitions (most splits of the short
    ones empty); float32, so a token dropped or read twice at any partition's edge (1 in 2,000) shows."""
    from hetero_infer.kernels import _triton_attention

    batch, q = _ragged(torch.float32, device, width)
    out = poison(torch.empty_like(q))
    _triton_attention.paged_attention_decode(
        q, batch.k_cache, batch.v_cache, batch.block_tables, batch.context_lens, 0.3, out, window,
        num_splits=num_splits, config=config,
    )
    assert_close(out, _decode_oracle(q, batch, 0.3, window), torch.float32, what="ragged decode")
    assert torch.all(out[-1] == 0), "a context-0 (padding) row must give zeros"


@gpu
@pytest.mark.parametrize("config", [None, {"num_stages": 2}, {"num_stages": 4}], ids=["default", "stages2", "stages4"])
def test_decode_qwen3_shape_under_graph_table(config, device, triton_backend):
    """The engine's CUDA-graph decode on the Qwen3-0.6B shape (16 query / 8 KV heads of 128, bf16, 16-token blocks,
    a 40,960-token table): ragged contexts at batch 1, 8 (split) and 64 (not split), on the compiled tensor-core
    path with the default and the tuner's other pipeline depths."""
    from hetero_infer.kernels import _triton_attention

    for lens in ([1500], [1, 15, 16, 17, 300, 2000, 1500, 0], [600 + 23 * i for i in range(64)]):
        batch = make_paged_kv([max(n, 1) for n in lens], 8, 128, 16, torch.bfloat16, device)
        batch.context_lens = torch.tensor(lens, dtype=torch.int32, device=device)
        batch.block_tables = _widened(batch.block_tables)
        q = randn(len(lens), 16, 128, dtype=torch.bfloat16, device=device)
        out = poison(torch.empty_like(q))
        workspace = kernels.decode_workspace(16, 8, 128, 16, torch.bfloat16, device)
        _triton_attention.paged_attention_decode(
            q, batch.k_cache, batch.v_cache, batch.block_tables, batch.context_lens, 128**-0.5, out, config=config,
            workspace=workspace,
        )
        assert_close(out, _decode_oracle(q, batch, 128**-0.5), torch.bfloat16, what=f"qwen3 decode {len(lens)}")


def _partials(workspace, b, h, splits, d):
    """The float32 partials (acc, m, l) of a split decode, as the kernel lays them out in its workspace."""
    rows, bd = b * h * splits, d
    return (workspace[: rows * bd].view(b, h, splits, bd), workspace[rows * bd : rows * (bd + 1)].view(b, h, splits),
            workspace[rows * (bd + 1) : rows * (bd + 2)].view(b, h, splits))


@pytest.mark.parametrize("window", [None, 100])
def test_decode_partitions_follow_each_context(window, device, triton_backend):
    """White box: with q = 0 every score is 0, so a split's l is the number of tokens it attended. 8 splits,
    MIN_PARTITION 64, 64-token tiles: each context (or window) is cut into min(8, cdiv(span, 64)) partitions of
    cdiv(span / parts) rounded up to 64 tokens, the rest empty (m = -inf, l = 0, acc = 0); a 40,960-token table
    changes nothing."""
    from hetero_infer.kernels import _triton_attention

    batch, _ = _ragged(torch.float32, device, width=GRAPH_WIDTH)
    q = torch.zeros(len(RAGGED), 4, 16, dtype=torch.float32, device=device)
    splits, out = 8, poison(torch.empty_like(q))
    workspace = poison(torch.empty(len(RAGGED) * 4 * splits * 18, dtype=torch.float32, device=device))
    _triton_attention.paged_attention_decode(
        q, batch.k_cache, batch.v_cache, batch.block_tables, batch.context_lens, 0.3, out, window,
        num_splits=splits, config={"BLOCK_N": 64, "MIN_PARTITION": 64}, workspace=workspace,
    )
    acc, m, sums = _partials(workspace.cpu(), len(RAGGED), 4, splits, 16)
    if window is None:
        want = {1: [1], 15: [15], 16: [16], 17: [17], 300: [64, 64, 64, 64, 44], 2000: [256] * 7 + [208], 0: []}
    else:  # the window's span: 100 tokens -> 2 partitions of 64 and 36
        want = {1: [1], 15: [15], 16: [16], 17: [17], 300: [64, 36], 2000: [64, 36], 0: []}
    for b, n in enumerate(RAGGED):
        counts = want[n] + [0] * (splits - len(want[n]))
        assert sums[b].tolist() == [counts] * 4, (n, sums[b, 0].tolist())
        assert torch.all(torch.where(sums[b] > 0, m[b] == 0, m[b] == float("-inf"))), n
        assert torch.all(acc[b][sums[b] == 0] == 0), n
        # each split's acc is the sum of its tokens' values
        _, v = dense_kv(batch, b)
        lo = 0 if window is None else max(n - window, 0)
        for sp, c in enumerate(counts):
            want_acc = v[lo : lo + c].sum(0).repeat_interleave(2, dim=0).cpu()  # [KVH, D] -> [H, D] (group 2)
            assert torch.allclose(acc[b, :, sp].double(), want_acc, atol=1e-4), (n, sp)
            lo += c
    assert torch.all(out[RAGGED.index(0)] == 0)


def test_decode_workspace_equals_allocating(device, triton_backend):
    """A preallocated workspace (kernels.decode_workspace, poisoned) gives bit-identical outputs to the
    allocating path at every batch size the interpreter's plan splits; one too small lowers the splits (still
    correct); an explicit split count that does not fit is an error."""
    from hetero_infer.kernels import _triton_attention

    h, kvh, d, dtype = 4, 2, 16, torch.float16
    workspace = kernels.decode_workspace(h, kvh, d, 16, dtype, device)
    assert workspace.dtype == torch.float32 and workspace.numel() > 0
    poison(workspace)
    for lens in ([5, 100, 17, 0], [250]):  # 2 and 5 splits
        batch = make_paged_kv([max(n, 1) for n in lens], kvh, d, 16, dtype, device)
        batch.context_lens = torch.tensor(lens, dtype=torch.int32, device=device)
        q = randn(len(lens), h, d, dtype=dtype, device=device)
        args = (q, batch.k_cache, batch.v_cache, batch.block_tables, batch.context_lens, 0.3)
        want = kernels.paged_attention_decode(*args)
        got = kernels.paged_attention_decode(*args, workspace=workspace)
        assert torch.equal(got, want), lens
        assert_close(got, _decode_oracle(q, batch, 0.3), dtype, what="decode with a workspace")
    assert not torch.isnan(workspace).all(), "the partials went elsewhere"
    small = poison(torch.empty(1 * h * 2 * 18, dtype=torch.float32, device=device))  # two splits of one sequence
    got = kernels.paged_attention_decode(*args, workspace=small)
    assert_close(got, _decode_oracle(q, batch, 0.3), dtype, what="decode with a small workspace")
    with pytest.raises(ValueError, match="workspace holds 2 splits"):
        _triton_attention.paged_attention_decode(*args, torch.empty_like(q), num_splits=3, workspace=small)
    with pytest.raises(TypeError, match="workspace"):
        kernels.paged_attention_decode(*args, workspace=small.double())


def test_the_triton_backend_keeps_one_workspace_per_shape(device, triton_backend):
    """The engine's backend makes a shape's workspace once and hands the same buffer to every later decode."""
    from hetero_infer.worker.runner.attention.triton_backend import TritonBackend

    backend = TritonBackend(None, device)
    kc = torch.empty(4, 16, 2, 32, dtype=torch.float16, device=device)
    first = backend.decode_workspace(torch.empty(3, 4, 32, dtype=torch.float16, device=device), kc)
    assert first.numel() == kernels.decode_workspace(4, 2, 32, 16, torch.float16, device).numel() > 0
    assert backend.decode_workspace(torch.empty(7, 4, 32, dtype=torch.float16, device=device), kc) is first
    other = backend.decode_workspace(torch.empty(3, 8, 32, dtype=torch.float16, device=device), kc)
    assert other is not first and other.numel() > first.numel()


def test_decode_workspace_holds_every_batch(monkeypatch):
    """The workspace's size bounds every batch's partials on an H100-like device (132 SMs) and stays small."""
    from hetero_infer.kernels import _backend as B
    from hetero_infer.kernels import _triton_attention as A

    monkeypatch.setattr(B, "compiled", lambda device: True)
    monkeypatch.setattr(B, "num_sms", lambda device: 132)
    monkeypatch.setattr(A.tuned, "lookup", lambda *a: None)  # the built-in configs
    cpu = torch.device("cpu")
    for h, kvh, d in [(16, 8, 128), (32, 8, 128), (8, 1, 256), (9, 3, 64)]:
        numel = A.decode_workspace_numel(h, kvh, d, 16, torch.bfloat16, cpu)
        cfg = A._decode_settings(d, torch.bfloat16, cpu, None, group=h // kvh, page=16, batch=1)
        splits = {b: A._plan(cfg, b, kvh, cpu, None) for b in range(1, 1025)}
        assert max(b * h * s * (next_pow2(d) + 2) for b, s in splits.items() if s > 1) == numel
        assert numel * 4 < 8 << 20, (h, kvh, d, numel)
    # the nano-vllm shape: 0.5 MiB (at most 64 sequences x splits: 32 sequences, 2 splits)
    assert A.decode_workspace_numel(16, 8, 128, 16, torch.bfloat16, cpu) == 64 * 16 * 130
    # a tuned table that splits more at some batch gets a workspace that holds it
    monkeypatch.setattr(A.tuned, "lookup", lambda kernel, key, batch, device: {"TARGET_PROGRAMS": 4096}
                        if batch == 100 else None)
    assert A.decode_workspace_numel(16, 8, 128, 16, torch.bfloat16, cpu) == 100 * 16 * 6 * 130


@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_decode_sliding_window_zero_len_and_hint(backend, device):
    dtype = torch.float16
    lens = [0, 1, 50, 90]
    batch = make_paged_kv(lens, 2, 32, 8, dtype, device)
    q = randn(4, 4, 32, dtype=dtype, device=device)
    with kernels.use_backend(backend):
        out = poison(torch.empty_like(q))
        kernels.paged_attention_decode(
            q, batch.k_cache, batch.v_cache, batch.block_tables, batch.context_lens, 0.2, out, sliding_window=20
        )
        assert_close(out, _decode_oracle(q, batch, 0.2, window=20), dtype, what="decode window")
        assert torch.all(out[0] == 0), "a zero-length (padding) row must give zeros"
        out2 = kernels.paged_attention_decode(
            q, batch.k_cache, batch.v_cache, batch.block_tables, batch.context_lens, 0.2, max_context_len=90
        )
        assert_close(out2, _decode_oracle(q, batch, 0.2), dtype, what="decode with max_context_len")
        # a hint below the true maximum is still correct (the last partition takes the rest)
        out3 = kernels.paged_attention_decode(
            q, batch.k_cache, batch.v_cache, batch.block_tables, batch.context_lens, 0.2, max_context_len=8
        )
        assert_close(out3, _decode_oracle(q, batch, 0.2), dtype, what="decode with a low max_context_len")


@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_strided_q_int64_tables(dtype, device, triton_backend):
    lens = [9, 31]
    batch = make_paged_kv(lens, 2, 64, 16, dtype, device, index_dtype=torch.int64)
    q = strided_view(randn(2, 8, 64, dtype=dtype, device=device))
    out = kernels.paged_attention_decode(q, batch.k_cache, batch.v_cache, batch.block_tables, batch.context_lens, 0.125)
    assert out.is_contiguous()
    assert_close(out, _decode_oracle(q, batch, 0.125), dtype, what="decode strided")


@pytest.mark.parametrize("case", DECODE_CASES[:5])
def test_decode_reference(case):
    """The CPU path itself is checked against the naive oracle."""
    lens, h, kvh, d, bs = case
    batch = make_paged_kv(lens, kvh, d, bs, torch.float32, "cpu")
    q = randn(len(lens), h, d, dtype=torch.float32, device="cpu")
    out = reference.paged_attention_decode(q, batch.k_cache, batch.v_cache, batch.block_tables, batch.context_lens, 0.1)
    assert_close(out, _decode_oracle(q, batch, 0.1), torch.float32, what="reference decode")


# --------------------------------------------------------------------------- prefill


def _prefill_inputs(case, dtype, device, strided=False):
    q_lens, lens, h, kvh, d, bs = case
    batch = make_paged_kv(lens, kvh, d, bs, dtype, device)
    t = sum(q_lens)
    q = randn(t, h, d, dtype=dtype, device=device)
    if strided:
        q = strided_view(q)
    cu = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32, device=device)
    return q, batch, cu, q_lens


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", PREFILL_CASES)
def test_prefill_triton(case, dtype, device, triton_backend):
    q, batch, cu, q_lens = _prefill_inputs(case, dtype, device)
    scale = q.shape[-1] ** -0.5
    out = poison(torch.empty_like(q))
    got = kernels.paged_attention_prefill(
        q, batch.k_cache, batch.v_cache, batch.block_tables, cu, batch.context_lens, scale, out
    )
    assert got is out
    assert_close(out, _prefill_oracle(q, batch, q_lens, scale), dtype, what="prefill")


@pytest.mark.parametrize("backend", ["triton", "reference"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_sliding_window_strided(backend, dtype, device):
    case = ([20, 7, 1], [20, 40, 33], 6, 3, 32, 8)
    q, batch, cu, q_lens = _prefill_inputs(case, dtype, device, strided=True)
    with kernels.use_backend(backend):
        out = poison(torch.empty(q.shape, dtype=dtype, device=device))
        kernels.paged_attention_prefill(
            q, batch.k_cache, batch.v_cache, batch.block_tables, cu, batch.context_lens, 0.25, out, sliding_window=6
        )
    assert_close(out, _prefill_oracle(q, batch, q_lens, 0.25, window=6), dtype, what="prefill window")


@pytest.mark.parametrize("block", [(16, 16), (32, 16), (16, 32)])
def test_prefill_tile_shapes(block, device, triton_backend):
    """Different query/KV tile sizes (the GPU uses 64-128 row tiles)."""
    from hetero_infer.kernels import _triton_attention

    case = ([37, 5], [50, 5], 4, 2, 32, 16)
    q, batch, cu, q_lens = _prefill_inputs(case, torch.float16, device)
    out = poison(torch.empty_like(q))
    _triton_attention.paged_attention_prefill(
        q, batch.k_cache, batch.v_cache, batch.block_tables, cu, batch.context_lens, 0.2, out,
        config={"BLOCK_M": block[0], "BLOCK_N": block[1]},
    )
    assert_close(out, _prefill_oracle(q, batch, q_lens, 0.2), torch.float16, what=f"prefill {block}")


# Cached prefixes around the 16-token page and the tiles' edges; each chunk (20 tokens: two 16-row query tiles)
# spans the next block-table entries, and a decode row (one token after 40) and an empty sequence ride along.
PREFETCH_Q = [20] * 7 + [1, 0]
PREFETCH_PREFIX = [1, 15, 16, 17, 63, 64, 65, 40, 9]


@pytest.mark.parametrize(
    "page,config,window,index_dtype",
    [
        pytest.param(16, {"BLOCK_M": 16, "BLOCK_N": 16}, None, torch.int32, id="page16-n16"),
        pytest.param(8, {"BLOCK_M": 16, "BLOCK_N": 32}, None, torch.int64, id="page8-n32-int64"),
        pytest.param(32, {"BLOCK_M": 16, "BLOCK_N": 16}, 24, torch.int32, id="page32-n16-window"),
        pytest.param(5, {"BLOCK_M": 16, "BLOCK_N": 16}, 24, torch.int64, id="page5-n16-window-int64"),
        pytest.param(16, {"BLOCK_M": 32, "BLOCK_N": 64}, None, torch.int32, id="page16-n64"),
        pytest.param(16, {"BLOCK_M": 16, "BLOCK_N": 64}, 8, torch.int64, id="page16-n64-window-int64"),
    ],
)
def test_prefill_prefetch_across_tiles(page, config, window, index_dtype, device, triton_backend):
    """The K/V loop loads the next tile's block-table entries one iteration ahead: a chunk after each cached
    prefix must read every tile from its own blocks (scattered at random), whether a tile spans several blocks
    (page < BLOCK_N), shares one with the next (page > BLOCK_N) or straddles two (page 5), from a window's first
    tile or from 0, through int32 or int64 tables. float32, so one token read from the wrong block shows."""
    from hetero_infer.kernels import _triton_attention

    lens = [p + q for p, q in zip(PREFETCH_PREFIX, PREFETCH_Q, strict=True)]
    batch = make_paged_kv(lens, 1, 16, page, torch.float32, device, index_dtype=index_dtype)
    q = randn(sum(PREFETCH_Q), 2, 16, dtype=torch.float32, device=device)
    cu = torch.tensor([0, *torch.tensor(PREFETCH_Q).cumsum(0).tolist()], dtype=torch.int32, device=device)
    out = poison(torch.empty_like(q))
    _triton_attention.paged_attention_prefill(
        q, batch.k_cache, batch.v_cache, batch.block_tables, cu, batch.context_lens, 0.3, out, window, config=config
    )
    assert_close(out, _prefill_oracle(q, batch, PREFETCH_Q, 0.3, window), torch.float32, what="prefill prefetch")


@pytest.mark.parametrize("case", PREFILL_CASES[:5])
def test_prefill_reference(case):
    q, batch, cu, q_lens = _prefill_inputs(case, torch.float32, "cpu")
    out = reference.paged_attention_prefill(q, batch.k_cache, batch.v_cache, batch.block_tables, cu, batch.context_lens, 0.1)
    assert_close(out, _prefill_oracle(q, batch, q_lens, 0.1), torch.float32, what="reference prefill")


def test_prefill_matches_decode_for_single_tokens(device, triton_backend):
    """A prefill batch of one-token sequences computes exactly what decode computes."""
    lens = [4, 19, 64]
    batch = make_paged_kv(lens, 2, 32, 16, torch.float32, device)
    q = randn(3, 8, 32, dtype=torch.float32, device=device)
    cu = torch.arange(4, dtype=torch.int32, device=device)
    a = kernels.paged_attention_prefill(q, batch.k_cache, batch.v_cache, batch.block_tables, cu, batch.context_lens, 0.2)
    b = kernels.paged_attention_decode(q, batch.k_cache, batch.v_cache, batch.block_tables, batch.context_lens, 0.2)
    assert_close(a, b.double(), torch.float32, what="prefill vs decode")


# --------------------------------------------------------------------------- KV write


@pytest.mark.parametrize("backend", ["triton", "reference"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "shape",
    [
        pytest.param((7, 2, 32, 16), id="small"),
        pytest.param((5, 3, 80, 3), id="odd"),
        pytest.param((4096, 8, 128, 16), id="large", marks=gpu),
    ],
)
def test_write_kv_cache(backend, dtype, shape, device):
    t, kvh, d, bs = shape
    num_blocks = t // bs + 4
    k_cache = randn(num_blocks, bs, kvh, d, dtype=dtype, device=device)
    v_cache = randn(num_blocks, bs, kvh, d, dtype=dtype, device=device)
    want_k, want_v = k_cache.clone().cpu(), v_cache.clone().cpu()
    k = strided_view(randn(t, kvh, d, dtype=dtype, device=device))
    v = randn(t, kvh, d, dtype=dtype, device=device)
    slots = torch.randperm(num_blocks * bs)[:t]
    slots[1] = -1  # padding token
    for i, s in enumerate(slots.tolist()):
        if s >= 0:
            want_k[s // bs, s % bs] = k[i].cpu()
            want_v[s // bs, s % bs] = v[i].cpu()
    for index_dtype in (torch.int64, torch.int32):
        kc, vc = k_cache.clone(), v_cache.clone()
        with kernels.use_backend(backend):
            kernels.write_kv_cache(k, v, kc, vc, slots.to(device=device, dtype=index_dtype))
        assert torch.equal(kc.cpu(), want_k) and torch.equal(vc.cpu(), want_v)


def test_write_then_attend_roundtrip(device, triton_backend):
    """Write a sequence token by token through slot mappings, then attend over it."""
    dtype, kvh, h, d, bs = torch.float16, 2, 4, 32, 4
    n = 11
    k_cache = poison(torch.empty(8, bs, kvh, d, dtype=dtype, device=device))
    v_cache = poison(torch.empty(8, bs, kvh, d, dtype=dtype, device=device))
    table = torch.tensor([[5, 2, 7]], dtype=torch.int32, device=device)
    k = randn(n, kvh, d, dtype=dtype, device=device)
    v = randn(n, kvh, d, dtype=dtype, device=device)
    slots = torch.tensor([int(table[0, j // bs]) * bs + j % bs for j in range(n)], device=device)
    kernels.write_kv_cache(k, v, k_cache, v_cache, slots)
    q = randn(1, h, d, dtype=dtype, device=device)
    out = kernels.paged_attention_decode(q, k_cache, v_cache, table, torch.tensor([n], device=device, dtype=torch.int32), 0.3)
    want = naive_attention_rows(q, k.cpu().double(), v.cpu().double(), [n - 1], 0.3)
    assert_close(out, want, dtype, what="write+decode")


# --------------------------------------------------------------------------- property-based

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@st.composite
def _varlen_batches(draw):
    kvh = draw(st.sampled_from([1, 2]))
    group = draw(st.sampled_from([1, 3, 4]))
    head_dim = draw(st.sampled_from([16, 32, 48]))
    block_size = draw(st.sampled_from([1, 4, 5, 16]))
    n_seqs = draw(st.integers(1, 4))
    q_lens = draw(st.lists(st.integers(0, 24), min_size=n_seqs, max_size=n_seqs))
    prefixes = draw(st.lists(st.integers(0, 40), min_size=n_seqs, max_size=n_seqs))
    window = draw(st.one_of(st.none(), st.integers(1, 30)))
    dtype = draw(st.sampled_from(DTYPES))
    return kvh, group, head_dim, block_size, q_lens, prefixes, window, dtype


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_varlen_batches())
def test_prefill_and_decode_property(device, params):
    """Random varlen batches (empty sequences, block size 1, windows) through both kernels."""
    kvh, group, d, bs, q_lens, prefixes, window, dtype = params
    lens = [p + ql for p, ql in zip(q_lens, prefixes, strict=True)]
    batch = make_paged_kv([max(n, 1) for n in lens], kvh, d, bs, dtype, device)
    batch.context_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    h = kvh * group
    q = randn(sum(q_lens), h, d, dtype=dtype, device=device)
    cu = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32, device=device)
    with kernels.use_backend("triton"):
        out = poison(torch.empty_like(q))
        kernels.paged_attention_prefill(
            q, batch.k_cache, batch.v_cache, batch.block_tables, cu, batch.context_lens, 0.3, out, sliding_window=window
        )
        assert_close(out, _prefill_oracle(q, batch, q_lens, 0.3, window), dtype, what="prefill property")
        qd = randn(len(lens), h, d, dtype=dtype, device=device)
        outd = poison(torch.empty_like(qd))
        kernels.paged_attention_decode(
            qd, batch.k_cache, batch.v_cache, batch.block_tables, batch.context_lens, 0.3, outd, sliding_window=window
        )
        assert_close(outd, _decode_oracle(qd, batch, 0.3, window), dtype, what="decode property")
