"""Backend selection and argument checking shared by every public kernel.

A public function in :mod:`hetero_infer.kernels` runs either its Triton kernel or the
plain-PyTorch reference in :mod:`hetero_infer.kernels.reference`. The choice:

* ``"auto"`` (default): Triton when the tensors are on a CUDA device and Triton imports,
  otherwise the reference.
* ``"triton"``: always Triton. CPU tensors then need Triton's interpreter
  (``TRITON_INTERPRET=1`` in the environment before the first kernel is used); this is
  how the tests run the kernels on machines without a GPU.
* ``"reference"``: always the PyTorch reference.

Set it with the environment variable ``HETERO_INFER_KERNELS`` (read at import),
:func:`set_backend`, or temporarily with the :func:`use_backend` context manager.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
from collections.abc import Iterator, Sequence
from typing import Any

import torch

BACKENDS = ("auto", "triton", "reference")
ENV_VAR = "HETERO_INFER_KERNELS"

#: Floating-point dtypes the kernels accept for activations and the KV cache.
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _parse(name: str) -> str:
    value = (name or "auto").strip().lower()
    if value not in BACKENDS:
        raise ValueError(f"unknown kernel backend {name!r}; expected one of {', '.join(BACKENDS)}")
    return value


_backend: str = _parse(os.environ.get(ENV_VAR, "auto"))


def get_backend() -> str:
    """The backend in force: ``"auto"``, ``"triton"`` or ``"reference"``."""
    return _backend


def set_backend(name: str) -> None:
    """Select the backend for every later call (see the module docstring)."""
    global _backend
    _backend = _parse(name)


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Context manager that selects a backend and restores the previous one on exit."""
    global _backend
    previous = _backend
    _backend = _parse(name)
    try:
        yield
    finally:
        _backend = previous


@functools.lru_cache(maxsize=1)
def triton_available() -> bool:
    """True when Triton can be imported."""
    try:
        importlib.import_module("triton")
        importlib.import_module("triton.language")
    except Exception:  # pragma: no cover - depends on the installation
        return False
    return True


def interpret_mode() -> bool:
    """True when Triton's CPU interpreter is switched on (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on")


def use_triton(*tensors: torch.Tensor | None) -> bool:
    """Decide whether a call on ``tensors`` runs the Triton kernel.

    Raises RuntimeError when the backend is forced to ``"triton"`` but cannot run here.
    """
    if _backend == "reference":
        return False
    on_cuda = all(t.is_cuda for t in tensors if t is not None)
    if _backend == "auto":
        return on_cuda and triton_available()
    # forced triton
    if not triton_available():
        raise RuntimeError(f"{ENV_VAR}=triton but Triton is not installed")
    if not on_cuda and not interpret_mode():
        raise RuntimeError(
            f"{ENV_VAR}=triton with CPU tensors needs Triton's interpreter: set TRITON_INTERPRET=1 "
            "in the environment before the first kernel call"
        )
    return True


# --------------------------------------------------------------------------- checks


def check_tensor(
    name: str,
    t: Any,
    *,
    ndim: int | Sequence[int] | None = None,
    dtypes: Sequence[torch.dtype] | None = None,
    last_contiguous: bool = False,
) -> torch.Tensor:
    """Validate one argument; raises TypeError / ValueError with the argument's name."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if t.dim() not in allowed:
            want = " or ".join(str(a) for a in allowed)
            raise ValueError(f"{name} must have {want} dimensions, got shape {tuple(t.shape)}")
    if dtypes is not None and t.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} has dtype {str(t.dtype).replace('torch.', '')}; supported: {names}")
    if last_contiguous and t.dim() > 0 and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dimension (stride {t.stride(-1)})")
    return t


def check_same_device(**tensors: torch.Tensor | None) -> torch.device:
    devices = {name: t.device for name, t in tensors.items() if t is not None}
    first = next(iter(devices.values()))
    for dev in devices.values():
        if dev != first:
            detail = ", ".join(f"{n} on {d}" for n, d in devices.items())
            raise ValueError(f"all tensors must be on one device; got {detail}")
    return first


def check_out(
    out: torch.Tensor | None, shape: Sequence[int], dtype: torch.dtype, device: torch.device, name: str = "out"
) -> None:
    if out is None:
        return
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None")
    if tuple(out.shape) != tuple(shape) or out.dtype != dtype or out.device != device:
        raise ValueError(
            f"{name} must have shape {tuple(shape)}, dtype {dtype} and device {device}; "
            f"got {tuple(out.shape)}, {out.dtype}, {out.device}"
        )
    if out.dim() > 0 and out.shape[-1] > 1 and out.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dimension")


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


@functools.lru_cache(maxsize=16)
def sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def compiled(device: torch.device) -> bool:
    """True when kernels for ``device`` are compiled for a GPU, False under the interpreter.

    The Triton wrappers pick tile sizes with this (small tiles in the interpreter so that
    small test shapes still cover several tiles, partitions and K-splits) and use exact
    float32 dots in the interpreter (its bf16 dot is wrong in Triton 3.9).
    """
    return device.type == "cuda"


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of ``device``; a nominal 8 on the CPU (interpreter)."""
    if device.type == "cuda":
        return sm_count(device.index if device.index is not None else torch.cuda.current_device())
    return 8


#: The modules that define this package's Triton kernels.
TRITON_MODULES = ("_triton_attention", "_triton_ops", "_triton_fused", "_triton_quant", "_triton_moe", "_triton_lora")


def triton_compiles() -> dict[str, int]:
    """Compiled variants of each of this package's Triton kernels, all devices together ({} in the interpreter or
    without Triton). Triton compiles a kernel once per specialisation of its arguments (constexprs, integers equal
    to 1 or divisible by 16, 16-byte aligned pointers), so a count that grows while serving is a compile some
    request waited for: the kernels' ``do_not_specialize`` lists keep per-step sizes out of the key."""
    if not triton_available() or interpret_mode():
        return {}
    counts: dict[str, int] = {}
    for module_name in TRITON_MODULES:
        module = importlib.import_module(f"{__package__}.{module_name}")
        for name, obj in vars(module).items():
            caches = getattr(obj, "device_caches", None)
            if isinstance(caches, dict):  # JITFunction: per device (kernel cache, ...), Triton 3.2 to 3.9
                n = sum(len(c[0]) for c in caches.values() if isinstance(c, tuple) and isinstance(c[0], dict))
                if n:
                    counts[name] = n
    return counts
