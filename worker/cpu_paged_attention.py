"""Paged decode attention for the CPU, in C: reads K/V straight from the block pool.

The PyTorch reference path must gather every sequence's blocks into a padded copy before
attention, which triples the KV bytes moved per step; on a CPU that copy costs as much as
the matmuls. This kernel walks the block table instead. It is compiled once with the
system C compiler into the cache folder and called through ctypes (no torch headers, so
the build takes about a second). Without a compiler, or with HETERO_INFER_CPU_KERNEL=0,
the engine keeps the PyTorch path.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import sysconfig
from pathlib import Path

import torch

log = logging.getLogger(__name__)

_SOURCE = (Path(__file__).parent / "cpu_paged_attention.c").read_text()

_lib: ctypes.CDLL | None = None
_tried = False


def _build() -> ctypes.CDLL | None:
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    cc = cc.split()[0]
    if shutil.which(cc) is None:
        cc = shutil.which("gcc") or shutil.which("cc") or ""
    if not cc:
        log.info("no C compiler found: CPU paged attention uses the PyTorch path")
        return None
    from hetero_infer.worker.model_loader import cache_dir

    digest = hashlib.sha256(_SOURCE.encode()).hexdigest()[:16]
    folder = cache_dir() / "cpu_kernels"
    lib_path = folder / f"paged_decode_{digest}.so"
    if not lib_path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        src = folder / f"paged_decode_{digest}.c"
        src.write_text(_SOURCE)
        tmp = lib_path.with_suffix(f".{os.getpid()}.tmp")
        cmd = [cc, "-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-shared", "-fPIC", str(src), "-o", str(tmp), "-lm"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            log.warning("building the CPU attention kernel failed, using the PyTorch path:\n%s", proc.stderr[-2000:])
            return None
        os.replace(tmp, lib_path)
    lib = ctypes.CDLL(str(lib_path))
    for name in ("paged_decode_f32", "paged_decode_bf16"):
        fn = getattr(lib, name)
        fn.restype = None
        fn.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int] * 6 + [ctypes.c_float]
    lib.paged_decode_variant.restype = ctypes.c_char_p
    lib.paged_decode_variant.argtypes = []
    return lib


def available() -> bool:
    global _lib, _tried
    if os.environ.get("HETERO_INFER_CPU_KERNEL", "1") == "0":
        return False
    if not _tried:
        _tried = True
        try:
            _lib = _build()
        except OSError as exc:
            log.warning("CPU attention kernel unavailable: %s", exc)
            _lib = None
    return _lib is not None


def variant() -> str:
    """Which implementation serves head dims 64 and 128 here: "avx512+bf16", "avx512" or "portable"."""
    assert _lib is not None, "call available() first"
    return _lib.paged_decode_variant().decode()


def supports(k_cache: torch.Tensor) -> bool:
    return k_cache.dtype in (torch.float32, torch.bfloat16)


def paged_decode(
    q: torch.Tensor,  # [B, H, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, KVH, D]
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    context_lens: torch.Tensor,  # [B] int32
    scale: float,
) -> torch.Tensor:
    assert _lib is not None, "call available() first"
    b, h, d = q.shape
    _, bs, kvh, _ = k_cache.shape
    qc = q.to(k_cache.dtype).contiguous()
    out = torch.empty_like(qc)
    tables = block_tables.contiguous()
    lens = context_lens.contiguous()
    fn = _lib.paged_decode_f32 if k_cache.dtype == torch.float32 else _lib.paged_decode_bf16
    fn(qc.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(), lens.data_ptr(), out.data_ptr(),
       b, h, kvh, d, bs, tables.shape[1], float(scale))
    return out.to(q.dtype)
