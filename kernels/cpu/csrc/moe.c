/* The expert MLPs of a Mixture-of-Experts layer for the few tokens of a decode step, float32 or bfloat16, in one
 * C call and one OpenMP parallel region (kernels/cpu/moe.py; the layer's routing stays in PyTorch):
 *
 *   (token, expert) pairs sorted by expert -> gate|up rows of every expert hit, each dotted with its tokens ->
 *   silu(gate) * up -> down rows of every expert hit -> each token's outputs weighted and summed
 *
 * Why: at a decode step's few tokens every expert hit has one or two of them, so each product is a GEMV whose
 * cost is its weight stream; the grouped GEMM (torch's grouped_mm, kernels/moe.py) pays a GEMM call and its
 * thread fork/join per expert, plus ~10 PyTorch ops of glue per layer. Here each weight row is read once, from
 * the stacked layout transformers keeps ([E, 2I, H] gate|up, [E, H, I] down; no packing, no copy), and dotted
 * with each of its expert's tokens while it sits in L1.
 *
 * Numerics: kernels/moe.py's contract (and its grouped path's order): products accumulate in float32; the
 * gate|up product, the activation (ops.c's silu_mul_span) and the down product are rounded to the dtype; a
 * token's weighted sum is float32 over its experts in ascending expert order, rounded once.
 *
 * Work split: phases separated by barriers; the products by (expert hit, 16 weight rows) units handed out in
 * contiguous shares, the activation by pairs, the sum by (token, 64 columns). */
#include "simd.h"

#include <omp.h>

void silu_mul_span_f32(const float* g, const float* u, float* o, int n);
void silu_mul_span_bf16(const uint16_t* g, const uint16_t* u, uint16_t* o, int n);

#define MOE_ROWS 16 /* weight rows a work unit */
#define MOE_COLS 64 /* output columns a unit of the weighted sum */

/* float32 dot products of a weight row (float32 or bfloat16: LOADW widens VEC lanes of it) with a float32 vector,
   two accumulators wide */
#define DEFINE_DOT(NAME, T, V, VEC, ZERO, FMA, LOADX, LOADW, HSUM, SCALAR)                                         \
static inline float NAME(const T* w, const float* x, int n) {                                                     \
    V a = ZERO(), b = ZERO();                                                                                     \
    int i = 0;                                                                                                    \
    for (; i + 2 * VEC <= n; i += 2 * VEC) {                                                                      \
        a = FMA(LOADW(w + i), LOADX(x + i), a);                                                                   \
        b = FMA(LOADW(w + i + VEC), LOADX(x + i + VEC), b);                                                       \
    }                                                                                                             \
    for (; i + VEC <= n; i += VEC) a = FMA(LOADW(w + i), LOADX(x + i), a);                                        \
    float s = HSUM(a, b);                                                                                         \
    for (; i < n; i++) s += SCALAR(w[i]) * x[i];                                                                  \
    return s;                                                                                                     \
}
static inline float moe_id(float x) { return x; }
#if HAVE_AVX512
static inline float hsum(__m512 a, __m512 b) { return _mm512_reduce_add_ps(_mm512_add_ps(a, b)); }
DEFINE_DOT(dot_w_f32, float, __m512, 16, _mm512_setzero_ps, _mm512_fmadd_ps, _mm512_loadu_ps, _mm512_loadu_ps, hsum,
           moe_id)
DEFINE_DOT(dot_w_bf16, uint16_t, __m512, 16, _mm512_setzero_ps, _mm512_fmadd_ps, _mm512_loadu_ps, load_bf16x16, hsum,
           bf16_to_f32)
#elif HAVE_AVX2_FMA
static inline float hsum(__m256 a, __m256 b) {
    __m256 s = _mm256_add_ps(a, b);
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    q = _mm_add_ss(q, _mm_movehdup_ps(q));
    return _mm_cvtss_f32(q);
}
DEFINE_DOT(dot_w_f32, float, __m256, 8, _mm256_setzero_ps, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_loadu_ps, hsum,
           moe_id)
DEFINE_DOT(dot_w_bf16, uint16_t, __m256, 8, _mm256_setzero_ps, _mm256_fmadd_ps, _mm256_loadu_ps, load_bf16x8, hsum,
           bf16_to_f32)
#else
#define DEFINE_PORTABLE_DOT(NAME, T, SCALAR)                                                                       \
static inline float NAME(const T* w, const float* x, int n) {                                                     \
    float s = 0.f;                                                                                                \
    _Pragma("omp simd reduction(+:s)")                                                                            \
    for (int i = 0; i < n; i++) s += SCALAR(w[i]) * x[i];                                                         \
    return s;                                                                                                     \
}
DEFINE_PORTABLE_DOT(dot_w_f32, float, moe_id)
DEFINE_PORTABLE_DOT(dot_w_bf16, uint16_t, bf16_to_f32)
#endif

static inline float moe_ld_f32(float x) { return x; }
static inline float moe_st_f32(float x) { return x; }
static inline float moe_rd_f32(float x) { return x; }
static inline float moe_ld_bf16(uint16_t x) { return bf16_to_f32(x); }
static inline uint16_t moe_st_bf16(float x) { return f32_to_bf16(x); }
static inline float moe_rd_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

static inline size_t moe_align64(size_t bytes) { return (bytes + 63) & ~(size_t)63; }

static inline void moe_share(int total, int tid, int nt, int* lo, int* hi) {
    *lo = (int)((long)total * tid / nt);
    *hi = (int)((long)total * (tid + 1) / nt);
}

/* rows [r0, r1) of expert e's [rows, K] weights, each dotted with the K-vectors of the expert's sorted pairs
   [p0, p1) (`src` + `vec_of[p]` * K; vec_of NULL: the pair's own, `src` + p * K), the results rounded to the dtype into dst[p * rows + r] (float32) */
#define DEFINE_PRODUCT(S, T)                                                                                   \
static void moe_rows_##S(const T* w, int rows, int K, int e, int r0, int r1, const float* src,                  \
                         const int* vec_of, int p0, int p1, float* dst) {                                       \
    for (int r = r0; r < r1; r++) {                                                                             \
        const T* row = w + ((size_t)e * rows + r) * K;                                                          \
        for (int p = p0; p < p1; p++)                                                                           \
            dst[(size_t)p * rows + r] = moe_rd_##S(dot_w_##S(row, src + (size_t)(vec_of ? vec_of[p] : p) * K, K)); \
    }                                                                                                           \
}

/* x [Tn, H]; w1 [E, 2I, H]; w2 [E, H, I]; ids int32 [Tn, k] in [0, E); weights float32 [Tn, k]; out [Tn, H].
   scratch: the caller's buffer of scratch_bytes, kept between calls. Returns 0; the bytes of scratch needed
   when scratch_bytes is fewer (nothing computed: call again with a larger buffer). */
#define DEFINE_MOE(S, T)                                                                                        \
DEFINE_PRODUCT(S, T)                                                                                            \
long moe_experts_##S(const T* x, int Tn, int H, const T* w1, const T* w2, int E, int I, const int32_t* ids,    \
                     const float* weights, int k, T* out, void* scratch, long scratch_bytes) {                   \
    const int P = Tn * k, two = 2 * I;                                                                          \
    const size_t need = moe_align64(sizeof(int) * ((size_t)3 * P + 3 * (size_t)E + 1))                          \
                        + moe_align64(sizeof(float) * (size_t)Tn * H) + moe_align64(sizeof(float) * (size_t)P * two) \
                        + moe_align64(sizeof(T) * (size_t)P * I) + moe_align64(sizeof(float) * (size_t)P * I)     \
                        + moe_align64(sizeof(float) * (size_t)P * H);                                             \
    if ((size_t)scratch_bytes < need) return (long)need;                                                        \
    char* at = (char*)scratch;                                                                                  \
    int *order = (int*)at, *token = order + P, *pos = token + P, *start = pos + P, *hit = start + E + 1, *next = hit + E;          \
    at += moe_align64(sizeof(int) * ((size_t)3 * P + 3 * (size_t)E + 1));                                       \
    float* xf = (float*)at; at += moe_align64(sizeof(float) * (size_t)Tn * H);                                  \
    float* gu = (float*)at; at += moe_align64(sizeof(float) * (size_t)P * two);                                 \
    T* act = (T*)at; at += moe_align64(sizeof(T) * (size_t)P * I);                                              \
    float* af = (float*)at; at += moe_align64(sizeof(float) * (size_t)P * I);                                   \
    float* y = (float*)at;                                                                                      \
    /* pairs sorted by expert, stable (a counting sort): order[q] = pair t * k + j; pos[pair] = q */             \
    memset(start, 0, sizeof(int) * (size_t)(E + 1));                                                            \
    for (int p = 0; p < P; p++) start[ids[p] + 1]++;                                                            \
    int nhit = 0;                                                                                               \
    for (int e = 0; e < E; e++) {                                                                               \
        if (start[e + 1]) hit[nhit++] = e;                                                                      \
        start[e + 1] += start[e];                                                                               \
    }                                                                                                           \
    memcpy(next, start, sizeof(int) * (size_t)E);                                                               \
    for (int p = 0; p < P; p++) order[next[ids[p]]++] = p;                                                      \
    for (int q = 0; q < P; q++) {                                                                               \
        pos[order[q]] = q;                                                                                      \
        token[q] = order[q] / k;                                                                                \
    }                                                                                                           \
    for (size_t i = 0; i < (size_t)Tn * H; i++) xf[i] = moe_ld_##S(x[i]);                                       \
    const int units1 = (two + MOE_ROWS - 1) / MOE_ROWS, units2 = (H + MOE_ROWS - 1) / MOE_ROWS;                 \
    const int col_units = (H + MOE_COLS - 1) / MOE_COLS;                                                        \
    _Pragma("omp parallel")                                                                                     \
    {                                                                                                           \
        const int tid = omp_get_thread_num(), nt = omp_get_num_threads();                                       \
        int lo, hi;                                                                                             \
        moe_share(nhit * units1, tid, nt, &lo, &hi);                                                            \
        for (int u = lo; u < hi; u++) {                                                                         \
            int e = hit[u / units1], r0 = (u % units1) * MOE_ROWS, r1 = r0 + MOE_ROWS < two ? r0 + MOE_ROWS : two; \
            moe_rows_##S(w1, two, H, e, r0, r1, xf, token, start[e], start[e + 1], gu);                         \
        }                                                                                                       \
        _Pragma("omp barrier")                                                                                  \
        moe_share(P, tid, nt, &lo, &hi);                                                                        \
        for (int q = lo; q < hi; q++) {                                                                         \
            T g[two > 0 ? 1 : 1];                                                                               \
            (void)g;                                                                                            \
            T* a = act + (size_t)q * I;                                                                         \
            const float* h = gu + (size_t)q * two;                                                              \
            for (int c = 0; c < I; c += MOE_COLS) { /* the rounded products back in the dtype, then silu * up */ \
                int n = c + MOE_COLS < I ? MOE_COLS : I - c;                                                    \
                T gt[MOE_COLS], ut[MOE_COLS];                                                                   \
                for (int i = 0; i < n; i++) {                                                                   \
                    gt[i] = moe_st_##S(h[c + i]);                                                               \
                    ut[i] = moe_st_##S(h[I + c + i]);                                                           \
                }                                                                                               \
                silu_mul_span_##S(gt, ut, a + c, n);                                                            \
            }                                                                                                   \
            for (int i = 0; i < I; i++) af[(size_t)q * I + i] = moe_ld_##S(a[i]);                               \
        }                                                                                                       \
        _Pragma("omp barrier")                                                                                  \
        moe_share(nhit * units2, tid, nt, &lo, &hi);                                                            \
        for (int u = lo; u < hi; u++) {                                                                         \
            int e = hit[u / units2], r0 = (u % units2) * MOE_ROWS, r1 = r0 + MOE_ROWS < H ? r0 + MOE_ROWS : H;    \
            moe_rows_##S(w2, H, I, e, r0, r1, af, NULL, start[e], start[e + 1], y);                             \
        }                                                                                                       \
        _Pragma("omp barrier")                                                                                  \
        moe_share(Tn * col_units, tid, nt, &lo, &hi);                                                           \
        for (int u = lo; u < hi; u++) {                                                                         \
            int t = u / col_units, c0 = (u % col_units) * MOE_COLS, c1 = c0 + MOE_COLS < H ? c0 + MOE_COLS : H;  \
            int qs[64], m = k < 64 ? k : 64;                                                                    \
            for (int j = 0; j < m; j++) { /* the token's pairs in sorted (ascending expert) order */            \
                int q = pos[t * k + j], i = j;                                                                  \
                while (i > 0 && qs[i - 1] > q) { qs[i] = qs[i - 1]; i--; }                                      \
                qs[i] = q;                                                                                      \
            }                                                                                                   \
            float acc[MOE_COLS];                                                                                \
            for (int c = c0; c < c1; c++) acc[c - c0] = 0.f;                                                    \
            for (int j = 0; j < m; j++) {                                                                       \
                int q = qs[j];                                                                                  \
                float wq = weights[order[q]];                                                                   \
                const float* yq = y + (size_t)q * H;                                                            \
                for (int c = c0; c < c1; c++) acc[c - c0] += yq[c] * wq;                                        \
            }                                                                                                   \
            for (int c = c0; c < c1; c++) out[(size_t)t * H + c] = moe_st_##S(acc[c - c0]);                     \
        }                                                                                                       \
    }                                                                                                           \
    return 0;                                                                                                   \
}

DEFINE_MOE(f32, float)
DEFINE_MOE(bf16, uint16_t)
