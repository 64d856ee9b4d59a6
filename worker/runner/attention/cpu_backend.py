"""The CPU backend: the project's C kernels (kernels/cpu/csrc/, built by `cpu_native`).

Rotary and the cache write are one pass (`cpu_ops.rope_and_cache`). Then decode rows, and the rows of
short prefill chunks, attend over their causal prefix straight from the block pool (`cpu_paged_attention`:
one call per layer, no gather, cached prefixes included); a prefill chunk with enough work (`takes_sdpa`)
gathers its sequence's K/V from its blocks and runs torch's scaled-dot-product attention (its flash kernel for
the CPU, GQA, causal with the chunk's offset), which reuses each K/V row across the chunk's queries where the
paged kernel reads it once per query row: 2-5x faster past the crossover (docs/cpu.md). Norms and the activation
are the fused C ops of `cpu_ops`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from hetero_infer.kernels.cpu import ops as cpu_ops
from hetero_infer.kernels.cpu import paged_attention as cpu_paged_attention
from hetero_infer.worker.runner.attention import torch_backend
from hetero_infer.worker.runner.attention.base import (
    KVCache,
    QKNorm,
    SeqSpan,
    StepBatch,
    normed_qk,
    pad_tables,
)
from hetero_infer.worker.runner.models.rotary import RotaryEmbedding

# A prefill chunk whose rows attend this many (query, key) pairs or more, over two rows or more, attends with SDPA:
# the default, where the engine does not measure its own (`measure_sdpa_min_pairs`, at start-up). The paged
# kernel's cost grows with the pairs, SDPA's has a floor (the gather, the call). When this was set (3d4f6e7, the
# 2-vCPU AMD EPYC, float32, 9 query and 3 KV heads of 64) they crossed near 2,048 pairs; the paged kernel has got
# faster since: on 2026-11-29 (benchmarks/cpu_prefill_attention.py, 2 threads) a fresh 2,048-token prompt took
# 46.9 ms paged against 39.1 ms SDPA in float32 (241 against 46 ms then), and in bfloat16 the paged kernel
# (VDPBF16PS) won every chunk measured (2,048 tokens: 33.5 against 42.1 ms). Taking SDPA from 2,048 pairs had cost
# the default bfloat16 workload ~7% of its tok/s (found by bisecting 71b269d..c2f2e6d to 3d4f6e7).
SDPA_MIN_PAIRS = 2048

# the probe chunks of the measurement: fresh prompts of these many tokens
PROBE_ROWS = (64, 256, 1024, 2048)


def chunk_pairs(start: int, n: int) -> int:
    """The (query, key) pairs of a causal chunk of `n` rows after `start` cached positions."""
    return n * start + n * (n + 1) // 2


def takes_sdpa(span: SeqSpan, min_pairs: int | None = SDPA_MIN_PAIRS) -> bool:
    """Whether a prefill chunk attends with SDPA: two rows or more and `min_pairs` (None: never)."""
    n = span.num_tokens
    return min_pairs is not None and n > 1 and chunk_pairs(span.start, n) >= min_pairs


def sdpa_min_pairs_from(choices: tuple[str, ...], probe_rows: tuple[int, ...] = PROBE_ROWS) -> int | None:
    """The threshold the probes' winners (`choices[i]`: "sdpa" or "paged" at a fresh prompt of `probe_rows[i]`)
    imply: the pairs of the smallest probe from which SDPA wins every larger one; None where the paged kernel
    wins the largest (SDPA never)."""
    first = len(choices)
    while first and choices[first - 1] == "sdpa":
        first -= 1
    return None if first == len(choices) else chunk_pairs(0, probe_rows[first])


def measure_sdpa_min_pairs(dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int, block_size: int,
                           cache=None, threads: int | None = None, timer=None) -> int | None:
    """The SDPA threshold for `dtype` and these heads on this machine, by timing both on fresh prompts of
    PROBE_ROWS tokens (kernels/cpu/select.py's rounds; the paged kernel wins ties); with a `cache`
    (`select.ChoiceCache`), measured once per machine."""
    from hetero_infer.kernels.cpu import select

    entry = f"prefill_attention:{str(dtype).removeprefix('torch.')}:{heads}/{kv_heads}x{head_dim}:{block_size}"
    cached = cache.get(entry) if cache is not None else None
    if cached:
        return sdpa_min_pairs_from(tuple(cached))
    longest = max(PROBE_ROWS)
    blocks = torch.arange(-(-longest // block_size), dtype=torch.long)
    gen = torch.Generator().manual_seed(0)
    k_cache = torch.randn(len(blocks), block_size, kv_heads, head_dim, generator=gen).to(dtype)
    v_cache = torch.randn(len(blocks), block_size, kv_heads, head_dim, generator=gen).to(dtype)
    scale = head_dim**-0.5

    def paged(rows: int):
        q = torch.randn(rows, heads, head_dim, generator=gen).to(dtype)
        tables = blocks.to(torch.int32).repeat(rows, 1)
        lens = torch.arange(1, rows + 1, dtype=torch.int32)
        return lambda: cpu_paged_attention.paged_decode(q, k_cache, v_cache, tables, lens, scale)

    def sdpa(rows: int):
        q = torch.randn(rows, heads, head_dim, generator=gen).to(dtype)
        return lambda: prefill_attention(q, k_cache, v_cache, 0, blocks[: -(-rows // block_size)], scale)

    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        timings = select.measure({"paged": paged, "sdpa": sdpa}, buckets=PROBE_ROWS, timer=timer or select.clock,
                                 rounds=select.Rounds(min_rounds=3, drop_after=3, budget_s=0.4))
    finally:
        torch.set_num_threads(before)
    choices = tuple(select.choose(t, ("paged", "sdpa")) or "paged" for t in timings)
    if cache is not None:
        cache.put(entry, choices, timings)
    return sdpa_min_pairs_from(choices)


def sdpa_label(min_pairs: int | None) -> str:
    """How prefill chunks attend, as the engine's CPU paths print it."""
    return "paged kernel (SDPA measured slower)" if min_pairs is None else f"SDPA from {min_pairs:,} pairs"


@dataclass(frozen=True)
class PrefillSpan:
    """A prefill chunk attended with SDPA: rows `row .. row + num_tokens - 1` of the step, positions from `start`
    of their sequence, whose K/V lie in `blocks` (int64, the blocks up to the chunk's last position); built once a
    step, read by every layer."""

    row: int
    num_tokens: int
    start: int
    blocks: torch.Tensor
    mask: torch.Tensor | None  # [num_tokens, start + num_tokens] bool, True where a row sees a key (None: fresh, causal)


@dataclass(frozen=True)
class CpuAttentionMetadata:
    slot_mapping: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    # the rows the paged kernel attends (every row where `prefills` is empty: the fused decode step reads these):
    block_tables: torch.Tensor  # [R, max_blocks] int32: each row's sequence's block table
    context_lens: torch.Tensor  # [R] int32: each row's causal context (its prefix and itself)
    paged_rows: torch.Tensor | None = None  # [R] int64: which rows of the step those are (None: all, in order)
    prefills: tuple[PrefillSpan, ...] = ()


def available(dtype: torch.dtype) -> bool:
    """The C library built and `dtype` one the kernels take (float32, bfloat16; the KV cache has the model's)."""
    return cpu_ops.available(dtype) and cpu_paged_attention.available()


class CpuBackend:
    name = "cpu"

    def __init__(self, rope: RotaryEmbedding, sdpa_min_pairs: int | None = SDPA_MIN_PAIRS) -> None:
        self.rope = rope
        self.sdpa_min_pairs = sdpa_min_pairs  # None: every prefill chunk on the paged kernel

    def prepare(self, batch: StepBatch) -> CpuAttentionMetadata:
        spans, bs = batch.spans, batch.block_size
        prefills, paged, rows, row = [], [], [], 0
        if len(spans) != len(batch.positions):  # else a decode step (a row per sequence): nothing for SDPA to take
            for s in spans:
                if takes_sdpa(s, self.sdpa_min_pairs):
                    prefills.append(PrefillSpan(row, s.num_tokens, s.start,
                                                torch.tensor(s.block_table[: -(-s.end // bs)], dtype=torch.long),
                                                causal_mask(s.start, s.num_tokens) if s.start else None))
                else:
                    paged.append(s)
                    rows.extend(range(row, row + s.num_tokens))
                row += s.num_tokens
        if not prefills:
            paged = spans
        positions = batch.positions if not prefills else batch.positions[rows]
        tables = pad_tables([s.block_table for s in paged]) if paged else np.zeros((0, 1), dtype=np.int32)
        if len(paged) != len(positions):  # prefill chunks: their sequence's table on each of their rows
            tables = np.repeat(tables, [s.num_tokens for s in paged], axis=0)
        return CpuAttentionMetadata(
            slot_mapping=torch.from_numpy(batch.slot_mapping),
            positions=torch.from_numpy(batch.positions),
            block_tables=torch.from_numpy(tables),
            context_lens=torch.from_numpy(np.add(positions, 1, dtype=np.int32)),
            paged_rows=torch.tensor(rows, dtype=torch.long) if prefills else None,
            prefills=tuple(prefills),
        )

    def stage(self, batch: StepBatch, pack) -> CpuAttentionMetadata:
        return self.prepare(batch)  # host arrays, read in place by the C kernels: nothing to stage

    def metadata(self, staged: CpuAttentionMetadata) -> CpuAttentionMetadata:
        return staged

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: KVCache,
                  meta: CpuAttentionMetadata, scale: float, qk_norm: QKNorm | None = None) -> torch.Tensor:
        q, k = normed_qk(self, q, k, qk_norm)
        k_cache, v_cache = kv_cache
        cpu_ops.rope_and_cache(q, k, v, meta.positions, self.rope.cos, self.rope.sin, k_cache, v_cache,
                               meta.slot_mapping)  # q and k rotated in place
        if not meta.prefills:
            return cpu_paged_attention.paged_decode(q, k_cache, v_cache, meta.block_tables, meta.context_lens, scale)
        out = torch.empty(q.shape, dtype=q.dtype)
        if meta.paged_rows.numel():
            out.index_copy_(0, meta.paged_rows, cpu_paged_attention.paged_decode(
                q.index_select(0, meta.paged_rows), k_cache, v_cache, meta.block_tables, meta.context_lens, scale))
        for p in meta.prefills:
            end = p.row + p.num_tokens
            out[p.row : end] = prefill_attention(q[p.row : end], k_cache, v_cache, p.start, p.blocks, scale, p.mask)
        return out

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
        if x.dim() != 2 or not x.is_contiguous():  # the per-head q/k norms of Qwen3: [T, heads, D] views
            return torch_backend.rms_norm(x, weight, eps, residual)
        if residual is None:
            return cpu_ops.add_rms_norm(None, x, weight, eps)
        return cpu_ops.add_rms_norm(x, residual, weight, eps), residual  # residual updated in place

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        return cpu_ops.silu_and_mul(gate_up)


def causal_mask(start: int, n: int) -> torch.Tensor:
    """[n, start + n] bool: row i (position start + i) sees keys 0 .. start + i."""
    return torch.ones(n, start + n, dtype=torch.bool).tril(diagonal=start)


def prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, start: int,
                      blocks: torch.Tensor, scale: float, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of a prefill chunk's queries `q` [n, H, D] (positions start .. start + n - 1) over its sequence's
    keys and values up to its last position, read from `blocks` of the cache, causal (`mask`: `causal_mask`'s,
    made here where not given): [n, H, D]."""
    n, _, d = q.shape
    length = start + n
    _, bs, kvh, _ = k_cache.shape
    k = k_cache.index_select(0, blocks).view(1, -1, kvh, d)[:, :length].transpose(1, 2)  # [1, KVH, L, D]
    v = v_cache.index_select(0, blocks).view(1, -1, kvh, d)[:, :length].transpose(1, 2)
    qh = q.to(k.dtype).unsqueeze(0).transpose(1, 2)  # [1, H, n, D]: the 4-D form takes the flash kernel
    if start == 0:
        o = F.scaled_dot_product_attention(qh, k, v, is_causal=True, scale=scale, enable_gqa=True)
    else:
        mask = causal_mask(start, n) if mask is None else mask
        o = F.scaled_dot_product_attention(qh, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
    return o[0].transpose(0, 1).to(q.dtype)
