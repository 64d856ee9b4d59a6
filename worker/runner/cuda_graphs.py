"""Decode steps on CUDA replayed from CUDA graphs, one per batch-size bucket (and one more per bucket for steps with
LoRA adapters)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np
import torch

from hetero_infer.worker.runner.attention.triton_backend import TritonAttentionMetadata, TritonBackend
from hetero_infer.worker.runner.inputs import StepInputs, placeholder_rows
from hetero_infer.worker.runner.staging import ALIGN, Uploader

log = logging.getLogger(__name__)

# input ids, positions, slots; PLACEHOLDER rows, their rows in the previous step's tokens, room for those tokens;
# block copy sources, destinations
_I64_ROWS = 8


def decode_buckets(max_batch: int) -> list[int]:
    """Batch sizes with a CUDA graph (a step replays the smallest that holds its rows): powers of two up to 32,
    then every 16 up to 256, then steps of an eighth of the power of two below (32 up to 512, 64 up to 1024...),
    and `max_batch` itself.

    Padding rows cost what the decode's GEMMs cost per row: nothing while they are bound by the weights' bytes
    (a 0.6B model's up to ~128 rows on an H100), about proportionally once they near compute balance (~256
    rows). So the steps are coarse where rows are free and at most 1/8 of the batch beyond (129 rows replay
    144, not 256: 11.6% padding instead of 98%), which keeps the graphs few: 20 for 256 sequences, 28 for 512,
    and the powers of two alone for the small batches of the tests (capture time)."""
    buckets, b = [], 1
    while b < max_batch:
        buckets.append(b)
        b = b * 2 if b < 32 else b + max(16, (1 << (b.bit_length() - 1)) // 8)
    return [*buckets, max_batch]


class DecodeRunner:
    """Decode-only steps on CUDA, padded to a batch-size bucket in static input buffers.

    Each bucket's forward is captured once as a CUDA graph and replayed. With `use_graphs=False`
    (enforce_eager) the same padded forward runs eagerly: both modes launch the same kernels on
    the same shapes, so they give identical numbers. Padding rows have slot -1 (the KV write
    skips them) and context length 0 (attention returns zeros for them).

    With LoRA (`attach_lora`) each bucket has a second graph, captured with the adapters' hooks active on every
    projection they may update (`LoRAModel.graph_step`): a step with adapters replays it, whatever its mix (the
    kernels read each token's slot from the LoRA model's static buffer, padding rows -1); a step of the base model
    alone replays the base graph, which has no LoRA work.
    """

    def __init__(self, model, backend: TritonBackend, kv_caches, max_batch: int, max_blocks_per_seq: int,
                 device: torch.device, use_graphs: bool) -> None:
        self.model, self.backend, self.kv_caches = model, backend, kv_caches
        self.buckets = decode_buckets(max_batch)
        n = self.buckets[-1]
        width = max_blocks_per_seq
        # The static inputs: views of one device buffer that `run_step` fills with one copy from pinned host
        # staging (`Uploader`: two host buffers, alternating). int64 rows: input ids, positions, slots, then the
        # PLACEHOLDER rows with each one's row in the previous step's tokens (and room for those tokens), then
        # block copies (source, destination); int32: context lengths, then the block tables at a fixed width (max_model_len:
        # the decode kernel plans its splits from the bucket and partitions each context on the device, so every
        # replay fits whatever its lengths), last, so a step copies only its bucket's.
        self._off32 = _I64_ROWS * n * 8
        self._off_tables = self._off32 + -(-4 * n // ALIGN) * ALIGN
        nbytes = self._off_tables + n * width * 4
        self.uploader = Uploader(device, nbytes)
        buf = self.uploader.device_buffer
        rows64 = buf[: self._off32].view(torch.long).view(_I64_ROWS, n)
        self.input_ids, self.positions, self.slot_mapping = rows64[0], rows64[1], rows64[2]
        self._patch, self._copies = rows64[3:6], rows64[6:8]
        self.context_lens = buf[self._off32 : self._off32 + 4 * n].view(torch.int32)
        self.block_tables = buf[self._off_tables :].view(torch.int32).view(n, width)
        self.slot_mapping.fill_(-1)
        self._host_views = [(host[: self._off32].view(np.int64).reshape(_I64_ROWS, n),
                             host[self._off32 : self._off32 + 4 * n].view(np.int32),
                             host[self._off_tables :].view(np.int32).reshape(n, width))
                            for host in self.uploader.host_arrays]
        self.use_graphs = use_graphs
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.lora = None  # the LoRA model (worker/runner/lora/model.py) once attached
        self.lora_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.lora_outputs: dict[int, torch.Tensor] = {}
        self._pool = None  # the graphs' memory pool, shared by all of them
        self.num_steps = 0
        self.lora_steps = 0  # of num_steps, those with adapters
        if use_graphs:
            self.capture()

    def attach_lora(self, lora) -> None:
        """Run decode steps with LoRA adapters here too: the LoRA model keeps its token -> slot map in its static
        buffer, -1 up to the largest bucket, and each bucket's LoRA graph is captured (with `use_graphs`)."""
        lora.static_slots(self.buckets[-1])
        self.lora = lora
        if self.use_graphs:
            self.capture(lora=True)

    def takes(self, step: StepInputs, lora: bool) -> bool:
        """Whether this runner runs the step: decodes only that fit (`accepts_step`), and a step with adapters only
        once the LoRA model is attached."""
        return (not lora or self.lora is not None) and self.accepts_step(step)

    def accepts(self, meta: TritonAttentionMetadata) -> bool:
        return (meta.prefill_block_tables is None and 0 < meta.num_decode_tokens <= self.buckets[-1]
                and meta.decode_block_tables.shape[1] <= self.block_tables.shape[1])

    def accepts_step(self, step: StepInputs) -> bool:
        """Whether a step's rows are all decodes that fit the largest bucket and the tables' width (and its block
        copies the copy rows)."""
        spans = step.batch.spans
        width = self.block_tables.shape[1]
        return (0 < len(spans) <= self.buckets[-1] and not spans[-1].is_prefill  # decodes come first
                and max(len(s.block_table) for s in spans) <= width and len(step.block_copies) <= self.buckets[-1])

    def run_step(self, step: StepInputs, prev_tokens: torch.Tensor | None, prev_rows: dict[int, int],
                 copy_blocks: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
                 lora: bool = False) -> torch.Tensor:
        """`run` from the step's host arrays: written into pinned staging, one copy (no tensor allocated per
        step); the step's block copies made by `copy_blocks(src, dst)`; PLACEHOLDER inputs taken from
        `prev_tokens`, the previous step's sampled tokens on the device (`prev_rows`: each sequence's row in
        them). `lora`: the step has adapters (the LoRA model's `begin_step` has written its slot map)."""
        n = len(step.token_ids)
        bs = next(b for b in self.buckets if b >= n)
        i, _ = self.uploader.host()
        a64, lens, tables = self._host_views[i]
        a64[0, :n] = step.token_ids
        a64[1, :n] = step.batch.positions
        a64[2, :n] = step.batch.slot_mapping
        a64[:2, n:bs] = 0  # padding rows: token 0 at position 0 (the staging may hold an older step's PLACEHOLDERs)
        a64[2, n:bs] = -1  # padding rows: not written
        lens[n:bs] = 0  # padding rows: no context (attention gives zeros)
        for r, span in enumerate(step.batch.spans):
            lens[r] = span.end
            tables[r, : len(span.block_table)] = span.block_table
        k = len(step.placeholders)
        if k:
            a64[3, :k], a64[4, :k] = placeholder_rows(step, prev_tokens, prev_rows)
        c = len(step.block_copies)
        if c:
            a64[6:8, :c] = np.asarray(step.block_copies, dtype=np.int64).T
        self.uploader.upload(i, self._off_tables + 4 * bs * tables.shape[1])  # the tables' rows up to the bucket
        if c:
            copy_blocks(self._copies[0, :c], self._copies[1, :c])
        if k:
            tokens = torch.index_select(prev_tokens, 0, self._patch[1, :k], out=self._patch[2, :k])
            self.input_ids.index_copy_(0, self._patch[0, :k], tokens)
        return self._replay(bs, lora)

    def _replay(self, bs: int, lora: bool = False) -> torch.Tensor:
        """The bucket's forward over the static inputs: its graph (the LoRA one for a step with adapters), or
        eagerly without one."""
        self.num_steps += 1
        self.lora_steps += lora
        graph = (self.lora_graphs if lora else self.graphs).get(bs)
        if graph is None:
            return self._forward(bs, lora)
        graph.replay()
        return (self.lora_outputs if lora else self.outputs)[bs]

    def _forward(self, bs: int, lora: bool = False) -> torch.Tensor:
        meta = TritonAttentionMetadata(
            slot_mapping=self.slot_mapping[:bs], positions=self.positions[:bs], num_decode_tokens=bs,
            decode_block_tables=self.block_tables[:bs], decode_context_lens=self.context_lens[:bs],
        )
        if not lora:
            return self.model(self.input_ids[:bs], self.backend, meta, self.kv_caches)
        with self.lora.graph_step(bs):
            return self.model(self.input_ids[:bs], self.backend, meta, self.kv_caches)

    @torch.inference_mode()
    def capture(self, lora: bool = False) -> None:
        """Each bucket's graph: the base model's, or (`lora`) the one with the LoRA hooks' kernels."""
        graphs, outputs = (self.lora_graphs, self.lora_outputs) if lora else (self.graphs, self.outputs)
        start = time.perf_counter()
        before = torch.cuda.memory_reserved()
        for bs in reversed(self.buckets):  # largest first: the smaller graphs reuse its memory pool
            self._forward(bs, lora)  # warm-up outside the capture: Triton compiles, cuBLAS picks its kernels
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                outputs[bs] = self._forward(bs, lora)
            self._pool = graph.pool()
            graphs[bs] = graph
        log.info("captured %sCUDA graphs for decode batch sizes %s in %.1f s (%.0f MiB)", "LoRA " if lora else "",
                 self.buckets, time.perf_counter() - start, (torch.cuda.memory_reserved() - before) / 2**20)

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

