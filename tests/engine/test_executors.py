"""The executor registry the engine picks from (`EngineConfig.executor`), and the `Executor` protocol every
registered executor implements."""

from __future__ import annotations

import typing

import pytest

from hetero_infer.contracts.engine_options import EXECUTORS, EngineConfig
from hetero_infer.contracts.sampling_params import SamplingParams
from hetero_infer.worker.core.engine import LLMEngine
from hetero_infer.worker.runner import executors
from hetero_infer.worker.runner.executors import (
    Executor,
    ExecutorKind,
    ModelFiles,
    executor_kind,
    registered_executors,
)
from hetero_infer.worker.runner.mock_executor import MockExecutor


def test_every_executor_option_is_registered():
    assert registered_executors() == sorted(EXECUTORS)
    with pytest.raises(ValueError, match="unknown executor 'nope': registered are mock, torch"):
        executor_kind("nope")
    assert executor_kind("torch").runs_model and not executor_kind("mock").runs_model


def test_the_mock_implements_the_protocol():
    ex = executor_kind("mock").create(EngineConfig(executor="mock"), ModelFiles(".", None, 64, 1234))
    members = set(typing.get_type_hints(Executor)) | {"execute_async"}
    assert members == {"vocab_size", "num_blocks", "num_host_blocks", "block_bytes", "device", "overlaps",
                       "samples_itself", "execute_async"}
    assert all(hasattr(ex, m) for m in members) and ex.vocab_size == 1234


def test_the_engine_builds_its_executor_from_the_registry(monkeypatch):
    """An executor registered under a name is what the engine runs (a remote executor would register so)."""
    built = []

    class Recording(MockExecutor):
        def execute_async(self, plan, sampling):
            built.append(list(plan.new_prompts.values()))
            return super().execute_async(plan, sampling)

    monkeypatch.setitem(executors._REGISTRY, "mock",
                        ExecutorKind(lambda config, model: Recording(config, 1000), runs_model=False))
    engine = LLMEngine(EngineConfig(executor="mock", max_model_len=64, max_num_blocks=16))
    engine.add_request("r", None, [5, 6, 7], SamplingParams(max_tokens=2, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step_deltas()
    assert isinstance(engine.executor, Recording) and built[0] == [[5, 6, 7]]
