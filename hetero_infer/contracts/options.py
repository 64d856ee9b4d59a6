"""One layered option loader for every command: flag > environment > config file > default.

A command's options are the fields of plain dataclasses (`EngineConfig`, `ServerOptions`, the operator's
options). Their real types (`typing.get_type_hints`, not annotation strings) decide everything else: the flag
each field gets (`--max-num-seqs`), how text from a flag or a `<PREFIX><OPTION>` environment variable is read,
and what a `--config FILE` (JSON or YAML, snake_case keys) may hold. Supported types: str, int, float, bool,
`Literal[...]`, `list[X]` and `X | None` of those. A field declared with `repr=False` is a secret: its value
never appears in an error.

    parser = argparse.ArgumentParser()
    add_config_flag(parser)
    add_flags(parser, EngineConfig, help={...})
    (engine,) = load_options((EngineConfig,), parser.parse_args(argv), "HETERO_INFER_")

`to_flags` goes the other way: option values -> the flags that give them (the operator renders the workers' and
routers' command lines with it, from these same dataclasses). A bad value raises ValueError naming the option, the value and where it came from.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import os
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Union

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")
# Text that means "unset" (the field's None) for an optional field that is not a plain string.
NONE_WORDS = ("none", "null", "auto")
DEFAULT_SOURCE = "the default"


class InvalidOption(ValueError):
    """A dataclass rejected one of its options (raised by its `__post_init__`); `name` says which."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name


@dataclasses.dataclass(frozen=True)
class Option:
    name: str
    type: Any  # the resolved type hint
    secret: bool

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def show(self, value: Any) -> str:
        return "***" if self.secret else repr(value)


def options_of(cls: type) -> dict[str, Option]:
    """The options of one dataclass, by name (TypeError for a field type the loader cannot read)."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        _check_supported(cls, f.name, tp)
        out[f.name] = Option(f.name, tp, secret=not f.repr)
    return out


def _split_optional(tp: Any) -> tuple[Any, bool]:
    """(T, True) for `T | None`, (tp, False) otherwise."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
    return tp, False


def _check_supported(cls: type, name: str, tp: Any) -> None:
    inner, _ = _split_optional(tp)
    if typing.get_origin(inner) is list:
        (inner,) = typing.get_args(inner) or (None,)
    if inner in (str, int, float, bool):
        return
    if typing.get_origin(inner) is Literal and all(isinstance(a, (str, int)) for a in typing.get_args(inner)):
        return
    raise TypeError(f"{cls.__name__}.{name}: the option loader cannot read values of type {tp!r}")


# -- values --------------------------------------------------------------------------------------
def coerce(tp: Any, value: Any, *, text: bool) -> Any:
    """`value` as type `tp`. `text`: it came from a flag or the environment, so strings are parsed ("8" is 8,
    "off" is False); otherwise (a config file) it must already have the type, ints widening to floats.
    ValueError says what was expected."""
    inner, optional = _split_optional(tp)
    if optional:
        if value is None:
            return None
        if text and inner is not str and isinstance(value, str) and value.lower() in NONE_WORDS:
            return None
        return coerce(inner, value, text=text)
    if typing.get_origin(tp) is list:
        (item,) = typing.get_args(tp)
        values = value if isinstance(value, (list, tuple)) else [value]
        return [coerce(item, v, text=text) for v in values]
    if typing.get_origin(tp) is Literal:
        choices = typing.get_args(tp)
        for choice in choices:
            if value == choice and type(value) is type(choice):
                return choice
            if text and isinstance(value, str) and value == str(choice):
                return choice
        raise ValueError(f"must be one of {', '.join(map(str, choices))}")
    if tp is bool:
        if isinstance(value, bool):
            return value
        if text and isinstance(value, str) and value.lower() in TRUE_WORDS + FALSE_WORDS:
            return value.lower() in TRUE_WORDS
        raise ValueError("must be true or false")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if text and isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
        raise ValueError("must be an integer")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if text and isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ValueError("must be a number")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ValueError("must be a string")
    raise TypeError(f"unsupported option type {tp!r}")


def _coerce_from(option: Option, value: Any, source: str, *, text: bool) -> Any:
    try:
        return coerce(option.type, value, text=text)
    except ValueError as exc:
        raise ValueError(f"{source}: option {option.name}={option.show(value)} {exc}") from None


# -- flags ---------------------------------------------------------------------------------------
def _metavar(tp: Any) -> str | None:
    """The choices of a Literal option; None (argparse's default, the option's name) for the others."""
    inner, _ = _split_optional(tp)
    if typing.get_origin(inner) is list:
        (inner,) = typing.get_args(inner)
    if typing.get_origin(inner) is Literal:
        return "{" + ",".join(map(str, typing.get_args(inner))) + "}"
    return None


def _flag_type(option: Option) -> Callable[[str], Any]:
    """argparse's `type=`: parses the flag's text as the option's type (argparse reports the error)."""
    tp = option.type
    inner, optional = _split_optional(tp)
    if typing.get_origin(inner) is list:
        tp = typing.get_args(inner)[0]

    def parse(raw: str) -> Any:
        try:
            return coerce(tp, raw, text=True)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{option.show(raw)} {exc}") from None

    parse.__name__ = option.name
    return parse


def add_flag(container: Any, option: Option, help: str = "", aliases: Sequence[str] = ()) -> None:
    """One flag for `option` on a parser, group or mutually exclusive group. Its default is None, which the
    loader reads as "not given": the lower layers fill it."""
    kwargs: dict[str, Any] = {"dest": option.name, "default": None, "help": help}
    inner, _ = _split_optional(option.type)
    if inner is bool:
        kwargs["action"] = argparse.BooleanOptionalAction
    else:
        kwargs["type"] = _flag_type(option)
        if (metavar := _metavar(option.type)) is not None:
            kwargs["metavar"] = metavar
        if typing.get_origin(inner) is list:
            kwargs["action"] = "append"
    container.add_argument(option.flag, *aliases, **kwargs)


def add_flags(container: Any, cls: type, help: Mapping[str, str] | None = None,
              aliases: Mapping[str, Sequence[str]] | None = None, skip: Sequence[str] = ()) -> None:
    """One flag per field of `cls` (except those in `skip`), in field order."""
    for name, option in options_of(cls).items():
        if name not in skip:
            add_flag(container, option, (help or {}).get(name, ""), (aliases or {}).get(name, ()))


def add_config_flag(container: Any, env_prefix: str = "HETERO_INFER_") -> None:
    container.add_argument("--config", metavar="FILE", default=None,
                           help=f"JSON or YAML file of options in snake_case (or ${env_prefix}CONFIG); "
                                "flags win over the environment, which wins over the file")


def flag_text(value: Any) -> str:
    """A value as flag text that reads back as the same value: floats as short as that allows (45.0 is "45")."""
    if isinstance(value, float):
        short = f"{value:g}"
        return short if float(short) == value else repr(value)
    return str(value)


def to_flags(classes: type | Sequence[type], values: Mapping[str, Any]) -> list[str]:
    """The flags that give a command parsing `classes`' options these `values` (option name -> value), in the
    order given; None is left out (the command's own layers and default then hold). `load_options` reads them
    back as the same values. KeyError names an option none of the classes has, ValueError a value of the wrong
    type or a secret, which must travel in the environment (from a Secret), never on a command line."""
    everything: dict[str, Option] = {}
    for cls in (classes,) if isinstance(classes, type) else classes:
        everything.update(options_of(cls))
    args: list[str] = []
    for name, value in values.items():
        if value is None:
            continue
        if name not in everything:
            raise KeyError(f"no option {name!r} in {', '.join(sorted(everything))}")
        option = everything[name]
        if option.secret:
            raise ValueError(f"option {name} is a secret: pass it in the environment, not as a flag")
        value = _coerce_from(option, list(value) if isinstance(value, tuple) else value, "to_flags", text=False)
        if isinstance(value, bool):
            args.append(option.flag if value else "--no-" + option.flag[2:])
        else:
            args += [arg for v in (value if isinstance(value, list) else [value]) for arg in _flag_value(option, v)]
    return args


def _flag_value(option: Option, value: Any) -> list[str]:
    text = flag_text(value)
    # argparse reads a separate "-1e-05" as a flag of its own; joined with "=" it is the value
    return [f"{option.flag}={text}"] if text.startswith("-") else [option.flag, text]


# -- layers --------------------------------------------------------------------------------------
def load_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a JSON or YAML config file into a dict of snake_case keys (dashes are accepted too)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"config file not found: {path}")
    text = path.read_text()
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"config file {path} is not valid JSON: {exc}") from None
    else:
        import yaml

        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise ValueError(f"config file {path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"config file {path} must hold a mapping of option names to values")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def _file_layer(path: str, options: Mapping[str, Option]) -> dict[str, tuple[Any, str]]:
    values = load_config_file(path)
    unknown = sorted(set(values) - set(options))
    if unknown:
        hints = [f"{u} (did you mean {close[0]}?)" if (close := difflib.get_close_matches(u, options, 1)) else u
                 for u in unknown]
        raise ValueError(f"config file {path}: unknown option(s): {', '.join(hints)}")
    source = f"config file {path}"
    return {k: (_coerce_from(options[k], v, source, text=False), source) for k, v in values.items()}


def _env_layer(environ: Mapping[str, str], prefix: str, options: Mapping[str, Option]) -> dict[str, tuple[Any, str]]:
    out = {}
    for name, option in options.items():
        key = prefix + name.upper()
        raw = environ.get(key, "")
        if raw != "":  # set but empty: not set
            source = f"environment variable {key}"
            out[name] = (_coerce_from(option, raw, source, text=True), source)
    return out


def environment_values(cls: type, environ: Mapping[str, str], env_prefix: str = "HETERO_INFER_") -> dict[str, Any]:
    """The options of `cls` that the environment sets, parsed (ValueError on a bad one)."""
    return {k: v for k, (v, _) in _env_layer(environ, env_prefix, options_of(cls)).items()}


def _flag_layer(args: argparse.Namespace, options: Mapping[str, Option]) -> dict[str, tuple[Any, str]]:
    out = {}
    for name, option in options.items():
        value = getattr(args, name, None)
        if value is not None:
            out[name] = (value, f"flag {option.flag}")
    return out


def load_options(classes: Sequence[type], args: argparse.Namespace, env_prefix: str = "HETERO_INFER_",
                 environ: Mapping[str, str] | None = None) -> list[Any]:
    """One instance of each class in `classes`, from flags (`args`) > environment (`env_prefix` + the option's
    name in capitals) > config file (`args.config` or the `<env_prefix>CONFIG` variable) > defaults. The
    classes' field names must not overlap (one config file and one environment hold them all)."""
    environ = os.environ if environ is None else environ
    per_class = [options_of(cls) for cls in classes]
    everything: dict[str, Option] = {}
    for options in per_class:
        clash = set(everything) & set(options)
        if clash:
            raise TypeError(f"option(s) {', '.join(sorted(clash))} defined twice")
        everything.update(options)

    layered: dict[str, tuple[Any, str]] = {}
    path = getattr(args, "config", None) or environ.get(env_prefix + "CONFIG")
    if path:
        layered.update(_file_layer(path, everything))
    layered.update(_env_layer(environ, env_prefix, everything))
    layered.update(_flag_layer(args, everything))

    out = []
    for cls, options in zip(classes, per_class):
        values = {k: v for k, (v, _) in layered.items() if k in options}
        try:
            out.append(cls(**values))
        except InvalidOption as exc:
            source = layered.get(exc.name, (None, DEFAULT_SOURCE))[1]
            raise ValueError(f"{exc} (from {source})") from None
    return out
