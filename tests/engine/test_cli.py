"""The README's main job and the benchmark command, run as a user would."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def run(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hetero_infer.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow  # the default model through `generate` (~27 s); tests/server/test_readme_main_job.py has it answer Paris through `serve`
def test_generate_default_model_says_paris():
    proc = run("generate", "--prompt", "The capital of France is", "--max-tokens", "12", "--temperature", "0")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("The capital of France is")
    assert "Paris" in proc.stdout


def test_generate_bad_option_gives_clear_error():
    proc = run("generate", "--prompt", "x", "--block-size", "0")
    assert proc.returncode == 2
    assert "block_size" in proc.stderr and "Traceback" not in proc.stderr


def test_bench_runs_small_workload_beside_transformers(tiny_model, tmp_path):
    folder, _ = tiny_model("qwen2")
    out = tmp_path / "bench.json"
    proc = run("bench", "--model", str(folder), "--num-requests", "3", "--min-prompt", "4", "--max-prompt", "12",
               "--output-len", "5", "--dtypes", "float32", "--peers", "hf-generate", "--no-scheduler-overhead",
               "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    systems = {r["system"]: r for r in report["results"]}
    assert systems["hetero-infer"]["output_tokens"] == 15
    extra = systems["hetero-infer"]["extra"]  # copy speed sampled during our run, weights read against it
    assert extra["copy_samples"] >= 1 and extra["copy_gbs_during"] > 0
    assert extra["weight_gbs_vs_copy"] == pytest.approx(extra["decode_weight_gbs"] / extra["copy_gbs_during"], rel=1e-9)
    assert systems["transformers generate (padded batch)"]["output_tokens"] == 15
    assert "| hetero-infer | float32 | 15 |" in proc.stdout


@pytest.mark.slow  # bench on quantized weights beside transformers (~90 s); test_bench_runs_small_workload_beside_transformers covers the command
def test_bench_names_quantized_weights_and_compares_them_with_the_peer(tiny_model, tmp_path):
    folder, _ = tiny_model("llama")
    out = tmp_path / "bench.json"
    proc = run("bench", "--model", str(folder), "--num-requests", "2", "--min-prompt", "4", "--max-prompt", "8",
               "--output-len", "3", "--dtypes", "bfloat16", "--peers", "hf-generate", "--no-scheduler-overhead",
               "--quantization", "int8", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    systems = {r["system"]: r for r in json.loads(out.read_text())["results"]}
    assert systems["hetero-infer (int8 weights)"]["output_tokens"] == 6
    row = next(line for line in proc.stdout.splitlines() if line.startswith("| hetero-infer (int8 weights) |"))
    assert row.rstrip(" |").split("|")[-1].strip().endswith("x")  # a ratio against the peer, not "-"
