"""Decode steps on CUDA replayed from CUDA graphs, one per batch-size bucket."""

from __future__ import annotations

import logging
import time

import torch

from hetero_infer.worker.runner.attention.triton_backend import TritonAttentionMetadata, TritonBackend

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
        self.input_ids = torch.zeros(n, dtype=torch.long, device=device)
        self.positions = torch.zeros(n, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((n,), -1, dtype=torch.long, device=device)
        # fixed width: the decode kernel plans its KV split from the table's shape, so every replay fits
        self.block_tables = torch.zeros(n, max_blocks_per_seq, dtype=torch.int32, device=device)
        self.context_lens = torch.zeros(n, dtype=torch.int32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.num_steps = 0
        if use_graphs:
            self.capture()

    def accepts(self, meta: TritonAttentionMetadata) -> bool:
        return (meta.prefill_block_tables is None and 0 < meta.num_decode_tokens <= self.buckets[-1]
                and meta.decode_block_tables.shape[1] <= self.block_tables.shape[1])

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
        self.num_steps += 1
        graph = self.graphs.get(bs)
        if graph is None:
            return self._forward(bs)
        graph.replay()
        return self.outputs[bs]
