"""The CPU kernels in `kernels/cpu/csrc/`, compiled once with the system C compiler and loaded through ctypes.

One shared library holds them all (paged attention, fused norm/rotary/activation, the bfloat16 and float32
GEMMs). It is built with `-march=native` (or the ISA level HETERO_INFER_CPU_ISA forces: `avx2` builds the
AVX2 + FMA kernels an AVX2-only CPU runs, on any CPU that has AVX2; `portable` the plain C ones) into the cache folder, keyed by a digest of the sources, flags,
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
import time
from pathlib import Path

import torch

from hetero_infer.paths import cache_dir

log = logging.getLogger(__name__)

SOURCES = Path(__file__).parent / "csrc"
# -ffp-contract=off: a * b + c stays two roundings, as in PyTorch's elementwise ops (float32 outputs then
# match PyTorch's bit for bit where the same operations run in the same order).
FLAGS = ["-O3", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off", "-shared", "-fPIC"]


# HETERO_INFER_CPU_ISA -> the -march of the build, and the CPU flags it needs (a library with instructions the
# CPU lacks dies of SIGILL at its first call, so such a request is refused)
ISA_LEVELS: dict[str, tuple[str, tuple[str, ...]]] = {
    "native": ("native", ()),
    "avx512": ("native", ("avx512f",)),
    "avx2": ("x86-64-v3", ("avx2", "fma")),  # AVX2 + FMA, no AVX-512: what an AVX2-only CPU builds natively
    "portable": ("x86-64-v2", ()),  # no AVX: the portable C paths
}


def isa_request() -> str:
    """The ISA level asked for: HETERO_INFER_CPU_ISA (native, avx512, avx2, portable), "native" when unset.
    ValueError for an unknown level or one this CPU cannot run."""
    level = os.environ.get("HETERO_INFER_CPU_ISA", "native").strip().lower() or "native"
    if level not in ISA_LEVELS:
        raise ValueError(f"HETERO_INFER_CPU_ISA={level!r}: expected one of {', '.join(ISA_LEVELS)}")
    missing = [flag for flag in ISA_LEVELS[level][1] if flag not in cpu_flags()]
    if missing and platform.machine() in ("x86_64", "AMD64"):
        raise ValueError(f"HETERO_INFER_CPU_ISA={level}: this CPU lacks {', '.join(missing)}")
    if level != "native" and platform.machine() not in ("x86_64", "AMD64"):
        raise ValueError(f"HETERO_INFER_CPU_ISA={level}: x86-64 levels, and this is {platform.machine()}")
    return level


def _march() -> str:
    """-march for the build: HETERO_INFER_CPU_MARCH where it names a target (e.g. x86-64-v2 for a library that a
    cache folder shares between unlike machines), else the level HETERO_INFER_CPU_ISA asks for (the CPU it runs
    on by default)."""
    march = os.environ.get("HETERO_INFER_CPU_MARCH")
    return "-march=" + (march or ISA_LEVELS[isa_request()][0])

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
    start = time.perf_counter()
    built = not lib_path.is_file()
    if built:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = lib_path.with_suffix(f".{os.getpid()}.tmp")
        sources = [str(f) for f in files if f.suffix == ".c"]
        proc = subprocess.run([cc, *flags, f"-I{SOURCES}", *sources, "-o", str(tmp), "-lm"],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            log.warning("building the CPU kernels failed, using the PyTorch paths:\n%s", proc.stderr[-2000:])
            return None
        os.replace(tmp, lib_path)
    lib = ctypes.CDLL(str(lib_path))
    level_fn = lib.kernels_isa
    level_fn.restype = ctypes.c_char_p
    log.info("CPU kernels: %s in %.2f s (%s, ISA level %s)", "built" if built else "loaded the cached build",
             time.perf_counter() - start, flags[0], level_fn().decode())
    return lib


def library() -> ctypes.CDLL | None:
    """The loaded kernel library, or None when disabled or unbuildable (the reason is logged once)."""
    global _lib, _tried
    if os.environ.get("HETERO_INFER_CPU_KERNEL", "1") == "0":
        return None
    if not _tried:
        try:
            _lib = _build()  # a bad HETERO_INFER_CPU_ISA raises its ValueError here, at every call
        except OSError as exc:
            log.warning("CPU kernels unavailable: %s", exc)
            _lib = None
        _tried = True
    return _lib


def level_reason() -> str:
    """Why the library has the ISA level it has: the target or level asked for, else the CPU's flags."""
    if os.environ.get("HETERO_INFER_CPU_MARCH"):
        return f"HETERO_INFER_CPU_MARCH={os.environ['HETERO_INFER_CPU_MARCH']} names its target"
    if isa_request() != "native":
        return f"HETERO_INFER_CPU_ISA={isa_request()} asks for it"
    flags = cpu_flags()
    has = [name for name, need in (("AVX-512F", {"avx512f"}), ("AVX512_BF16", {"avx512_bf16"}),
                                   ("AVX2 + FMA", {"avx2", "fma"})) if need <= flags]
    return f"this CPU ({cpu_model() or platform.machine()}) has {', '.join(has) if has else 'none of AVX-512 and AVX2 + FMA'}"


def isa() -> str:
    """The ISA level of the loaded library: "avx512+bf16", "avx512", "avx2", "portable"; "" without it."""
    fn = function("kernels_isa", [], ctypes.c_char_p)
    return fn().decode() if fn is not None else ""


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
