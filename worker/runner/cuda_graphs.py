"""Decode steps on CUDA replayed from CUDA graphs, one per batch-size bucket."""

from __future__ import annotations

import logging
import time

import torch

from hetero_infer.worker.runner.attention.triton_backend import TritonAttentionMetadata, TritonBackend
from hetero_infer.worker.runner.inputs import StepInputs, placeholder_rows

log = logging.getLogger(__name__)


def decode_buckets(max_batch: int) -> list[int]:
    """Batch sizes with a CUDA graph: powers of two up to `max_batch`, and `max_batch` itself."""
    buckets = [1 << i for i in range(max_batch.bit_length()) if 1 << i < max_batch]
    return [*buckets, max_batch]


class DecodeRunner:
    """Decode-only steps on CUDA, padded to a batch-size bucket in static input buffers.

    Each bucket's forward is captured once as a CUDA graph and replayed. With `use_graphs=False`
    (enforce_eager) the same padded forward runs eagerly: both modes launch the same kernels on
    the same shapes, so they give identical numbers. Padding rows have slot -1 (the KV write
    skips them) and context length 0 (attention returns zeros for them).
    """

    def __init__(self, model, backend: TritonBackend, kv_caches, max_batch: int, max_blocks_per_seq: int,
                 device: torch.device, use_graphs: bool) -> None:
        self.model, self.backend, self.kv_caches = model, backend, kv_caches
        self.buckets = decode_buckets(max_batch)
        n = self.buckets[-1]
        width = max_blocks_per_seq
        # The static inputs, as views of two packed buffers that `run_step` fills with one copy each from pinned
        # host staging: input ids, positions and slots (int64); context lengths and block tables (int32, the
        # tables at a fixed width: the decode kernel plans its KV split from the table's shape, so every replay
        # fits).
        self._inputs64 = torch.zeros(3, n, dtype=torch.long, device=device)
        self.input_ids, self.positions, self.slot_mapping = self._inputs64.unbind(0)
        self.slot_mapping.fill_(-1)
        self._inputs32 = torch.zeros(n * (1 + width), dtype=torch.int32, device=device)
        self.context_lens = self._inputs32[:n]
        self.block_tables = self._inputs32[n:].view(n, width)
        pin = device.type == "cuda"
        # Two sets, alternating: the host fills step N+1's while step N's copy may not have run yet (the set
        # before, step N-1's, has: the host waited for that step's result before building this one).
        self._staging = [(torch.zeros(3, n, dtype=torch.long, pin_memory=pin),
                          torch.zeros(n * (1 + width), dtype=torch.int32, pin_memory=pin),
                          torch.zeros(2, n, dtype=torch.long, pin_memory=pin)) for _ in range(2)]
        self._flip = 0
        self._patch = torch.zeros(2, n, dtype=torch.long, device=device)  # PLACEHOLDER rows, their previous rows
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.num_steps = 0
        if use_graphs:
            self.capture()

    def accepts(self, meta: TritonAttentionMetadata) -> bool:
        return (meta.prefill_block_tables is None and 0 < meta.num_decode_tokens <= self.buckets[-1]
                and meta.decode_block_tables.shape[1] <= self.block_tables.shape[1])

    def accepts_step(self, step: StepInputs) -> bool:
        """Whether a step's rows are all decodes that fit the largest bucket and the tables' width."""
        spans = step.batch.spans
        width = self.block_tables.shape[1]
        return (0 < len(spans) <= self.buckets[-1] and not spans[-1].is_prefill  # decodes come first
                and max(len(s.block_table) for s in spans) <= width)

    def run_step(self, step: StepInputs, prev_tokens: torch.Tensor | None,
                 prev_rows: dict[int, int]) -> torch.Tensor:
        """`run` from the step's host arrays: written into pinned staging, one copy per packed buffer (no tensor
        allocated per step); PLACEHOLDER inputs taken from `prev_tokens`, the previous step's sampled tokens on
        the device (`prev_rows`: each sequence's row in them)."""
        n = len(step.token_ids)
        bs = next(b for b in self.buckets if b >= n)
        n_max = self.buckets[-1]
        s64, s32, patch = self._staging[self._flip]
        self._flip ^= 1
        a64, a32 = s64.numpy(), s32.numpy()
        a64[0, :n] = step.token_ids
        a64[1, :n] = step.batch.positions
        a64[2, :n] = step.batch.slot_mapping
        a64[:2, n:bs] = 0  # padding rows: token 0 at position 0 (the staging may hold an older step's PLACEHOLDERs)
        a64[2, n:bs] = -1  # padding rows: not written
        a32[n:bs] = 0  # padding rows: no context (attention gives zeros)
        tables = a32[n_max:].reshape(n_max, -1)
        for i, span in enumerate(step.batch.spans):
            a32[i] = span.end
            tables[i, : len(span.block_table)] = span.block_table
        self._inputs64.copy_(s64, non_blocking=True)
        self._inputs32.copy_(s32, non_blocking=True)
        if step.placeholders:
            rows, prev = placeholder_rows(step, prev_tokens, prev_rows)
            k = len(rows)
            a = patch.numpy()
            a[0, :k] = rows
            a[1, :k] = prev
            self._patch.copy_(patch, non_blocking=True)
            self.input_ids.index_copy_(0, self._patch[0, :k], prev_tokens.index_select(0, self._patch[1, :k]))
        return self._replay(bs)

    def _replay(self, bs: int) -> torch.Tensor:
        """The bucket's forward over the static inputs: its graph, or eagerly without one."""
        self.num_steps += 1
        graph = self.graphs.get(bs)
        if graph is None:
            return self._forward(bs)
        graph.replay()
        return self.outputs[bs]

    def _forward(self, bs: int) -> torch.Tensor:
        meta = TritonAttentionMetadata(
            slot_mapping=self.slot_mapping[:bs], positions=self.positions[:bs], num_decode_tokens=bs,
            decode_block_tables=self.block_tables[:bs], decode_context_lens=self.context_lens[:bs],
        )
        return self.model(self.input_ids[:bs], self.backend, meta, self.kv_caches)

    @torch.inference_mode()
    def capture(self) -> None:
        start, pool = time.perf_counter(), None
        before = torch.cuda.memory_reserved()
        for bs in reversed(self.buckets):  # largest first: the smaller graphs reuse its memory pool
            self._forward(bs)  # warm-up outside the capture: Triton compiles, cuBLAS picks its kernels
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[bs] = self._forward(bs)
            pool = graph.pool()
            self.graphs[bs] = graph
        log.info("captured CUDA graphs for decode batch sizes %s in %.1f s (%.0f MiB)", self.buckets,
                 time.perf_counter() - start, (torch.cuda.memory_reserved() - before) / 2**20)

    def run(self, input_ids: torch.Tensor, meta: TritonAttentionMetadata) -> torch.Tensor:
        """Hidden states [bucket, hidden]; rows past the real batch are padding."""
        n = input_ids.shape[0]
        bs = next(b for b in self.buckets if b >= n)
        self.input_ids[:n].copy_(input_ids)
        self.positions[:n].copy_(meta.positions)
        self.slot_mapping[:n].copy_(meta.slot_mapping)
        self.slot_mapping[n:bs].fill_(-1)
        self.block_tables[:n, : meta.decode_block_tables.shape[1]].copy_(meta.decode_block_tables)
        self.context_lens[:n].copy_(meta.decode_context_lens)
        self.context_lens[n:bs].zero_()
        return self._replay(bs)
