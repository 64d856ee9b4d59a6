"""The `torch` executor: owns the model and the paged KV cache, turns a scheduled step into logits."""

from __future__ import annotations

import logging
import time

import torch

from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.contracts.lora import LoRAAdapterError, LoRARequest
from hetero_infer.contracts.step import SamplingRow, StepPlan, apply_block_table_updates
from hetero_infer.kernels.cpu import decode_step as cpu_decode_step
from hetero_infer.kernels.cpu import linear as cpu_linear
from hetero_infer.kernels.cpu import native as cpu_native
from hetero_infer.kernels.cpu import select
from hetero_infer.kernels.cpu import threads as cpu_threads
from hetero_infer.worker.quant.quantize import quantize_model, weight_bytes
from hetero_infer.worker.runner import prompt_logprobs
from hetero_infer.worker.runner.attention import StepBatch, cpu_backend, select_backend
from hetero_infer.worker.runner.attention.triton_backend import TritonBackend
from hetero_infer.worker.runner.cuda_graphs import DecodeRunner
from hetero_infer.worker.runner.host_kv import HostKV, host_tier_blocks
from hetero_infer.worker.runner.inputs import StepInputs, placeholder_rows, step_inputs
from hetero_infer.worker.runner.loader import load_model
from hetero_infer.worker.runner.models.rotary import head_dim_of
from hetero_infer.worker.runner.parallel import group as tp_group
from hetero_infer.worker.runner.prompt_logprobs import PromptLogprobsCopy
from hetero_infer.worker.runner.sampler import Sampler, SeededGenerators, pending_tokens, sample_logits
from hetero_infer.worker.runner.staging import StagingArea
from hetero_infer.worker.runner.step_handle import DeviceStep, DoneStep

log = logging.getLogger(__name__)

CPU_KV_CACHE_BYTES = 1 << 30  # default KV pool on CPU when --max-num-blocks is not given


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available")
    return dev


def device_description(device: str) -> tuple[str, int, str]:
    """(type, total memory in bytes, name) of the device `device` resolves to (memory and name: CUDA only)."""
    dev = resolve_device(device)
    if dev.type != "cuda":
        return dev.type, 0, ""
    props = torch.cuda.get_device_properties(dev)
    return dev.type, props.total_memory, props.name


def resolve_dtype(dtype: str, hf_config, device: torch.device, quantization: str | None = None) -> torch.dtype:
    """"auto": float32 on the CPU (exact against float32 references), but bfloat16 for weight-only quantized
    models where the CPU has their bfloat16 GEMM (W8A16/W4A16 take 16-bit activations; in float32 they would
    run through the kernels' slow reference); the checkpoint's 16-bit dtype (else bfloat16) on GPUs."""
    if dtype != "auto":
        return getattr(torch, dtype)
    if device.type == "cpu":
        return torch.bfloat16 if quantization and cpu_linear.quantized_gemm_available() else torch.float32
    config_dtype = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
    if isinstance(config_dtype, str):
        config_dtype = getattr(torch, config_dtype, None)
    return config_dtype if config_dtype in (torch.float16, torch.bfloat16) else torch.bfloat16


class TorchExecutor:
    """`execute_async` runs a step and samples it. On CUDA it only launches the work: the sampled tokens stay on
    the device, where the next step reads its PLACEHOLDER inputs from them, and are copied behind the step into
    a pinned host buffer that `result()` reads after the step's event; on the CPU it runs to the end (the
    overlap has nothing to hide there: the host is the device)."""

    samples_itself = False

    def __init__(self, config: EngineConfig, hf_config, folder, max_model_len: int,
                 tp: tp_group.TensorParallel = tp_group.SINGLE) -> None:
        self.config = config
        self.tp = tp  # this rank of a tensor-parallel model (worker/runner/parallel); SINGLE: the whole model
        self.device = resolve_device(config.device)
        if self.device.type == "cuda" and self.device.index is not None:
            torch.cuda.set_device(self.device)  # one worker, one GPU: graphs and memory stats use the current one
        if self.device.type == "cpu":
            cpu_threads.configure_torch_threads()  # a container's CPU quota, not the node's CPU count
        self.dtype = resolve_dtype(config.dtype, hf_config, self.device, config.quantization)
        self.block_size = config.block_size
        self.vocab_size = hf_config.vocab_size
        # the overlap reads the previous step's sampled tokens on the device: only one rank samples
        self.overlaps = self.device.type == "cuda" and tp.world_size == 1
        self.sampler = Sampler(all_logprobs=False)  # logprobs only for requests that ask
        self.generators = SeededGenerators(self.device)  # seeded sequences' generators, by seq_id
        # the previous step's sampled tokens on the device and each sequence's row in them (PLACEHOLDER inputs)
        self._prev_tokens: torch.Tensor | None = None
        self._prev_rows: dict[int, int] = {}
        self.block_tables: dict[int, list[int]] = {}  # seq_id -> its block table (the steps' updates applied)
        # the sampled tokens' host buffers (pinned on CUDA): two, alternating, since step N+1's copy may land
        # before the host has read step N's; a step with logprobs packs them with its tokens into a float64 pair
        # (`StepSample.pack`), made on the first such step and grown when a step needs more
        pin = self.device.type == "cuda"
        self._host_tokens = [torch.empty(config.max_num_seqs, dtype=torch.long, pin_memory=pin) for _ in range(2)]
        self._host_packed = [torch.empty(0, dtype=torch.float64) for _ in range(2)]
        self._flip = 0
        self.staging = StagingArea(self.device)  # an eager step's integer inputs: one copy (none on the CPU)
        # a sampled step's host inputs (indices, parameters, penalty and bias keys): one more copy (none on the CPU)
        self.sample_staging = StagingArea(self.device)
        torch.manual_seed(config.seed)
        started = time.perf_counter()
        with tp_group.building(tp):
            model = load_model(hf_config, folder, load_format=config.load_format, device=self.device,
                               dtype=self.dtype, max_positions=max_model_len, seed=config.seed)
        self.model = model.eval()
        tp.rendezvous("loaded")  # every rank loaded: the collectives from here on wait for no slow load
        self.backend = select_backend(self.device, self.dtype, model.rotary_embedding(self.dtype, self.device))
        log.info("attention backend: %s", self.backend.name)
        self.weight_bytes = weight_bytes(self.model)
        if config.quantization:
            report = quantize_model(self.model, config.quantization)
            self.weight_bytes = report.bytes_after
            log.info("weights quantized to %s: %d layers, %.1f MiB -> %.1f MiB", report.method, report.num_quantized,
                     report.bytes_before / 2**20, report.bytes_after / 2**20)
        else:
            log.info("weights: %.1f MiB (%s), loaded in %.1f s", self.weight_bytes / 2**20,
                     str(self.dtype).removeprefix("torch."), time.perf_counter() - started)
        self.cpu_paths: dict[str, str] = {}  # layer type -> the kernel measured fastest per row bucket
        if self.device.type == "cpu" and self.dtype in (torch.float32, torch.bfloat16) and cpu_linear.available():
            selector = cpu_linear.LinearSelector() if cpu_linear.enabled() else None
            started = time.perf_counter()
            packed = self.model.pack_for_cpu(selector)
            log.info("packed %d linear layers for the CPU GEMMs in %.1f s (kernel choices %s)", packed,
                     time.perf_counter() - started, "measured or cached" if selector else "built in")
            self.cpu_paths = cpu_linear.paths_by_layer(self.model)
            log.info("CPU linear kernels (%s): %s", "measured" if selector else "defaults",
                     "; ".join(f"{k} {v}" for k, v in self.cpu_paths.items()))
        # PyTorch's bfloat16 matmul is what the linears fall back to; the project's bfloat16 GEMM (AVX512_BF16 or
        # AVX2 + FMA) does not depend on it
        if self.device.type == "cpu" and self.dtype == torch.bfloat16 and not cpu_linear.own_bfloat16_gemm():
            warning = cpu_linear.bfloat16_warning(cpu_linear.bfloat16_slowdown())
            if warning:
                log.warning(warning)
        self.thread_governor: cpu_threads.ThreadGovernor | None = None
        if self.device.type == "cpu":
            self.cpu_paths["attention"] = _cpu_attention_path(self.backend)
            if self.backend.name == "cpu" and cpu_linear.enabled():  # where prefill chunks take SDPA: measured
                self.backend.sdpa_min_pairs = cpu_backend.measure_sdpa_min_pairs(
                    self.dtype, self.model.layers[0].self_attn.num_heads, self.model.num_kv_heads, head_dim_of(hf_config),
                    config.block_size, cache=select.machine_cache(cpu_linear.MEASURE_THREADS),
                    threads=cpu_linear.MEASURE_THREADS)
                self.cpu_paths["prefill_attention"] = cpu_backend.sdpa_label(self.backend.sdpa_min_pairs)
            most = cpu_threads.base_threads()  # an earlier engine's governor may have left fewer
            if most != torch.get_num_threads():
                torch.set_num_threads(most)
            if cpu_threads.adapt_enabled() and most > 1 and tp.world_size == 1:  # ranks run in lockstep
                self.thread_governor = cpu_threads.ThreadGovernor(most)
        self.num_layers = hf_config.num_hidden_layers
        self.num_kv_heads = self.model.num_kv_heads  # this rank's (tensor parallel)
        self.head_dim = head_dim_of(hf_config)
        self.max_model_len = max_model_len
        self.num_blocks = tp.min_int(config.max_num_blocks or self._default_num_blocks(), self.device)
        self.kv_cache = self._new_kv_cache(self.num_blocks)
        self.kv_caches = _layer_caches(self.kv_cache)
        self.num_host_blocks = host_tier_blocks(config.kv_offloading_size, self.block_bytes)
        self.host_kv = HostKV(self.kv_cache, self.num_host_blocks) if self.num_host_blocks else None
        # the tier's copies run on their own CUDA streams: the scheduler computes a restored request a step later
        self.tier_copies_async = self.host_kv is not None and self.host_kv.cuda is not None
        self.cpu_decode: cpu_decode_step.FusedDecodeStack | None = None  # a decode step's layers in one C call
        if self.device.type == "cpu" and self.cpu_paths and tp.world_size == 1:  # its layers end in no all-reduce
            started = time.perf_counter()
            self.cpu_decode = cpu_decode_step.FusedDecodeStack.build(self.model, self.backend, self.kv_caches,
                                                                     self.dtype)
            if self.cpu_decode:  # its measurement may have moved a bucket's linears onto the fused step's GEMM
                self.cpu_paths.update(cpu_linear.paths_by_layer(self.model))
            self.cpu_paths["decode_step"] = self.cpu_decode.label if self.cpu_decode else "per op"
            log.info("CPU decode step: %s (chosen in %.1f s)", self.cpu_paths["decode_step"], time.perf_counter() - started)
        self.decode_runner: DecodeRunner | None = None
        if self.device.type == "cuda" and isinstance(self.backend, TritonBackend):
            max_batch = min(config.max_num_seqs, config.max_num_batched_tokens)
            width = -(-max_model_len // self.block_size)
            self.decode_runner = DecodeRunner(self.model, self.backend, self.kv_caches, max_batch, width,
                                              self.device, use_graphs=not config.enforce_eager)
        self.lora = self._lora_model(hf_config)  # after the base graphs: captured without the LoRA hooks' work
        if self.lora is not None and self.decode_runner is not None:  # and the LoRA graphs with it
            self.decode_runner.attach_lora(self.lora)

    # -- LoRA adapters --------------------------------------------------------------------
    def add_lora(self, request: LoRARequest) -> None:
        if self.lora is None:
            raise LoRAAdapterError(f"LoRA adapter {request.lora_name!r}: {self._no_lora}")
        self.lora.add(request)

    def remove_lora(self, name: str) -> bool:
        return self.lora is not None and self.lora.remove(name)

    def _lora_model(self, hf_config):
        """The model's LoRA slots and hooks (worker/runner/lora/model.py); None where its family takes none
        (`_no_lora` says why)."""
        from hetero_infer.worker.runner.loader import model_family
        from hetero_infer.worker.runner.lora.model import LoRAModel

        family = model_family(hf_config)
        self._no_lora = "LoRA is not enabled (enable_lora=True)"
        if not self.config.enable_lora:
            return None
        if not family.supports.lora:
            self._no_lora = f"{family.name} models take no LoRA adapters here"
            return None
        return LoRAModel(self.model, moe=family.supports.moe, max_loras=self.config.max_loras,
                         max_rank=self.config.max_lora_rank, dtype=self.dtype, device=self.device,
                         max_tokens=self.config.max_num_batched_tokens)

    @property
    def block_bytes(self) -> int:
        """Bytes of one KV block over every rank (each holds its KV heads' part of it)."""
        return self.rank_block_bytes * self.tp.world_size

    @property
    def rank_block_bytes(self) -> int:
        elem = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.block_size * self.num_kv_heads * self.head_dim * elem

    def _new_kv_cache(self, num_blocks: int) -> torch.Tensor:
        shape = (self.num_layers, 2, num_blocks, self.block_size, self.num_kv_heads, self.head_dim)
        if self.device.type == "cpu":
            return cpu_native.empty_huge_pages(shape, self.dtype)
        return torch.zeros(shape, dtype=self.dtype, device=self.device)

    def _default_num_blocks(self) -> int:
        if self.device.type == "cuda":
            return self._profile_num_blocks()
        return max(int(CPU_KV_CACHE_BYTES // self.block_bytes), 16)

    def _profile_num_blocks(self) -> int:
        """KV blocks that fit in `gpu_memory_utilization` of the device next to the weights and the measured
        activation peak of the largest step."""
        dev = self.device
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
        self.profile_run()
        torch.cuda.synchronize(dev)
        peak = torch.cuda.max_memory_allocated(dev)
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(dev)
        activations = peak - torch.cuda.memory_allocated(dev)
        # the CUDA context and other processes are invisible to torch's counters: never plan past what is free
        budget = min(total * self.config.gpu_memory_utilization - peak, free - activations)
        blocks = int(budget // self.rank_block_bytes)
        log.info("memory profile: weights %.2f GiB, activation peak %.2f GiB, KV cache %d blocks (%.2f GiB) "
                 "at gpu_memory_utilization %.2f", self.weight_bytes / 2**30, activations / 2**30, blocks,
                 blocks * self.rank_block_bytes / 2**30, self.config.gpu_memory_utilization)
        if blocks < 1:
            raise ValueError(f"no GPU memory left for the KV cache (weights and activations take {peak / 2**30:.2f} "
                             f"GiB of {total / 2**30:.2f} GiB); raise gpu_memory_utilization or lower "
                             "max_num_batched_tokens")
        return blocks

    @torch.inference_mode()
    def profile_run(self) -> None:
        """The largest step: `max_num_batched_tokens` prompt tokens (in sequences of at most max_model_len),
        logits for `max_num_seqs` rows and the sampler's working copies of them."""
        total = self.config.max_num_batched_tokens
        lens = [min(self.max_model_len, total - s) for s in range(0, total, self.max_model_len)]
        hidden = self.forward_prompts([[0] * n for n in lens])
        logits = self.model.compute_logits(hidden[-min(self.config.max_num_seqs, total):]).float()
        _ = logits.clone(), logits.log_softmax(-1)

    @torch.inference_mode()
    def forward_prompts(self, token_lists: list[list[int]]) -> torch.Tensor:
        """Hidden states [T, hidden] of all tokens of `token_lists`, run as fresh prompts in one step over a
        temporary KV cache (the engine's cache is untouched)."""
        batch = StepBatch.fresh_prompts([len(t) for t in token_lists], self.block_size)
        ids = [t for tokens in token_lists for t in tokens]
        input_ids, staged = self.staging.pack(lambda pack: (pack.put(ids), self.backend.stage(batch, pack)))
        kv = self._new_kv_cache(batch.num_blocks)
        return self.model(input_ids, self.backend, self.backend.metadata(staged), _layer_caches(kv))

    # -- one step -----------------------------------------------------------------------
    @torch.inference_mode()
    def execute(self, plan: StepPlan) -> tuple[torch.Tensor, PromptLogprobsCopy | None]:
        """Run the model on the scheduled tokens; return the logits of the sequences that sample, in the model's
        dtype (the sampler takes float32 copies where it computes with them: a greedy bfloat16 step's argmax
        reads the bfloat16 logits, and no float32 copy of [rows, vocab] is written), and the prompt logprobs the
        step owes (runner/prompt_logprobs.py; on their way to the host, the step not waited for), else None."""
        if self.thread_governor is not None:
            self.thread_governor.tick()  # fewer threads while other processes hold our cores
        apply_block_table_updates(self.block_tables, plan)
        if plan.blocks_to_offload or plan.blocks_to_load or self.tier_copies_async:  # before anything reads or
            # writes those blocks (CUDA: the wait on the last step's restores, which this step's sequences read)
            self.host_kv.move(self.kv_cache, plan.blocks_to_offload, plan.blocks_to_load,
                              deferred=not self._reads_restored(plan))
        step = step_inputs(plan, self.block_tables, self.block_size)
        runner = self.decode_runner
        # a step with LoRA adapters: the hooks add the adapters' updates (eagerly, layer by layer, or captured in
        # the decode runner's LoRA graphs), or the fused C decode step adds them itself
        lora = self.lora is not None and self.lora.begin_step(plan)
        # every row a decode, and every row samples (a prompt row is a prefill's)
        if runner is not None and not step.prompt_rows and runner.takes(step, lora):
            hidden = runner.run_step(step, self._prev_tokens, self._prev_rows, self._copy_blocks, lora)
            if lora:
                self.lora.end_step()
            return self.model.compute_logits(hidden[: len(step.token_ids)]), None
        input_ids, meta, logits_index = self._prepare(step)
        fused = self.cpu_decode is not None and self.cpu_decode.accepts(input_ids.shape[0], logits_index.shape[0])
        c_lora = self.lora.c_step() if lora and fused else None  # the adapters as the C step reads them
        if fused and (c_lora or not lora):
            hidden = self.cpu_decode.run(input_ids, meta, c_lora)
        else:
            hidden = self.model(input_ids, self.backend, meta, self.kv_caches)
        if lora:
            self.lora.end_step()
        prompt = None
        if step.prompt_rows:
            prompt = prompt_logprobs.step_entries(
                step.prompt_rows, lambda r, i, end: self.model.compute_logits(hidden[r.row + i : r.row + end]))
        if logits_index.shape[0] != hidden.shape[0]:  # else every row samples (a decode step): no gather
            hidden = hidden[logits_index]
        return self.model.compute_logits(hidden), prompt

    def _reads_restored(self, plan: StepPlan) -> bool:
        """Whether a sequence of the step holds a block it restores (else the scheduler deferred them all: the
        restores may run behind this step's forward)."""
        restored = {block for _, block in plan.blocks_to_load}
        tables = self.block_tables
        return bool(restored) and any(not restored.isdisjoint(tables[s]) for s in plan.seq_ids if s in tables)

    def _prepare(self, step: StepInputs):
        """(input ids, the backend's metadata, rows whose logits are sampled) of an eager step, its block copies
        done: every integer input packed into the staging area and copied to the device at once (on the CPU
        they are used where they are), then the device work that reads them."""
        prev = None
        if step.placeholders:
            rows, prev = placeholder_rows(step, self._prev_tokens, self._prev_rows)

        def fill(pack):  # the patch's third row: room for the tokens gathered, so nothing is allocated for them
            return (pack.put(step.token_ids), pack.put([rows, prev, prev]) if prev else None,
                    pack.put(step.block_copies) if step.block_copies else None,
                    self.backend.stage(step.batch, pack), pack.put(step.logits_index))

        input_ids, patch, copies, staged, logits_index = self.staging.pack(fill)
        if copies is not None:
            self._copy_blocks(copies[:, 0], copies[:, 1])
        if patch is not None:  # tokens the previous step sampled: taken from its output, on the device
            input_ids.index_copy_(0, patch[0], torch.index_select(self._prev_tokens, 0, patch[1], out=patch[2]))
        return input_ids, self.backend.metadata(staged), logits_index

    def _copy_blocks(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """KV blocks `src` copied onto `dst` (device index tensors), every layer, keys and values."""
        self.kv_cache[:, :, dst] = self.kv_cache[:, :, src]

    @torch.inference_mode()
    def execute_async(self, plan: StepPlan, sampling: list[SamplingRow] | None) -> DoneStep | DeviceStep:
        """Run (CUDA: launch) the step and sample its rows (`sampling`: see `sample_logits`). With `overlaps`
        the sampled tokens stay where the logits are, for the next step's PLACEHOLDER inputs (and the penalties'
        counts of the step after: `pending_tokens`), and reach the host with their logprobs in one copy."""
        self.generators.attach(plan, sampling)
        logits, prompt = self.execute(plan)
        if not self.overlaps:  # every token on the host before the next step: nothing pending
            return DoneStep(*sample_logits(self.sampler, logits, sampling, staging=self.sample_staging).on_host(),
                            prompt)
        seq_ids = plan.sampled_seq_ids
        pending = None
        if sampling is not None:
            pending = pending_tokens(sampling, seq_ids, self._prev_tokens, self._prev_rows)
        sample = sample_logits(self.sampler, logits, sampling, pending, self.sample_staging)
        tokens = sample.tokens.to(self.device, non_blocking=True)  # the host sampler's (on-device ones are there)
        self._prev_tokens = tokens
        self._prev_rows = {seq_id: i for i, seq_id in enumerate(seq_ids)}
        if sample.sampled is not None:
            return DoneStep([t.token_id for t in sample.sampled], sample.sampled, prompt)
        packed = sample.pack()
        host = self._host_buffer(packed)
        host.copy_(packed, non_blocking=True)
        event = None
        if self.device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
        return DeviceStep(event, host, tokens.shape[0], sample.logprobs, prompt)

    def _host_buffer(self, packed: torch.Tensor) -> torch.Tensor:
        """The next host buffer (the pair alternates) for `packed`: int64 tokens, or float64 tokens and logprobs."""
        i, self._flip = self._flip, self._flip ^ 1
        n = packed.shape[0]
        if packed.dtype == torch.long:
            return self._host_tokens[i][:n]
        if self._host_packed[i].shape[0] < n:  # a step holds the old buffer while its copy may be queued
            size = max(n, 2 * self._host_packed[i].shape[0])
            self._host_packed[i] = torch.empty(size, dtype=torch.float64, pin_memory=self.device.type == "cuda")
        return self._host_packed[i][:n]


def _cpu_attention_path(backend) -> str:
    """The CPU attention kernel: the C paged kernel's variant, or the backend's name (the PyTorch reference)."""
    if backend.name == "cpu":
        from hetero_infer.kernels.cpu import paged_attention

        return f"paged_decode {paged_attention.variant()}"
    return backend.name


def _layer_caches(kv_cache: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(kv_cache[i, 0], kv_cache[i, 1]) for i in range(kv_cache.shape[0])]
