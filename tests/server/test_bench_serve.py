"""`hetero-infer bench serve` against the mock server: numbers, JSON, file prompts, error accounting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from server_proc import ServerProcess

from hetero_infer.bench.serve import main


def test_random_prompts_fixed_concurrency(server: ServerProcess, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench.json"
    assert main(["--url", server.url, "--num-prompts", "24", "--concurrency", "6", "--input-len", "16",
                 "--output-len", "8", "--seed", "3", "--output-json", str(out), "--no-progress"]) == 0
    table = capsys.readouterr().out
    for label in ("Output token throughput", "TTFT", "ITL", "TPOT", "E2E", "p99"):
        assert label in table
    s = json.loads(out.read_text())
    assert s["completed"] == 24 and s["failed"] == 0 and s["errors"] == {}
    assert s["output_tokens"] == 24 * 8
    assert s["prompt_tokens"] > 24 * 8
    assert s["output_throughput"] > 0 and s["request_throughput"] > 0
    for key in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
        v = s[key]
        assert 0 < v["p50"] <= v["p90"] <= v["p99"], (key, v)
    assert s["ttft_ms"]["p50"] <= s["e2e_ms"]["p50"]


def test_request_rate_chat_and_file_prompts(server: ServerProcess, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "prompts.jsonl"
    data.write_text("\n".join(json.dumps(x) for x in [
        {"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 5},
        {"prompt": "Plain prompt", "max_tokens": 3},
    ]))
    assert main(["--url", server.url + "/v1", "--endpoint", "chat", "--dataset", str(data), "--num-prompts", "6",
                 "--request-rate", "40", "--output-json", "-", "--no-progress"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["completed"] == 6 and s["output_tokens"] == 3 * 5 + 3 * 3
    assert s["request_rate"] == 40.0


def test_errors_are_counted(server: ServerProcess, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--url", server.url, "--model", "no-such-model", "--num-prompts", "3", "--output-json", "-",
                 "--no-progress"]) == 1
    s = json.loads(capsys.readouterr().out)
    assert s["completed"] == 0 and s["failed"] == 3 and s["errors"] == {"HTTP 404": 3}


@pytest.mark.parametrize("argv", [["--num-prompts", "0"], ["--request-rate", "0"], ["--range-ratio", "1.5"],
                                  ["--dataset", "/nonexistent.jsonl"]])
def test_bad_arguments(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--url", "http://127.0.0.1:9", *argv]) == 2
    assert "error" in capsys.readouterr().err


def test_unreachable_server(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--url", "http://127.0.0.1:9", "--num-prompts", "1", "--no-progress"]) == 2
    assert "error" in capsys.readouterr().err
