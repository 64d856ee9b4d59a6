"""hetero_infer.contracts.options: one layered loader (flag > environment > config file > default), typed by the
dataclass fields' real types."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Optional

import pytest

from hetero_infer.contracts.options import (
    InvalidOption,
    add_config_flag,
    add_flags,
    coerce,
    environment_values,
    load_options,
)

PREFIX = "DEMO_"


@dataclass
class Demo:
    count: int = 1
    ratio: float = 0.5
    enabled: bool = True
    limit: int | None = None
    legacy_limit: Optional[int] = None  # noqa: UP045 (typing.Optional must work as well as `X | None`)
    mode: Literal["fast", "slow"] = "fast"
    policy: Literal["a", "b"] | None = None
    names: list[str] = field(default_factory=list)
    label: str | None = None
    token: str = field(default="", repr=False)  # a secret

    def __post_init__(self) -> None:
        if self.count < 0:
            raise InvalidOption("count", f"invalid option count={self.count}: must be >= 0")


@dataclass
class Other:
    port: int = 80


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_config_flag(p, PREFIX)
    add_flags(p, Demo)
    add_flags(p, Other)
    return p


def load(argv: list[str], env: dict[str, str] | None = None) -> tuple[Demo, Other]:
    demo, other = load_options((Demo, Other), parser().parse_args(argv), PREFIX, env or {})
    return demo, other


def test_each_layer_wins_over_the_next(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("count: 3\nratio: 0.25\nport: 81\n")
    env = {"DEMO_COUNT": "4", "DEMO_PORT": "82"}
    assert load([])[0].count == 1  # default
    assert load(["--config", str(cfg)])[0].count == 3  # file > default
    assert load(["--config", str(cfg)], env)[0].count == 4  # environment > file
    demo, other = load(["--config", str(cfg), "--count", "5"], env)
    assert demo.count == 5 and demo.ratio == 0.25 and other.port == 82  # flag > environment; layers merge per option
    assert load([], {"DEMO_CONFIG": str(cfg)})[0].count == 3  # the file named by the environment
    assert load([], {"DEMO_COUNT": ""})[0].count == 1  # set but empty: not set


def test_text_from_flags_and_environment_is_read_by_the_fields_type() -> None:
    demo, _ = load([], {"DEMO_COUNT": "7", "DEMO_RATIO": "2", "DEMO_ENABLED": "off", "DEMO_LIMIT": "9",
                        "DEMO_LEGACY_LIMIT": "10", "DEMO_MODE": "slow", "DEMO_POLICY": "b", "DEMO_NAMES": "x,y",
                        "DEMO_LABEL": "none"})
    assert (demo.count, demo.ratio, demo.enabled, demo.limit, demo.legacy_limit) == (7, 2.0, False, 9, 10)
    assert isinstance(demo.ratio, float) and demo.mode == "slow" and demo.policy == "b"
    assert demo.names == ["x,y"]  # one variable, one item (an API key may hold a comma)
    assert demo.label == "none"  # a plain string stays itself
    assert load([], {"DEMO_LIMIT": "auto", "DEMO_POLICY": "None"})[0].limit is None
    assert load([], {"DEMO_POLICY": "null"})[0].policy is None
    for word, value in (("1", True), ("yes", True), ("TRUE", True), ("0", False), ("no", False)):
        assert load([], {"DEMO_ENABLED": word})[0].enabled is value

    args = parser().parse_args(["--count", "8", "--no-enabled", "--limit", "none", "--legacy-limit", "3",
                                "--mode", "slow", "--names", "a", "--names", "b"])
    assert (args.count, args.enabled, args.limit, args.legacy_limit, args.mode, args.names) == (
        8, False, None, 3, "slow", ["a", "b"])
    assert parser().parse_args([]).count is None  # not given: the lower layers decide


def test_config_file_values_must_have_the_fields_type(tmp_path: Path) -> None:
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"count": 2, "ratio": 1, "enabled": False, "limit": None, "mode": "slow",
                               "names": ["a", "b"], "legacy-limit": 4}))
    demo, _ = load(["--config", str(cfg)])
    assert (demo.count, demo.ratio, demo.enabled, demo.limit, demo.mode, demo.names, demo.legacy_limit) == (
        2, 1.0, False, None, "slow", ["a", "b"], 4)
    assert isinstance(demo.ratio, float)
    for bad in ({"count": "2"}, {"count": True}, {"count": 2.5}, {"enabled": "yes"}, {"mode": "medium"},
                {"names": [1]}, {"ratio": "fast"}):
        cfg.write_text(json.dumps(bad))
        name = next(iter(bad))
        with pytest.raises(ValueError, match=f"config file {cfg}: option {name}="):
            load(["--config", str(cfg)])


def test_unknown_config_keys_are_rejected_by_name(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("cuont: 2\nprot: 3\nnonsense: 1\n")
    with pytest.raises(ValueError) as info:
        load(["--config", str(cfg)])
    message = str(info.value)
    assert message.startswith(f"config file {cfg}: unknown option(s): ")
    assert "cuont (did you mean count?)" in message and "prot (did you mean port?)" in message
    assert "nonsense" in message


@pytest.mark.parametrize(("argv", "env", "file", "expected"), [
    ([], {"DEMO_COUNT": "many"}, None, "environment variable DEMO_COUNT: option count='many' must be an integer"),
    ([], {"DEMO_ENABLED": "maybe"}, None, "DEMO_ENABLED: option enabled='maybe' must be true or false"),
    ([], {"DEMO_MODE": "medium"}, None, "DEMO_MODE: option mode='medium' must be one of fast, slow"),
    ([], {"DEMO_RATIO": "half"}, None, "DEMO_RATIO: option ratio='half' must be a number"),
    ([], {}, "count: -1\n", "invalid option count=-1: must be >= 0 (from config file"),
    ([], {"DEMO_COUNT": "-2"}, None, "count=-2: must be >= 0 (from environment variable DEMO_COUNT)"),
    (["--count", "-3"], {}, None, "count=-3: must be >= 0 (from flag --count)"),
    ([], {}, "- a list\n", "must hold a mapping"),
    ([], {}, "count: [1\n", "is not valid YAML"),
    (["--config", "/nonexistent/c.yaml"], {}, None, "config file not found: /nonexistent/c.yaml"),
])
def test_bad_values_name_the_option_and_their_source(tmp_path: Path, argv: list[str], env: dict[str, str],
                                                     file: str | None, expected: str) -> None:
    if file is not None:
        cfg = tmp_path / "c.yaml"
        cfg.write_text(file)
        argv = [*argv, "--config", str(cfg)]
    with pytest.raises(ValueError) as info:
        load(argv, env)
    assert expected in str(info.value)


def test_bad_flag_text_is_an_argparse_error_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, expected in ((["--count", "x"], "argument --count: 'x' must be an integer"),
                           (["--mode", "medium"], "argument --mode: 'medium' must be one of fast, slow")):
        with pytest.raises(SystemExit):
            parser().parse_args(argv)
        assert expected in capsys.readouterr().err


def test_secrets_never_appear_in_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"token": 123456}))
    with pytest.raises(ValueError) as info:
        load(["--config", str(cfg)])
    assert "123456" not in str(info.value) and "token=***" in str(info.value)


def test_environment_values_are_only_the_options_it_sets() -> None:
    assert environment_values(Demo, {"DEMO_COUNT": "2", "DEMO_PORT": "1", "OTHER": "x"}, PREFIX) == {"count": 2}


def test_types_the_loader_cannot_read_fail_when_flags_are_built() -> None:
    @dataclass
    class Odd:
        pairs: dict[str, int] = field(default_factory=dict)

    with pytest.raises(TypeError, match="Odd.pairs"):
        add_flags(argparse.ArgumentParser(), Odd)


def test_an_option_defined_by_two_classes_is_refused() -> None:
    @dataclass
    class Clash:
        count: int = 0

    with pytest.raises(TypeError, match="count"):
        load_options((Demo, Clash), argparse.Namespace(), PREFIX, {})


def test_coerce_keeps_bools_out_of_numbers_and_literals() -> None:
    with pytest.raises(ValueError):
        coerce(int, True, text=False)
    with pytest.raises(ValueError):
        coerce(Literal[1, 2], True, text=False)
    assert coerce(Literal[1, 2], "2", text=True) == 2
    assert coerce(list[int], ["1", "2"], text=True) == [1, 2]
