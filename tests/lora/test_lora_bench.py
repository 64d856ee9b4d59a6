"""bench.lora (docs/benchmarks.md, "LoRA adapters") runs end to end on a tiny model: both systems measured, the
adapters it writes accepted by the engine, the numbers it reports present and sane."""

from __future__ import annotations

import json

import pytest
import torch

from hetero_infer.bench.lora import main


def test_bench_lora_runs_on_a_tiny_model(tiny_model, tmp_path, capsys):
    folder, _ = tiny_model("llama")
    out = tmp_path / "lora.json"
    result = main(["--model", str(folder), "--dtype", "float32", "--adapters", "2", "--rank", "8", "--seqs", "4",
                   "--prompt-len", "8", "--max-tokens", "4", "--rounds", "1", "--json", str(out)])
    assert result["base_tok_s"] > 0 and result["lora_tok_s"] > 0 and len(result["runs"]["lora"]) == 1
    assert 0 < result["adapter_read_s"] < 30 and result["slot_copy_s"] >= 0
    assert json.loads(out.read_text())["ratio"] == result["ratio"]
    assert "| 2 adapters mixed |" in capsys.readouterr().out


def test_bench_lora_times_the_fused_step_with_and_without_adapters(tiny_model, tmp_path, capsys, monkeypatch):
    """Where the fused CPU decode step runs (every linear forced onto the GEMM it needs), the bench also times one
    decode step of it alone with and without the adapters."""
    from hetero_infer.kernels.cpu import decode_step

    if not decode_step.available(torch.float32):
        pytest.skip("no fused float32 step in this build (tests/engine/test_cpu_fused_step.py checks where it must be)")
    monkeypatch.setenv("HETERO_INFER_CPU_LINEAR", "gemm_f32")
    folder, _ = tiny_model("llama")
    result = main(["--model", str(folder), "--dtype", "float32", "--adapters", "2", "--rank", "8", "--seqs", "4",
                   "--prompt-len", "8", "--max-tokens", "4", "--rounds", "1"])
    probe = result["fused_step_ms"]
    assert probe and probe["base"] > 0 and probe["lora"] > 0
    assert "The fused CPU decode step alone, 4 rows" in capsys.readouterr().out
