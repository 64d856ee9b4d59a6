"""The `torch` executor: owns the model and the paged KV cache, turns a scheduled step into logits."""

from __future__ import annotations

import logging

import numpy as np
import torch

from hetero_infer.worker import cpu_paged_attention
from hetero_infer.worker.attention import AttentionMetadata, PrefillChunk
from hetero_infer.worker.config import EngineConfig
from hetero_infer.worker.model_loader import iter_safetensors
from hetero_infer.worker.models.llama import LlamaForCausalLM, head_dim_of
from hetero_infer.worker.scheduler import SchedulerOutput

log = logging.getLogger(__name__)

CPU_KV_CACHE_BYTES = 1 << 30  # default KV pool on CPU when --max-num-blocks is not given


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available")
    return dev


def resolve_dtype(dtype: str, hf_config, device: torch.device) -> torch.dtype:
    if dtype != "auto":
        return getattr(torch, dtype)
    if device.type == "cpu":
        return torch.float32
    config_dtype = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
    if isinstance(config_dtype, str):
        config_dtype = getattr(torch, config_dtype, None)
    return config_dtype if config_dtype in (torch.float16, torch.bfloat16) else torch.bfloat16


class TorchExecutor:
    samples_itself = False

    def __init__(self, config: EngineConfig, hf_config, folder, max_model_len: int) -> None:
        self.config = config
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, hf_config, self.device)
        self.block_size = config.block_size
        self.vocab_size = hf_config.vocab_size
        torch.manual_seed(config.seed)
        with torch.device(self.device):
            model = LlamaForCausalLM(hf_config, max_positions=max_model_len)
        model.load_weights(iter_safetensors(folder))
        self.model = model.to(self.dtype).eval()
        self.model.init_rope(self.dtype, self.device)
        self.num_layers = hf_config.num_hidden_layers
        self.num_kv_heads = hf_config.num_key_value_heads
        self.head_dim = head_dim_of(hf_config)
        self.num_blocks = config.max_num_blocks or self._default_num_blocks()
        self.kv_cache = torch.zeros(
            self.num_layers, 2, self.num_blocks, self.block_size, self.num_kv_heads, self.head_dim,
            dtype=self.dtype, device=self.device,
        )
        self.kv_caches = [(self.kv_cache[i, 0], self.kv_cache[i, 1]) for i in range(self.num_layers)]
        self.use_kernels = _kernels_available(self.device)
        self.model.use_kernels(self.use_kernels)
        self.cpu_decode_kernel = (
            self.device.type == "cpu" and cpu_paged_attention.supports(self.kv_cache) and cpu_paged_attention.available()
        )

    @property
    def block_bytes(self) -> int:
        elem = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim * elem

    def _default_num_blocks(self) -> int:
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            reserve = total * (1 - self.config.gpu_memory_utilization) + 2 * (1 << 30)  # activations
            budget = max(free - reserve, self.block_bytes * 16)
            return int(budget // self.block_bytes)
        return max(int(CPU_KV_CACHE_BYTES // self.block_bytes), 16)

    # -- one step -----------------------------------------------------------------------
    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput) -> torch.Tensor:
        """Run the model on the scheduled tokens; return float32 logits for sequences that sample."""
        if sched.block_copies:
            src = torch.tensor([s for s, _ in sched.block_copies], device=self.device)
            dst = torch.tensor([d for _, d in sched.block_copies], device=self.device)
            self.kv_cache[:, :, dst] = self.kv_cache[:, :, src]
        input_ids, positions, meta, logits_index = self.prepare(sched)
        hidden = self.model(input_ids, positions, meta, self.kv_caches)
        return self.model.compute_logits(hidden[logits_index]).float()

    def prepare(self, sched: SchedulerOutput):
        bs = self.block_size
        dev = self.device
        tokens: list[int] = []
        pos: list[np.ndarray] = []
        slots: list[np.ndarray] = []
        logits_index: list[int] = []
        decode_tables: list[list[int]] = []
        decode_lens: list[int] = []
        chunks: list[PrefillChunk] = []
        prefill_tables: list[list[int]] = []
        cu_q = [0]
        prefill_lens: list[int] = []
        row = 0
        for item in sched.scheduled:
            seq = item.seq
            start, n = seq.num_computed_tokens, item.num_new_tokens
            end = start + n
            table = np.asarray(seq.block_table, dtype=np.int64)
            p = np.arange(start, end, dtype=np.int64)
            tokens.extend(seq.token_ids[start:end])
            pos.append(p)
            slots.append(table[p // bs] * bs + p % bs)
            if seq.is_prefill:
                gather = None
                if start > 0 and not self.use_kernels:
                    allp = np.arange(end, dtype=np.int64)
                    gather = torch.from_numpy(table[allp // bs] * bs + allp % bs).to(dev)
                chunks.append(PrefillChunk(row, n, end, gather))
                prefill_tables.append(seq.block_table)
                cu_q.append(cu_q[-1] + n)
                prefill_lens.append(end)
            else:
                decode_tables.append(seq.block_table)
                decode_lens.append(end)
            row += n
            if item.samples:
                logits_index.append(row - 1)
        meta = AttentionMetadata(
            slot_mapping=torch.from_numpy(np.concatenate(slots)).to(dev, non_blocking=True),
            num_decode_tokens=len(decode_lens),
            prefill_chunks=tuple(chunks),
            use_kernels=self.use_kernels,
            cpu_decode_kernel=self.cpu_decode_kernel,
        )
        if decode_lens:
            table_t = _pad_tables(decode_tables).to(dev)
            lens_t = torch.tensor(decode_lens, dtype=torch.int32, device=dev)
            meta.decode_block_tables, meta.decode_context_lens = table_t, lens_t
            if not (self.use_kernels or self.cpu_decode_kernel):
                lmax = max(decode_lens)
                idx = (table_t.long()[:, :, None] * bs + torch.arange(bs, device=dev)).flatten(1)[:, :lmax]
                meta.decode_gather_index = idx
                meta.decode_mask = (torch.arange(lmax, device=dev)[None, :] < lens_t[:, None])[:, None, None, :]
        if chunks and self.use_kernels:
            meta.prefill_block_tables = _pad_tables(prefill_tables).to(dev)
            meta.prefill_cu_seqlens_q = torch.tensor(cu_q, dtype=torch.int32, device=dev)
            meta.prefill_context_lens = torch.tensor(prefill_lens, dtype=torch.int32, device=dev)
        input_ids = torch.tensor(tokens, dtype=torch.long).to(dev, non_blocking=True)
        positions = torch.from_numpy(np.concatenate(pos)).to(dev, non_blocking=True)
        return input_ids, positions, meta, torch.tensor(logits_index, dtype=torch.long, device=dev)


def _pad_tables(tables: list[list[int]]) -> torch.Tensor:
    width = max(len(t) for t in tables)
    out = np.zeros((len(tables), width), dtype=np.int32)
    for i, t in enumerate(tables):
        out[i, : len(t)] = t
    return torch.from_numpy(out)


def _kernels_available(device: torch.device) -> bool:
    """Triton kernels on CUDA (or anywhere when HETERO_INFER_KERNELS=triton, e.g. interpret mode)."""
    try:
        from hetero_infer import kernels
    except Exception as exc:  # a broken install: fall back to the reference path
        log.warning("kernels unavailable, using the PyTorch reference path: %s", exc)
        return False
    if kernels.get_backend() == "triton":
        return True
    return device.type == "cuda" and kernels.get_backend() == "auto" and kernels.triton_available()
