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

import torch

log = logging.getLogger(__name__)

_SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline float load_f32(const void* p, size_t i) { return ((const float*)p)[i]; }
static inline float load_bf16(const void* p, size_t i) {
    union { uint32_t u; float f; } v;
    v.u = ((uint32_t)((const uint16_t*)p)[i]) << 16;
    return v.f;
}

/* One sequence per iteration; each cached token's K (then V) row of all KV heads is read once,
   contiguously, so the hardware prefetcher sees a plain stream per block. */
#define DEFINE_DECODE(NAME, LOAD)                                                              \
void NAME(const float* q, const void* kc, const void* vc, const int32_t* tables,              \
          const int32_t* lens, float* out, int B, int H, int KVH, int D, int bs,               \
          int max_blocks, float scale) {                                                       \
    int g = H / KVH;                                                                           \
    int row = KVH * D;                                                                         \
    _Pragma("omp parallel for schedule(static)")                                               \
    for (int b = 0; b < B; b++) {                                                              \
        int len = lens[b];                                                                     \
        float* s = (float*)malloc(sizeof(float) * ((size_t)H * len + row));                    \
        float* buf = s + (size_t)H * len;                                                      \
        const float* qb = q + (size_t)b * H * D;                                               \
        const int32_t* table = tables + (size_t)b * max_blocks;                                \
        for (int p0 = 0; p0 < len; p0 += bs) {                                                 \
            int n = len - p0 < bs ? len - p0 : bs;                                             \
            size_t block = (size_t)table[p0 / bs] * bs * row;                                  \
            for (int t = 0; t < n; t++) {                                                      \
                size_t base = block + (size_t)t * row;                                         \
                _Pragma("omp simd")                                                            \
                for (int i = 0; i < row; i++) buf[i] = LOAD(kc, base + i);                     \
                for (int h = 0; h < H; h++) {                                                  \
                    const float* qq = qb + (size_t)h * D;                                      \
                    const float* kk = buf + (size_t)(h / g) * D;                               \
                    float acc = 0.f;                                                           \
                    _Pragma("omp simd reduction(+:acc)")                                       \
                    for (int d = 0; d < D; d++) acc += qq[d] * kk[d];                          \
                    s[(size_t)h * len + p0 + t] = acc * scale;                                 \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
        for (int h = 0; h < H; h++) {                                                          \
            float* sh = s + (size_t)h * len;                                                   \
            float m = -INFINITY;                                                               \
            _Pragma("omp simd reduction(max:m)")                                               \
            for (int p = 0; p < len; p++) m = sh[p] > m ? sh[p] : m;                           \
            float sum = 0.f;                                                                   \
            _Pragma("omp simd reduction(+:sum)")                                               \
            for (int p = 0; p < len; p++) { sh[p] = expf(sh[p] - m); sum += sh[p]; }           \
            float inv = 1.f / sum;                                                             \
            for (int p = 0; p < len; p++) sh[p] *= inv;                                        \
        }                                                                                      \
        float* ob = out + (size_t)b * H * D;                                                   \
        memset(ob, 0, sizeof(float) * (size_t)H * D);                                          \
        for (int p0 = 0; p0 < len; p0 += bs) {                                                 \
            int n = len - p0 < bs ? len - p0 : bs;                                             \
            size_t block = (size_t)table[p0 / bs] * bs * row;                                  \
            for (int t = 0; t < n; t++) {                                                      \
                size_t base = block + (size_t)t * row;                                         \
                _Pragma("omp simd")                                                            \
                for (int i = 0; i < row; i++) buf[i] = LOAD(vc, base + i);                     \
                for (int h = 0; h < H; h++) {                                                  \
                    float w = s[(size_t)h * len + p0 + t];                                     \
                    const float* vv = buf + (size_t)(h / g) * D;                               \
                    float* oo = ob + (size_t)h * D;                                            \
                    _Pragma("omp simd")                                                        \
                    for (int d = 0; d < D; d++) oo[d] += w * vv[d];                            \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
        free(s);                                                                               \
    }                                                                                          \
}

DEFINE_DECODE(paged_decode_f32, load_f32)
DEFINE_DECODE(paged_decode_bf16, load_bf16)
"""

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
    qf = q.float().contiguous()
    out = torch.empty_like(qf)
    tables = block_tables.contiguous()
    lens = context_lens.contiguous()
    fn = _lib.paged_decode_f32 if k_cache.dtype == torch.float32 else _lib.paged_decode_bf16
    fn(qf.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(), lens.data_ptr(), out.data_ptr(),
       b, h, kvh, d, bs, tables.shape[1], float(scale))
    return out.to(q.dtype)
