"""The CPU kernels in `kernels/cpu/csrc/`, compiled once with the system C compiler and loaded through ctypes.

One shared library holds them all (paged attention, fused norm/rotary/activation, the bfloat16 and float32
GEMMs). It is built with `-march=native` into the cache folder, keyed by a digest of the sources, flags,
compiler and CPU features, so a change to any of them rebuilds it (about two seconds; no torch headers are needed). Its OpenMP
calls resolve to the libgomp torch has already loaded, so the kernels share torch's thread pool. Without a
C compiler, or with HETERO_INFER_CPU_KERNEL=0, `library()` is None and the engine keeps its PyTorch paths.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import math
import mmap
import os
import platform
import shutil
import subprocess
import sysconfig
from pathlib import Path

import torch

from hetero_infer.paths import cache_dir

log = logging.getLogger(__name__)

SOURCES = Path(__file__).parent / "csrc"
# -ffp-contract=off: a * b + c stays two roundings, as in PyTorch's elementwise ops (float32 outputs then
# match PyTorch's bit for bit where the same operations run in the same order).
FLAGS = ["-O3", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off", "-shared", "-fPIC"]


def _march() -> str:
    """-march for the build: the CPU it runs on, unless HETERO_INFER_CPU_MARCH names a target (e.g. x86-64-v2
    for a library that a cache folder shares between unlike machines; it also tests the portable paths)."""
    return "-march=" + os.environ.get("HETERO_INFER_CPU_MARCH", "native")

_lib: ctypes.CDLL | None = None
_tried = False
_functions: dict[str, object] = {}


def _compiler() -> str | None:
    cc = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        cc = shutil.which("gcc") or shutil.which("cc") or ""
    return cc or None


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return platform.processor()


def build_digest(cc: str | None = None) -> str:
    """A digest of everything the library's machine code depends on: compiler, flags, the CPU's feature flags
    (-march=native: a library built on one CPU may not run on another, and a cache folder can be shared
    between nodes) and the sources."""
    digest = hashlib.sha256()
    files = sorted(SOURCES.glob("*.[ch]"))
    for part in [cc or _compiler() or "", _march(), *FLAGS, _cpu_flags(), *(f.name + f.read_text() for f in files)]:
        digest.update(part.encode())
    return digest.hexdigest()[:16]


def cpu_model() -> str:
    """The CPU's model name as /proc/cpuinfo gives it (the platform's processor string elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        return platform.processor()


def cpu_flags() -> set[str]:
    """The CPU's feature flags (avx2, avx512f, avx512_bf16, amx_bf16, ...)."""
    line = _cpu_flags()
    return set(line.split(":", 1)[1].split()) if ":" in line else set(line.split())


def _build() -> ctypes.CDLL | None:
    cc = _compiler()
    if cc is None:
        log.info("no C compiler found: the engine uses its PyTorch paths on the CPU")
        return None
    files = sorted(SOURCES.glob("*.[ch]"))
    flags = [_march(), *FLAGS]
    folder = cache_dir() / "cpu_kernels"
    lib_path = folder / f"hetero_infer_cpu_{build_digest(cc)}.so"
    if not lib_path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        tmp = lib_path.with_suffix(f".{os.getpid()}.tmp")
        sources = [str(f) for f in files if f.suffix == ".c"]
        proc = subprocess.run([cc, *flags, f"-I{SOURCES}", *sources, "-o", str(tmp), "-lm"],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            log.warning("building the CPU kernels failed, using the PyTorch paths:\n%s", proc.stderr[-2000:])
            return None
        os.replace(tmp, lib_path)
    return ctypes.CDLL(str(lib_path))


def library() -> ctypes.CDLL | None:
    """The loaded kernel library, or None when disabled or unbuildable (the reason is logged once)."""
    global _lib, _tried
    if os.environ.get("HETERO_INFER_CPU_KERNEL", "1") == "0":
        return None
    if not _tried:
        _tried = True
        try:
            _lib = _build()
        except OSError as exc:
            log.warning("CPU kernels unavailable: %s", exc)
            _lib = None
    return _lib


def function(name: str, argtypes: list, restype=None):
    """A function of the library with its ctypes signature set, or None without the library."""
    fn = _functions.get(name)  # first: the ops call this on every use (a few hundred times per decode step)
    if fn is not None:
        return fn
    lib = library()
    if lib is None:
        return None
    fn = _functions[name] = getattr(lib, name)
    fn.argtypes, fn.restype = argtypes, restype
    return fn


def empty_huge_pages(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zeroed CPU tensor whose memory is backed by transparent huge pages where the kernel allows it.

    For large, randomly accessed buffers (the paged KV cache): with 4 KiB pages every KV block a decode step
    reads is another TLB miss once the step's weights have swept the TLB, which measured as much as the
    arithmetic itself. madvise(MADV_HUGEPAGE) must come before the pages are first touched.

    The memory is an anonymous mapping of its own: zero by the kernel's guarantee, and faulted in where it is
    first written rather than all at once here (faulting in a 1 GiB KV pool took 0.8-2.2 s on the 2-vCPU dev VM,
    most of a server's start-up, for blocks a short run never uses). The tensor keeps the mapping alive.
    """
    huge = 2 << 20
    itemsize = torch.empty((), dtype=dtype).element_size()
    nbytes = itemsize * math.prod(shape)
    if nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    length = nbytes + huge  # room to start on a 2 MiB boundary (the mapping itself is page aligned)
    mapping = mmap.mmap(-1, length, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    raw = torch.frombuffer(mapping, dtype=torch.uint8)
    offset = -raw.data_ptr() % huge
    if hasattr(mmap, "MADV_HUGEPAGE"):  # Linux
        try:
            mapping.madvise(mmap.MADV_HUGEPAGE, offset, length - offset)
        except OSError as e:
            log.debug("madvise(MADV_HUGEPAGE) failed: %s", e)
    return raw[offset : offset + nbytes].view(dtype).view(shape)
