"""`hetero-infer fetch --tensor-parallel-size N`: once the model is in place, its config.json is checked with the
engine's own split check (worker/runner/parallel/checks.py), and a model that cannot be split N ways is one
permanent error line naming the model, N and the count that does not divide (the operator's CannotSplit)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from hub_server import Repo

from hetero_infer.model_source import EXIT_PERMANENT, ModelSourceError, check_tensor_split
from hetero_infer.worker.runner.parallel.checks import check_split

DENSE = {"num_attention_heads": 16, "num_key_value_heads": 8, "hidden_size": 64, "intermediate_size": 128}


def _folder(tmp_path: Path, config: dict) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize(("config", "n", "problem"), [
    (DENSE, 2, None),
    (DENSE, 4, None),
    (DENSE, 16, None),  # 8 KV heads over 16 ranks: each replicated twice
    (DENSE, 3, "num_attention_heads=16 is not divisible by 3"),
    ({**DENSE, "num_key_value_heads": 2}, 8, None),  # fewer KV heads than ranks: replicated
    ({**DENSE, "num_attention_heads": 12, "num_key_value_heads": 3}, 4,
     "num_key_value_heads=3 neither divides by 4 nor divides it (to replicate)"),
    ({**DENSE, "intermediate_size": 100}, 8, "intermediate_size=100 is not divisible by 8"),
    ({"text_config": {**DENSE, "moe_intermediate_size": 6}}, 4, "moe_intermediate_size=6 is not divisible by 4"),
])
def test_the_split_check_names_the_model_the_ways_and_the_count(tmp_path: Path, config: dict, n: int,
                                                                problem: str | None) -> None:
    folder = _folder(tmp_path, config)
    if problem is None:
        check_tensor_split("org/m", folder, n)
        check_split(config, n)  # the engine agrees
        return
    with pytest.raises(ModelSourceError) as refused:
        check_tensor_split("org/m", folder, n)
    assert refused.value.permanent
    message = str(refused.value)
    assert message.startswith(f"cannot split org/m {n} ways: ") and problem in message and "\n" not in message
    with pytest.raises(ValueError, match="cannot be split"):  # the engine refuses the same model at start
        check_split(config, n)


def test_an_unreadable_config_is_one_permanent_line(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelSourceError) as refused:
        check_tensor_split("org/m", tmp_path, 2)
    assert refused.value.permanent and str(refused.value).startswith("cannot split org/m 2 ways: cannot read ")


def test_fetch_checks_the_split_after_the_download(hub_env, model_files, capsys, caplog) -> None:
    from hetero_infer.cli import main

    repo = Repo()
    repo.add_commit({**model_files, "config.json": json.dumps({"model_type": "llama", **DENSE}).encode()})
    hub_env.repos["org/tiny"] = repo
    assert main(["fetch", "hf://org/tiny", "--tensor-parallel-size", "3"]) == EXIT_PERMANENT
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    (error,) = errors
    assert error.startswith("cannot split org/tiny 3 ways: num_attention_heads=16 is not divisible by 3; ")
    assert capsys.readouterr().out == ""  # no folder printed: the download is not done
    assert main(["fetch", "hf://org/tiny", "--tensor-parallel-size", "4"]) == 0
    assert (Path(capsys.readouterr().out.strip()) / "config.json").is_file()
    with pytest.raises(SystemExit):
        main(["fetch", "hf://org/tiny", "--tensor-parallel-size", "0"])
