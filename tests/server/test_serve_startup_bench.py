"""benchmarks/serve_startup.py, run as a user runs it (one round, the mock executor): it launches the real server,
times it to listening, ready and its first answer, and prints the table and the JSON it promises."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_one_round_times_the_mock_server_to_its_first_answer(tmp_path):
    out = tmp_path / "startup.json"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "serve_startup.py"), "--rounds", "1",
                          "--executors", "mock", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    samples = json.loads(out.read_text())
    assert list(samples) == ["hetero-infer (mock)"]
    (sample,) = samples["hetero-infer (mock)"]
    assert 0 < sample["listen_s"] <= sample["ready_s"] <= sample["answer_s"] < 300
    assert sample["text"]  # 12 tokens of the mock executor, detokenized
    row = next(line for line in run.stdout.splitlines() if line.startswith("| hetero-infer (mock) |"))
    assert f"{sample['ready_s']:.2f}" in row


def test_bad_options_are_refused():
    for bad in (["--rounds", "0"], ["--executors", "gpu"]):
        run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "serve_startup.py"), *bad],
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 2 and "error:" in run.stderr
