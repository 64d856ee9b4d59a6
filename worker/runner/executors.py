"""What the engine core asks of an executor (`Executor`, a typing.Protocol that the `torch` and `mock` executors
implement, and a remote one would), and the registry the engine picks one from by `EngineConfig.executor`.

An executor takes one step at a time as plain data (the step contract, hetero_infer/contracts/step.py) and hands
back a `StepHandle` (worker/runner/step_handle.py) whose `result()` is the one wait for the step's tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from hetero_infer.contracts.engine_options import EngineConfig
from hetero_infer.contracts.lora import LoRARequest
from hetero_infer.contracts.step import SamplingRow, StepPlan
from hetero_infer.worker.runner.step_handle import StepHandle


class ExecutorDeadError(RuntimeError):
    """The executor can run no more steps (a tensor-parallel rank died or hung): raised from `execute_async`, it
    stops the engine (every open request fails, the server turns unready) instead of failing one step's requests."""


class Executor(Protocol):
    vocab_size: int  # rows of the logits it samples from
    num_blocks: int  # KV blocks in its pool (the engine's block manager hands out exactly these)
    num_host_blocks: int  # KV blocks of its host tier (`--kv-offloading-size`; 0: none)
    block_bytes: int  # bytes of one KV block (the host tier's metrics)
    device: Any  # where it computes (torch.device or its name; seeded rows' generators live there too)
    overlaps: bool  # `execute_async` returns before the step ends: the engine may launch the next one first
    samples_itself: bool  # it picks every token itself: the engine passes no sampling rows

    def execute_async(self, plan: StepPlan, sampling: list[SamplingRow] | None) -> StepHandle:
        """Run (or launch) a step; `sampling`: one row per sequence that samples, in order, or None where every row
        takes its argmax (a seeded row draws from the generator the executor keeps for its sequence:
        `SeededGenerators`). `plan.adapter_ids` names the LoRA adapter of a sequence (each one added before)."""

    def add_lora(self, request: LoRARequest) -> None:
        """Read and check a LoRA adapter into host memory (LoRAAdapterError, and nothing kept, for a bad one);
        the executor copies it into a device slot when a step first runs it."""

    def remove_lora(self, name: str) -> bool:
        """Forget an adapter (its host copy and its device slot); False where it held none."""


@dataclass(frozen=True)
class ModelFiles:
    """What an executor may load: the model's folder and config, the context length the engine serves, and the
    tokenizer's vocabulary size (None without a tokenizer)."""

    folder: Path
    hf_config: Any
    max_model_len: int
    tokenizer_vocab_size: int | None


@dataclass(frozen=True)
class ExecutorKind:
    """A registered executor: how to build it, and whether it runs the model (False: it needs only the config's
    serving fields, and its step budget is the CPU's whatever the device)."""

    create: Callable[[EngineConfig, ModelFiles], Executor]
    runs_model: bool = True


_REGISTRY: dict[str, ExecutorKind] = {}


def register_executor(name: str, kind: ExecutorKind) -> None:
    _REGISTRY[name] = kind


def executor_kind(name: str) -> ExecutorKind:
    kind = _REGISTRY.get(name)
    if kind is None:
        raise ValueError(f"unknown executor {name!r}: registered are {', '.join(sorted(_REGISTRY))}")
    return kind


def registered_executors() -> list[str]:
    return sorted(_REGISTRY)


def _torch_executor(config: EngineConfig, model: ModelFiles) -> Executor:
    # the kernels and the model code: imported only where a model runs
    from hetero_infer.worker.runner.executor import TorchExecutor

    if config.tensor_parallel_size > 1:  # rank 0 here, the other ranks in processes of their own
        from hetero_infer.worker.runner.parallel.executor import TensorParallelExecutor

        return TensorParallelExecutor(config, model)
    return TorchExecutor(config, model.hf_config, model.folder, model.max_model_len)


def _mock_executor(config: EngineConfig, model: ModelFiles) -> Executor:
    from hetero_infer.worker.runner.mock_executor import MockExecutor

    vocab = model.tokenizer_vocab_size if model.tokenizer_vocab_size is not None else model.hf_config.vocab_size
    shapes = None
    if config.enable_lora:  # the adapters are checked against config.json's sizes, as the torch executor does
        from hetero_infer.worker.runner.lora.adapter import config_json_shapes

        shapes = config_json_shapes(model.folder)
    return MockExecutor(config, vocab_size=vocab, shapes=shapes)


register_executor("torch", ExecutorKind(_torch_executor))
register_executor("mock", ExecutorKind(_mock_executor, runs_model=False))
