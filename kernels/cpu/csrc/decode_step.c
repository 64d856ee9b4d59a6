/* The decoder stack of a Llama-family model for a few rows (decode), bfloat16, in one C call and one OpenMP
 * parallel region.
 *
 * Why: one decode row of the default model streams ~210 MB of weights (~5 ms at this machine's copy
 * bandwidth), while the per-op path spends about as long again in ~270 Python/ctypes dispatches and ~200
 * OpenMP fork/joins a step. Here the threads are forked once per step and meet at barriers between the phases
 * of each layer:
 *
 *   add + RMSNorm -> qkv GEMV -> rotary + KV write -> paged attention -> o GEMV -> add + RMSNorm -> gate_up
 *   GEMV -> silu * up -> down GEMV
 *
 * Numerics are those of the per-op path, bit for bit: the norms, rotary and activation are the same C
 * functions (ops.c; called on one row at a time, their `omp parallel for if (...)` runs inline), the attention
 * is paged_attention.c's unit of work, and the GEMV below does per output element exactly what gemm.c's micro
 * kernels do (float32 bias first, then VDPBF16PS over the pairs in order, round to nearest even), on gemm.c's
 * packed layout: panels of 64 output columns, pair row kp of a panel holding each column's
 * (W[n][2kp], W[n][2kp + 1]).
 *
 * Work split: GEMVs by panels, attention by (row, KV head), the elementwise phases by rows (or, for silu * up,
 * by 16-column chunks).
 */
#include "simd.h"

#include <omp.h>

typedef struct {
    const uint16_t* input_norm; /* [hidden] */
    const uint16_t* post_norm;
    const uint16_t* qkv; /* packed; biases float32 [N] or NULL */
    const float* qkv_bias;
    const uint16_t* o;
    const float* o_bias;
    const uint16_t* gate_up;
    const float* gate_up_bias;
    const uint16_t* down;
    const float* down_bias;
    uint16_t* k_cache; /* [num_blocks, block_size, KVH, D] */
    uint16_t* v_cache;
} StepLayer;

typedef struct {
    int layers, rows, hidden, heads, kv_heads, head_dim, intermediate, block_size, max_blocks;
    float eps, scale;
} StepShape;

/* from ops.c and paged_attention.c */
void add_rms_norm_bf16(const uint16_t* x, uint16_t* residual, const uint16_t* w, uint16_t* out, int rows, int n,
                       float eps);
void rope_and_cache_bf16(uint16_t* q, long q_stride, uint16_t* k, long k_stride, const uint16_t* v, long v_stride,
                         const int64_t* positions, const uint16_t* cos_t, const uint16_t* sin_t, uint16_t* k_cache,
                         uint16_t* v_cache, const int64_t* slots, int tokens, int H, int KVH, int D);
void paged_heads_bf16(const uint16_t* qb, const uint16_t* kc, const uint16_t* vc, const int32_t* table, int len,
                      uint16_t* ob, int kh0, int kh1, int H, int KVH, int D, int bs, float scale);

/* Up to 4 rows the GEMV below beat the per-op path (gemm.c) on one thread, by 22% of the step at 4 rows; at 8
   it was 12% slower (no next-panel prefetch: compute no longer hides the streaming), and 15% at 32. */
enum { MAX_ROWS = 4 };

#if HAVE_AVX512 && defined(__AVX512BF16__) && defined(__AVX512BW__)
#define HAVE_DECODE_STEP 1
enum { NR = 4, PANEL = NR * 16 };

void silu_mul_span_bf16(const uint16_t* g, const uint16_t* u, uint16_t* o, int n);

/* MR rows of x over one panel, as gemm.c's micro kernels compute them */
#define DEFINE_TILE(NAME, MR)                                                                            \
static inline void NAME(const uint32_t* x, int kh, const uint32_t* w, const float* bias, uint16_t* out,  \
                        int ldo, const __mmask16* cols) {                                                \
    __m512 acc[MR][NR];                                                                                  \
    _Pragma("GCC unroll 4")                                                                              \
    for (int j = 0; j < NR; j++) {                                                                       \
        __m512 b0 = bias ? _mm512_maskz_loadu_ps(cols[j], bias + 16 * j) : _mm512_setzero_ps();          \
        _Pragma("GCC unroll 4")                                                                          \
        for (int m = 0; m < MR; m++) acc[m][j] = b0;                                                     \
    }                                                                                                    \
    for (int kp = 0; kp < kh; kp++) {                                                                    \
        __m512bh wj[NR];                                                                                 \
        _Pragma("GCC unroll 4")                                                                          \
        for (int j = 0; j < NR; j++) wj[j] = (__m512bh)_mm512_loadu_si512(w + (size_t)kp * PANEL + 16 * j); \
        _Pragma("GCC unroll 4")                                                                          \
        for (int m = 0; m < MR; m++) {                                                                   \
            __m512bh a = (__m512bh)_mm512_set1_epi32((int)x[(size_t)m * kh + kp]);                       \
            _Pragma("GCC unroll 4")                                                                      \
            for (int j = 0; j < NR; j++) acc[m][j] = _mm512_dpbf16_ps(acc[m][j], a, wj[j]);              \
        }                                                                                                \
    }                                                                                                    \
    _Pragma("GCC unroll 4")                                                                              \
    for (int m = 0; m < MR; m++)                                                                         \
        _Pragma("GCC unroll 4")                                                                          \
        for (int j = 0; j < NR; j++)                                                                     \
            if (cols[j])                                                                                 \
                _mm256_mask_storeu_epi16(out + (size_t)m * ldo + 16 * j, cols[j],                        \
                                         (__m256i)_mm512_cvtneps_pbh(acc[m][j]));                        \
}
DEFINE_TILE(tile_4, 4)
DEFINE_TILE(tile_2, 2)
DEFINE_TILE(tile_1, 1)

/* out[R, N] = x[R, K] @ W^T (+ bias) over this thread's share of the panels */
static void gemv_share(const uint16_t* x, int R, int K, const uint16_t* packed, const float* bias, int N,
                       uint16_t* out, int tid, int nt) {
    int kh = K / 2, panels = (N + PANEL - 1) / PANEL;
    int p0 = (int)((long)panels * tid / nt), p1 = (int)((long)panels * (tid + 1) / nt);
    const uint32_t* x32 = (const uint32_t*)x;
    for (int p = p0; p < p1; p++) {
        const uint32_t* w = (const uint32_t*)packed + (size_t)p * kh * PANEL;
        const float* b = bias ? bias + (size_t)p * PANEL : 0;
        __mmask16 cols[NR];
        for (int j = 0; j < NR; j++) {
            int left = N - p * PANEL - 16 * j;
            cols[j] = left >= 16 ? (__mmask16)0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
        }
        for (int m = 0; m < R;) {
            const uint32_t* xm = x32 + (size_t)m * kh;
            uint16_t* om = out + (size_t)m * N + (size_t)p * PANEL;
            if (R - m >= 4) { tile_4(xm, kh, w, b, om, N, cols); m += 4; }
            else if (R - m >= 2) { tile_2(xm, kh, w, b, om, N, cols); m += 2; }
            else { tile_1(xm, kh, w, b, om, N, cols); m += 1; }
        }
    }
}

/* this thread's share [*lo, *hi) of `total` items */
static inline void share(int total, int tid, int nt, int* lo, int* hi) {
    *lo = (int)((long)total * tid / nt);
    *hi = (int)((long)total * (tid + 1) / nt);
}

/* h [rows, hidden]: in, the embeddings; out, the last layer's MLP output. residual [rows, hidden]: out, the
   residual stream (the caller applies the final norm to h + residual). positions, slots: int64 [rows];
   tables [rows, max_blocks], lens [rows] (each row's causal context, itself included): the attention's.
   Returns 0, or -1 for shapes it does not take (the caller runs the per-op path). */
int decode_step_bf16(const StepLayer* layers, const StepShape* sh, uint16_t* h, uint16_t* residual,
                     const int64_t* positions, const int64_t* slots, const uint16_t* cos_t, const uint16_t* sin_t,
                     const int32_t* tables, const int32_t* lens) {
    const int R = sh->rows, n = sh->hidden, H = sh->heads, KVH = sh->kv_heads, D = sh->head_dim;
    const int inter = sh->intermediate, hq = H * D, hk = KVH * D, nqkv = hq + 2 * hk;
    if (R < 1 || R > MAX_ROWS || n % 2 || hq % 2 || inter % 2 || D % 2 || D > 512 || H % KVH) return -1;
    size_t elems = (size_t)R * (n + nqkv + hq + 3 * (size_t)inter);
    uint16_t* scratch = (uint16_t*)malloc(sizeof(uint16_t) * elems);
    if (!scratch) return -1;
    uint16_t *normed = scratch, *qkv = normed + (size_t)R * n, *attn = qkv + (size_t)R * nqkv;
    uint16_t *gu = attn + (size_t)R * hq, *act = gu + (size_t)R * 2 * inter;
    const int chunks = (inter + 15) / 16;
#pragma omp parallel
    {
        const int tid = omp_get_thread_num(), nt = omp_get_num_threads();
        int lo, hi;
        for (int l = 0; l < sh->layers; l++) {
            const StepLayer* L = layers + l;
            for (int r = tid; r < R; r += nt) {
                size_t at = (size_t)r * n;
                if (l == 0) memcpy(residual + at, h + at, sizeof(uint16_t) * n);
                add_rms_norm_bf16(l == 0 ? 0 : h + at, residual + at, L->input_norm, normed + at, 1, n, sh->eps);
            }
#pragma omp barrier
            gemv_share(normed, R, n, L->qkv, L->qkv_bias, nqkv, qkv, tid, nt);
#pragma omp barrier
            for (int r = tid; r < R; r += nt) {
                uint16_t* row = qkv + (size_t)r * nqkv;
                rope_and_cache_bf16(row, nqkv, row + hq, nqkv, row + hq + hk, nqkv, positions + r, cos_t, sin_t,
                                    L->k_cache, L->v_cache, slots + r, 1, H, KVH, D);
            }
#pragma omp barrier
            share(R * KVH, tid, nt, &lo, &hi);
            for (int i = lo; i < hi;) { /* consecutive KV heads of one row in one call */
                int r = i / KVH, kh0 = i % KVH, kh1 = kh0 + (hi - i);
                if (kh1 > KVH) kh1 = KVH;
                paged_heads_bf16(qkv + (size_t)r * nqkv, L->k_cache, L->v_cache, tables + (size_t)r * sh->max_blocks,
                                 lens[r], attn + (size_t)r * hq, kh0, kh1, H, KVH, D, sh->block_size, sh->scale);
                i += kh1 - kh0;
            }
#pragma omp barrier
            gemv_share(attn, R, hq, L->o, L->o_bias, n, h, tid, nt);
#pragma omp barrier
            for (int r = tid; r < R; r += nt) {
                size_t at = (size_t)r * n;
                add_rms_norm_bf16(h + at, residual + at, L->post_norm, normed + at, 1, n, sh->eps);
            }
#pragma omp barrier
            gemv_share(normed, R, n, L->gate_up, L->gate_up_bias, 2 * inter, gu, tid, nt);
#pragma omp barrier
            share(R * chunks, tid, nt, &lo, &hi);
            for (int i = lo; i < hi; i++) {
                int r = i / chunks, c0 = 16 * (i % chunks), c1 = c0 + 16 < inter ? c0 + 16 : inter;
                const uint16_t* g = gu + (size_t)r * 2 * inter;
                silu_mul_span_bf16(g + c0, g + inter + c0, act + (size_t)r * inter + c0, c1 - c0);
            }
#pragma omp barrier
            gemv_share(act, R, inter, L->down, L->down_bias, n, h, tid, nt);
#pragma omp barrier
        }
    }
    free(scratch);
    return 0;
}
#else
#define HAVE_DECODE_STEP 0
int decode_step_bf16(const StepLayer* layers, const StepShape* sh, uint16_t* h, uint16_t* residual,
                     const int64_t* positions, const int64_t* slots, const uint16_t* cos_t, const uint16_t* sin_t,
                     const int32_t* tables, const int32_t* lens) {
    (void)layers; (void)sh; (void)h; (void)residual; (void)positions; (void)slots; (void)cos_t; (void)sin_t;
    (void)tables; (void)lens;
    return -1;
}
#endif

int decode_step_available(void) { return HAVE_DECODE_STEP; }
int decode_step_max_rows(void) { return MAX_ROWS; }
