/* Fused elementwise ops of the decoder layer on the CPU, one pass over the data each, with PyTorch's
 * numerics: the same operations and roundings as the PyTorch expressions they replace (see cpu_ops.py),
 * float32 arithmetic, bfloat16 results rounded to nearest even at the points PyTorch rounds them.
 *
 *   add_rms_norm:  residual += x (optional); out = w * (residual * rsqrt(mean(residual^2) + eps))
 *   rope_and_cache: neox rotary embedding of q and k in place, then k and v written to their cache slots
 *   silu_and_mul:  out = silu(gate) * up over [gate | up] rows
 */
#include "simd.h"

#include <float.h>

/* threads only where the work is worth waking them for: `par` is set by each loop's caller */
#define PAR_ROWS _Pragma("omp parallel for schedule(static) if (par)")

static inline float rd_f32(float x) { return x; }
static inline float rd_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

/* ------------------------------------------------------------------ RMSNorm with residual add */

#define DEFINE_ADD_RMS_NORM(NAME, T, LOAD, STORE, ROUND)                                                \
void NAME(const T* x, T* residual, const T* w, T* out, int rows, int n, float eps) {                     \
    int par = (rows) >= 64;                                                                                       \
    PAR_ROWS for (int r = 0; r < rows; r++) {                                                                     \
        T* res = residual + (size_t)r * n;                                                               \
        T* o = out + (size_t)r * n;                                                                      \
        if (x) {                                                                                         \
            const T* xr = x + (size_t)r * n;                                                             \
            _Pragma("omp simd")                                                                          \
            for (int i = 0; i < n; i++) res[i] = STORE(ROUND(LOAD(res[i]) + LOAD(xr[i])));              \
        }                                                                                                \
        float ss = 0.f;                                                                                  \
        _Pragma("omp simd reduction(+:ss)")                                                              \
        for (int i = 0; i < n; i++) { float v = LOAD(res[i]); ss += v * v; }                            \
        float inv = 1.0f / sqrtf(ss / n + eps);                                                          \
        _Pragma("omp simd")                                                                              \
        for (int i = 0; i < n; i++) o[i] = STORE(LOAD(w[i]) * ROUND(LOAD(res[i]) * inv));                \
    }                                                                                                    \
}

#define ID(x) (x)
DEFINE_ADD_RMS_NORM(add_rms_norm_f32, float, ID, ID, rd_f32)
DEFINE_ADD_RMS_NORM(add_rms_norm_bf16, uint16_t, bf16_to_f32, f32_to_bf16, rd_bf16)

/* ------------------------------------------------------------------ rotary embedding + KV-cache write */

/* x' = x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1]; each product and the sum rounded as
   PyTorch rounds them. cos/sin rows are [D] (both halves), indexed by position. */
#define DEFINE_ROPE(NAME, T, LOAD, STORE, ROUND)                                                        \
static inline void NAME##_head(T* x, const T* cs, const T* sn, int D) {                                 \
    int half = D / 2;                                                                                    \
    float a[256], b[256];                                                                                \
    for (int i = 0; i < half; i++) { a[i] = LOAD(x[i]); b[i] = LOAD(x[i + half]); }                      \
    _Pragma("omp simd")                                                                                  \
    for (int i = 0; i < half; i++) {                                                                     \
        x[i] = STORE(ROUND(ROUND(a[i] * LOAD(cs[i])) + ROUND(-b[i] * LOAD(sn[i]))));                     \
        x[i + half] = STORE(ROUND(ROUND(b[i] * LOAD(cs[i + half])) + ROUND(a[i] * LOAD(sn[i + half])))); \
    }                                                                                                    \
}                                                                                                        \
void NAME(T* q, long q_stride, T* k, long k_stride, const T* v, long v_stride, const int64_t* positions, \
          const T* cos_t, const T* sin_t, T* k_cache, T* v_cache, const int64_t* slots, int tokens,      \
          int H, int KVH, int D) {                                                                       \
    int par = (tokens) >= 64;                                                                                     \
    PAR_ROWS for (int t = 0; t < tokens; t++) {                                                                   \
        const T* cs = cos_t + (size_t)positions[t] * D;                                                  \
        const T* sn = sin_t + (size_t)positions[t] * D;                                                  \
        for (int h = 0; h < H; h++) NAME##_head(q + t * q_stride + (size_t)h * D, cs, sn, D);            \
        for (int h = 0; h < KVH; h++) NAME##_head(k + t * k_stride + (size_t)h * D, cs, sn, D);          \
        if (slots[t] < 0) continue; /* padding row */                                                    \
        memcpy(k_cache + (size_t)slots[t] * KVH * D, k + t * k_stride, sizeof(T) * (size_t)KVH * D);     \
        memcpy(v_cache + (size_t)slots[t] * KVH * D, v + t * v_stride, sizeof(T) * (size_t)KVH * D);     \
    }                                                                                                    \
}

DEFINE_ROPE(rope_and_cache_f32, float, ID, ID, rd_f32)
DEFINE_ROPE(rope_and_cache_bf16, uint16_t, bf16_to_f32, f32_to_bf16, rd_bf16)

/* ------------------------------------------------------------------ SiLU and multiply */

/* silu(g) = g / (1 + exp(-g)), as PyTorch's vectorized CPU kernel computes it */
#if HAVE_AVX512
static inline __m512 silu512(__m512 g) {
    __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), g));
    return _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

/* one row's (or a column range's) silu(g) * u, n elements: the body of silu_and_mul_f32, which the fused
   decode step (decode_step.c) also runs on column ranges */
void silu_mul_span_f32(const float* g, const float* u, float* o, int n) {
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(o + i, _mm512_mul_ps(silu512(_mm512_loadu_ps(g + i)), _mm512_loadu_ps(u + i)));
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(o + i, m, _mm512_mul_ps(silu512(_mm512_maskz_loadu_ps(m, g + i)),
                                                      _mm512_maskz_loadu_ps(m, u + i)));
    }
}

void silu_and_mul_f32(const float* gu, float* out, int rows, int n) {
    int par = (rows * n / 256) >= 64;
    PAR_ROWS for (int r = 0; r < rows; r++)
        silu_mul_span_f32(gu + (size_t)r * 2 * n, gu + (size_t)r * 2 * n + n, out + (size_t)r * n, n);
}

static inline __m512 round_bf16x16(__m512 x) { /* float32 -> nearest bfloat16, kept as float32 */
    uint16_t tmp[16];
    store_bf16(tmp, x);
    return load_bf16x16(tmp);
}

/* one row's (or a column range's) silu(g) * u, n elements: the body of silu_and_mul_bf16, which the fused
   decode step (decode_step.c) also runs on column ranges */
void silu_mul_span_bf16(const uint16_t* g, const uint16_t* u, uint16_t* o, int n) {
    int i = 0;
    for (; i + 16 <= n; i += 16)
        store_bf16(o + i, _mm512_mul_ps(round_bf16x16(silu512(load_bf16x16(g + i))), load_bf16x16(u + i)));
    for (; i < n; i++) {
        float gv = bf16_to_f32(g[i]);
        o[i] = f32_to_bf16(rd_bf16(gv / (1.0f + expf(-gv))) * bf16_to_f32(u[i]));
    }
}

void silu_and_mul_bf16(const uint16_t* gu, uint16_t* out, int rows, int n) {
    int par = (rows * n / 256) >= 64;
    PAR_ROWS for (int r = 0; r < rows; r++)
        silu_mul_span_bf16(gu + (size_t)r * 2 * n, gu + (size_t)r * 2 * n + n, out + (size_t)r * n, n);
}
#else
#if HAVE_AVX2
static inline __m256 silu256(__m256 g) {
    __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), g));
    return _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

static inline __m256 round_bf16x8(__m256 x) { /* float32 -> nearest bfloat16, kept as float32 */
    return _mm256_castsi256_ps(_mm256_slli_epi32(bf16_bits8(x), 16));
}

/* 8 lanes of silu(g) * u; the bfloat16 one rounds silu(g) to bfloat16 first, as PyTorch does */
static inline __m256 silu_mul8_f32(const float* g, const float* u) {
    return _mm256_mul_ps(silu256(_mm256_loadu_ps(g)), _mm256_loadu_ps(u));
}
static inline __m256 silu_mul8_bf16(const uint16_t* g, const uint16_t* u) {
    return _mm256_mul_ps(round_bf16x8(silu256(load_bf16x8(g))), load_bf16x8(u));
}
static inline void store8_f32(float* o, __m256 v) { _mm256_storeu_ps(o, v); }
#define store8_bf16 store_bf16x8

/* one row's (or a column range's) silu(g) * u: the body of silu_and_mul, which the fused decode step
   (decode_step.c) also runs on column ranges; a tail of fewer than 8 goes through the same lanes */
#define DEFINE_SPAN(S, T)                                                                                \
void silu_mul_span_##S(const T* g, const T* u, T* o, int n) {                                            \
    int i = 0;                                                                                           \
    for (; i + 8 <= n; i += 8) store8_##S(o + i, silu_mul8_##S(g + i, u + i));                          \
    if (i < n) {                                                                                         \
        T tg[8] = {0}, tu[8] = {0}, to[8];                                                               \
        memcpy(tg, g + i, sizeof(T) * (size_t)(n - i));                                                  \
        memcpy(tu, u + i, sizeof(T) * (size_t)(n - i));                                                  \
        store8_##S(to, silu_mul8_##S(tg, tu));                                                           \
        memcpy(o + i, to, sizeof(T) * (size_t)(n - i));                                                  \
    }                                                                                                    \
}
#else
/* portable: silu(g) = g / (1 + exp(-g)), rounded as PyTorch rounds it */
#define DEFINE_SPAN(S, T)                                                                                \
void silu_mul_span_##S(const T* g, const T* u, T* o, int n) {                                            \
    for (int i = 0; i < n; i++) {                                                                        \
        float gv = LOAD_##S(g[i]);                                                                       \
        o[i] = STORE_##S(rd_##S(gv / (1.0f + expf(-gv))) * LOAD_##S(u[i]));                              \
    }                                                                                                    \
}
#define LOAD_f32(x) (x)
#define STORE_f32(x) (x)
#define LOAD_bf16 bf16_to_f32
#define STORE_bf16 f32_to_bf16
#endif

#define DEFINE_SILU(S, T)                                                                                \
DEFINE_SPAN(S, T)                                                                                        \
void silu_and_mul_##S(const T* gu, T* out, int rows, int n) {                                            \
    int par = (rows * n / 256) >= 64;                                                                    \
    PAR_ROWS for (int r = 0; r < rows; r++)                                                              \
        silu_mul_span_##S(gu + (size_t)r * 2 * n, gu + (size_t)r * 2 * n + n, out + (size_t)r * n, n);   \
}
DEFINE_SILU(f32, float)
DEFINE_SILU(bf16, uint16_t)
#endif

