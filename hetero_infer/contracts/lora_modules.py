"""`--lora-modules`: the LoRA adapters a worker serves from its start, in vLLM's two forms.

    --lora-modules sql=/adapters/sql chat=hf://org/chat-lora
    --lora-modules '{"name": "sql", "path": "s3://bucket/sql", "base_model_name": "org/base"}'

A path is a local PEFT folder, `hf://ORG/NAME[@REVISION]` or `s3://BUCKET/PREFIX` (fetched through
hetero_infer/model_source.py into the model cache). Dependency-free: the option loader validates with it.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

# A served adapter name: what a request's `model` says. No spaces, commas (vllm:lora_requests_info's labels list
# names separated by commas) or quotes.
ADAPTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$")
ADAPTER_NAME_RULE = ("1 to 128 characters: letters, digits and . _ : / @ + -, starting with a letter or digit")


@dataclass(frozen=True)
class LoRAModulePath:
    """One adapter to serve (vLLM's `LoRAModulePath`)."""

    name: str
    path: str
    base_model_name: str | None = None


def check_adapter_name(name: object) -> str | None:
    """Why `name` cannot name an adapter; None when it can."""
    if not isinstance(name, str) or not ADAPTER_NAME.match(name):
        return f"an adapter name must be {ADAPTER_NAME_RULE} (got {name!r})"
    return None


def parse_lora_module(value: str | dict) -> LoRAModulePath:
    """One `--lora-modules` value: NAME=PATH, or a JSON object (its text, or the object itself) with name, path and
    optionally base_model_name; ValueError saying which form was expected."""
    text = json.dumps(value) if isinstance(value, dict) else value.strip()
    if isinstance(value, dict) or text.startswith("{"):
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"{text!r} is not valid JSON: {exc}") from None
        if not isinstance(data, dict) or set(data) - {"name", "path", "base_model_name"}:
            raise ValueError(f"{text!r}: the JSON form takes the keys name, path and base_model_name")
        name, path, base = data.get("name"), data.get("path"), data.get("base_model_name")
        if base is not None and (not isinstance(base, str) or not base):
            raise ValueError(f"{text!r}: base_model_name must be a non-empty string")
    else:
        name, sep, path = text.partition("=")
        base = None
        if not sep:
            raise ValueError(f"{text!r} is neither NAME=PATH nor a JSON object")
    if why := check_adapter_name(name):
        raise ValueError(f"{text!r}: {why}")
    if not isinstance(path, str) or not path.strip():
        raise ValueError(f"{text!r}: the adapter needs a path (a folder, hf://ORG/NAME or s3://BUCKET/PREFIX)")
    return LoRAModulePath(name, path.strip(), base)


def parse_lora_modules(values: Iterable[str | dict]) -> list[LoRAModulePath]:
    """Every `--lora-modules` value; ValueError for a bad one or a name given twice."""
    modules = [parse_lora_module(v) for v in values]
    seen: set[str] = set()
    for m in modules:
        if m.name in seen:
            raise ValueError(f"the adapter name {m.name!r} is given twice")
        seen.add(m.name)
    return modules


def read_lora_modules_file(path: str | os.PathLike[str]) -> list[LoRAModulePath]:
    """`--lora-modules-file`: a JSON list of `--lora-modules` values (strings or objects); a missing file lists
    none (a ConfigMap not written yet). ValueError for anything else that is not such a list."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return []
    try:
        data = json.loads(text) if text.strip() else []
    except ValueError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, list) or not all(isinstance(v, (str, dict)) for v in data):
        raise ValueError(f"{path} must hold a JSON list of NAME=PATH strings or {{name, path}} objects")
    return parse_lora_modules(data)
