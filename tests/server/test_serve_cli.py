"""`hetero-infer serve` options: flags, config file (JSON/YAML), environment, validated before anything loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetero_infer.worker.server.cli import build_parser, main, resolve_options


def _resolve(argv: list[str], env: dict[str, str] | None = None):
    return resolve_options(build_parser().parse_args(argv), env or {})


def test_defaults() -> None:
    options, engine = _resolve([])
    assert (options.host, options.port) == ("127.0.0.1", 3000)
    assert options.api_keys() == []
    assert engine.executor == "torch"


def test_precedence_flag_over_env_over_file(tmp_path: Path) -> None:
    cfg = tmp_path / "serve.yaml"
    cfg.write_text("port: 4000\nhost: 0.0.0.0\nmax_queue_len: 7\nexecutor: mock\nmax-num-seqs: 8\nblock_size: 32\n")
    options, engine = _resolve(["--config", str(cfg), "--max-num-seqs", "4"],
                               {"HETERO_INFER_PORT": "5000", "HETERO_INFER_BLOCK_SIZE": "8"})
    assert options.port == 5000 and options.host == "0.0.0.0" and options.max_queue_len == 7
    assert engine.executor == "mock" and engine.max_num_seqs == 4 and engine.block_size == 8
    cfg_json = tmp_path / "serve.json"
    cfg_json.write_text(json.dumps({"request_timeout": 12.5, "access_log": False}))
    options, _ = _resolve([], {"HETERO_INFER_CONFIG": str(cfg_json)})
    assert options.request_timeout == 12.5 and options.access_log is False


def test_api_keys_from_all_sources(tmp_path: Path) -> None:
    key_file = tmp_path / "keys"
    key_file.write_text("k-file-1\n\n# comment\nk-file-2\n")
    options, _ = _resolve(["--api-key", "k-flag", "--api-key-file", str(key_file)])
    assert options.api_keys() == ["k-flag", "k-file-1", "k-file-2"]
    options, _ = _resolve([], {"HETERO_INFER_API_KEY": "k-env"})
    assert options.api_keys() == ["k-env"]
    assert "k-flag" not in repr(_resolve(["--api-key", "k-flag"])[0])


@pytest.mark.parametrize(("argv", "env", "file", "message"), [
    (["--port", "70000"], {}, None, "port"),
    (["--max-queue-len", "-1"], {}, None, "max_queue_len"),
    (["--request-timeout", "0"], {}, None, "request_timeout"),
    (["--log-format", "xml"], {}, None, "log_format"),
    (["--max-num-seqs", "0"], {}, None, "max_num_seqs"),
    (["--executor", "gpu"], {}, None, "executor"),
    (["--api-key-file", "/nonexistent/keys"], {}, None, "API key file"),
    ([], {"HETERO_INFER_PORT": "eighty"}, None, "HETERO_INFER_PORT"),
    ([], {"HETERO_INFER_ACCESS_LOG": "maybe"}, None, "HETERO_INFER_ACCESS_LOG"),
    ([], {}, "port: not-a-port\n", "port"),
    ([], {}, "unknown_thing: 1\n", "unknown_thing"),
    ([], {}, "max-num-seq: 4\n", "max_num_seq (did you mean max_num_seqs?)"),
    ([], {}, "block_size: '32'\n", "option block_size='32' must be an integer"),
    ([], {"HETERO_INFER_MAX_NUM_SEQS": "0"}, None, "(from environment variable HETERO_INFER_MAX_NUM_SEQS)"),
    (["--shutdown-grace", "-1"], {}, None, "(from flag --shutdown-grace)"),
    ([], {}, "- a list\n", "mapping"),
    (["--config", "/nonexistent.yaml"], {}, None, "not found"),
])
def test_bad_options_exit_2_with_a_clear_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str], argv: list[str],
                                                 env: dict[str, str], file: str | None, message: str) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    if file is not None:
        cfg = tmp_path / "bad.yaml"
        cfg.write_text(file)
        argv = [*argv, "--config", str(cfg)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("hetero-infer serve: error:") and message in err, err


def test_secret_values_are_masked_in_errors(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                            tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("api_key: 12345\n")
    assert main(["--config", str(cfg)]) == 2
    assert "12345" not in capsys.readouterr().err


def test_help_lists_contract_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for flag in ("--host", "--port", "--config", "--block-size", "--max-num-blocks", "--max-num-seqs",
                 "--max-model-len", "--max-num-batched-tokens", "--memory-threshold", "--model", "--device",
                 "--dtype", "--executor", "--api-key", "--api-key-file", "--max-queue-len", "--request-timeout",
                 "--shutdown-grace"):
        assert flag in out, flag


def test_optional_options_go_back_to_their_default_from_text(tmp_path: Path) -> None:
    """`none`/`auto` from a flag or the environment unsets an optional engine option that a file set."""
    cfg = tmp_path / "serve.yaml"
    cfg.write_text("max_model_len: 256\nquantization: int8\nengine_process: false\n")
    options, engine = _resolve(["--config", str(cfg)], {"HETERO_INFER_MAX_MODEL_LEN": "auto",
                                                         "HETERO_INFER_QUANTIZATION": "none",
                                                         "HETERO_INFER_ENGINE_PROCESS": "auto"})
    assert engine.max_model_len is None and engine.quantization is None and options.engine_process is None
    _, engine = _resolve(["--config", str(cfg)])
    assert engine.max_model_len == 256 and engine.quantization == "int8"
