"""The default step budget (`max_num_batched_tokens`) comes from the device, as vLLM chooses it."""

from __future__ import annotations

import pytest

from hetero_infer.contracts.engine_options import GIB, EngineConfig, batch_token_budget
from hetero_infer.contracts.options import InvalidOption
from hetero_infer.worker.core import engine as engine_mod
from hetero_infer.worker.core.engine import LLMEngine, with_batch_budget


@pytest.mark.parametrize(
    ("device", "memory", "name", "offline", "budget"),
    [
        ("cpu", 0, "", False, 2048),
        ("cpu", 0, "", True, 2048),
        ("cuda", 80 * GIB, "NVIDIA H100 80GB HBM3", False, 8192),
        ("cuda", 80 * GIB, "NVIDIA H100 80GB HBM3", True, 16384),
        ("cuda", 141 * GIB, "NVIDIA H200", True, 16384),
        ("cuda", 80 * GIB, "NVIDIA A100-SXM4-80GB", False, 2048),  # vLLM PR #17885: the A100 loses with more
        ("cuda", 80 * GIB, "NVIDIA A100-SXM4-80GB", True, 8192),
        ("cuda", 24 * GIB, "NVIDIA L4", False, 2048),
        ("cuda", 24 * GIB, "NVIDIA L4", True, 8192),
        ("cuda", 70 * GIB - 1, "NVIDIA H100", True, 8192),  # the bound is 70 GiB, inclusive
        ("cuda", 70 * GIB, "NVIDIA H100", True, 16384),
    ],
)
def test_budget_follows_vllm_table(device, memory, name, offline, budget):
    assert batch_token_budget(device, memory, name, offline) == budget


def test_an_explicit_budget_is_kept_and_a_bad_one_refused(monkeypatch):
    monkeypatch.setattr("hetero_infer.worker.runner.executor.device_description",
                        lambda device: ("cuda", 80 * GIB, "NVIDIA H100 80GB HBM3"))
    assert with_batch_budget(EngineConfig(max_num_batched_tokens=512), offline=True).max_num_batched_tokens == 512
    assert with_batch_budget(EngineConfig(), offline=True).max_num_batched_tokens == 16384
    assert with_batch_budget(EngineConfig(), offline=False).max_num_batched_tokens == 8192
    assert with_batch_budget(EngineConfig(executor="mock"), offline=True).max_num_batched_tokens == 2048
    with pytest.raises(InvalidOption, match="max_num_batched_tokens"):
        EngineConfig(max_num_batched_tokens=0)


def test_engine_schedules_with_the_resolved_budget(monkeypatch):
    seen = []
    real = engine_mod.with_batch_budget
    monkeypatch.setattr(engine_mod, "with_batch_budget", lambda c, offline=False: seen.append(offline) or real(c, offline))
    engine = LLMEngine(EngineConfig(executor="mock"))
    assert engine.config.max_num_batched_tokens == 2048 == engine.scheduler.max_num_batched_tokens
    from hetero_infer import LLM

    llm = LLM(executor="mock", max_num_batched_tokens=300)
    assert llm.engine.scheduler.max_num_batched_tokens == 300
    assert seen == [False, True]  # LLM is offline generation, a bare engine (the server's) is not
