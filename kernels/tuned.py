"""Per-device tuned launch configs of the Triton kernels, the way vLLM ships its fused-MoE configs.

A table is a JSON file per device, named after ``torch.cuda.get_device_name`` (``NVIDIA H100 80GB HBM3`` ->
``NVIDIA_H100_80GB_HBM3.json``), shipped as package data in ``kernels/configs/``; or the file named by
``HETERO_INFER_KERNEL_CONFIGS`` (a tuning run's output before it is committed; it must name the same device),
which takes precedence over the shipped one; ``HETERO_INFER_KERNEL_CONFIGS=none`` switches tables off (today's
built-in configs, for an A/B). Format (``benchmarks/tune_kernels.py`` writes it)::

    {"device": "NVIDIA H100 80GB HBM3", "triton": "3.6.0",
     "kernels": {"decode": {"d128-g2-bfloat16-p16": {"1": {"BLOCK_N": 64, "num_warps": 4, "num_stages": 3,
                                                           "MIN_PARTITION": 512},
                                                     "64": {...}}},
                 "prefill": {"d128-g2-bfloat16-p16": {"2048": {"BLOCK_M": 128, ...}}}}}

An entry is found by the kernel's name, its shape key (head dim, GQA group, dtype, page size) and the size
nearest on a log scale to the call's (decode: the batch; prefill: the query tokens). Entries are partial
overrides of the built-in config: known keys are checked (positive ints; tile sizes and warps powers of two),
unknown keys pass through to the kernel wrapper. A malformed file raises :class:`KernelConfigError` naming it,
on first use; lookups are cached, so a step costs one dictionary hit.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
from pathlib import Path

import torch

ENV_VAR = "HETERO_INFER_KERNEL_CONFIGS"
CONFIG_DIR = Path(__file__).resolve().parent / "configs"
KERNELS = ("decode", "prefill")
_POW2_KEYS = ("BLOCK_M", "BLOCK_N", "num_warps")
_INT_KEYS = (*_POW2_KEYS, "num_stages", "MIN_PARTITION", "TARGET_PROGRAMS", "MAX_SPLITS")


class KernelConfigError(ValueError):
    """A tuned-config table that cannot be used (bad JSON, bad shape, bad value, another device's)."""


def device_file_name(device_name: str) -> str:
    """The table's file name for a device name: anything but letters and digits becomes ``_``."""
    return re.sub(r"[^A-Za-z0-9]+", "_", device_name).strip("_") + ".json"


def shape_key(head_dim: int, group: int, dtype: torch.dtype, page: int) -> str:
    return f"d{head_dim}-g{group}-{str(dtype).removeprefix('torch.')}-p{page}"


def validate(table: object, source: str) -> dict:
    """``table`` checked against the format above; returns it. Errors name ``source`` and the entry."""

    def bad(where: str, why: str) -> KernelConfigError:
        return KernelConfigError(f"kernel config table {source}: {where}: {why}")

    if not isinstance(table, dict) or not isinstance(table.get("kernels"), dict):
        raise bad("top level", 'must be an object with a "kernels" object')
    if "device" in table and not isinstance(table["device"], str):
        raise bad("device", "must be a string")
    for kernel, shapes in table["kernels"].items():
        if kernel not in KERNELS:
            raise bad(f"kernels.{kernel}", f"unknown kernel (known: {', '.join(KERNELS)})")
        if not isinstance(shapes, dict):
            raise bad(f"kernels.{kernel}", "must map shape keys to objects")
        for key, sizes in shapes.items():
            if not isinstance(sizes, dict) or not sizes:
                raise bad(f"kernels.{kernel}.{key}", "must map sizes to configs")
            for size, cfg in sizes.items():
                where = f"kernels.{kernel}.{key}.{size}"
                if not (isinstance(size, str) and size.isdigit() and int(size) > 0):
                    raise bad(where, "a size must be a positive integer (batch or query tokens)")
                if not isinstance(cfg, dict):
                    raise bad(where, "a config must be an object")
                for name in _INT_KEYS:
                    if name not in cfg:
                        continue
                    v = cfg[name]
                    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                        raise bad(f"{where}.{name}", f"must be a positive integer, not {v!r}")
                    if name in _POW2_KEYS and v & (v - 1):
                        raise bad(f"{where}.{name}", f"must be a power of two, not {v}")
    return table


def load_file(path: Path) -> dict:
    try:
        text = path.read_text()
    except OSError as exc:
        raise KernelConfigError(f"kernel config table {path}: cannot read it: {exc}") from exc
    try:
        table = json.loads(text)
    except json.JSONDecodeError as exc:
        raise KernelConfigError(f"kernel config table {path}: not valid JSON: {exc}") from exc
    return validate(table, str(path))


@functools.lru_cache(maxsize=8)
def _tables(device_name: str) -> tuple[dict, ...]:
    """The tables that apply to ``device_name``, most specific first (the environment's, then the shipped)."""
    env_value = os.environ.get(ENV_VAR)
    if env_value is not None and env_value.strip().lower() == "none":
        return ()
    tables = []
    if env_value:
        path = Path(env_value)
        table = load_file(path)
        named = table.get("device")
        if named is not None and device_file_name(named) != device_file_name(device_name):
            raise KernelConfigError(f"kernel config table {path} (from {ENV_VAR}) was tuned on {named!r}, "
                                    f"not this device ({device_name!r}); unset {ENV_VAR} or tune here")
        tables.append(table)
    shipped = CONFIG_DIR / device_file_name(device_name)
    if shipped.is_file():
        tables.append(load_file(shipped))
    return tuple(tables)


def nearest(sizes: list[int], size: int) -> int:
    """The size closest to ``size`` on a log scale (ties: the smaller)."""
    target = math.log2(max(size, 1))
    return min(sorted(sizes), key=lambda s: abs(math.log2(s) - target))


def find(tables: tuple[dict, ...], kernel: str, key: str, size: int) -> dict | None:
    """The entry of the first table that has ``kernel`` at ``key``, at the size nearest ``size``."""
    for table in tables:
        sizes = table["kernels"].get(kernel, {}).get(key)
        if sizes:
            return sizes[str(nearest([int(s) for s in sizes], size))]
    return None


@functools.lru_cache(maxsize=8192)  # the decode workspace is sized over batches 1..1024
def lookup(kernel: str, key: str, size: int, device: torch.device) -> dict | None:
    """The tuned entry for ``kernel`` at ``key`` nearest ``size`` on ``device`` (a CUDA device), or None.

    Cached: the environment and the files are read on the first lookup (``clear_cache`` to re-read). The
    returned dict is shared: copy it before changing it. None without a CUDA device to name (the ahead-of-time
    compile check builds the GPU kernels on a machine that has none: they get the defaults)."""
    name = device_name(device)
    return None if name is None else find(_tables(name), kernel, key, int(size))


def device_name(device: torch.device) -> str | None:
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name(device.index if device.index is not None else torch.cuda.current_device())


def clear_cache() -> None:
    """Forget loaded tables and lookups (tests; a tuning run that rewrites the file it reads)."""
    _tables.cache_clear()
    lookup.cache_clear()
