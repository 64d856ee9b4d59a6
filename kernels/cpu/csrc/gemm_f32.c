/* float32 GEMM for linear layers, out[M, N] = x[M, K] @ W[N, K]^T (+ bias), on CPUs with AVX-512F or AVX2 + FMA
 * (the same code over 256-bit vectors: panels of 16 columns, 6-row tiles; see the micro kernels).
 *
 * Why: at decode batch sizes (8-64 rows) oneDNN's float32 packed-weight GEMM reached about half of the
 * machine's matmul rate on the AMD EPYC dev box with the weights coming from memory. Here each thread streams
 * its panels front to back (the weights on huge pages: linear.py packs them into kernels/cpu/weight_arena.py),
 * which the hardware prefetchers follow; software prefetch of the next panel was measured too and was no faster
 * from 8 rows up and 30-40% slower at one row (docs/benchmarks.md).
 *
 * Layout: W is pre-packed (cpu_linear.pack_as("gemm_f32")) into panels of PANEL = NR * 16 output columns;
 * within a panel, row k holds the PANEL columns' W[n][k] (NR 64-byte lines). MR rows of x times one panel keep
 * MR * NR float32 accumulators in registers; each x element is broadcast (an embedded-broadcast FMA operand)
 * and feeds NR FMAs. Accumulation is float32 in k order; the bias is added to the finished sum, as PyTorch's
 * linear adds it to the product.
 *
 * Rows are taken a pass at a time (as many as keep x in L2 while every panel runs over them); within a pass,
 * OpenMP splits the panels (NR = 3: the model's widths 576, 960, 3072, 49152 are whole numbers of 48-column
 * panels and split evenly over two threads, where 64-column panels left 5 against 4 at N = 576).
 */
#include "simd.h"

#include <omp.h>

#if HAVE_GEMM_F32

#if HAVE_AVX512
/* A panel is NR vectors of 16 columns; Cols says which columns of each vector are real (the last panel's) */
enum { NR = 3, PANEL = NR * 16, MR = 8 };
typedef struct { __mmask16 m[NR]; } Cols;

static inline Cols f32_cols(int N, int p) {
    Cols cols;
    for (int j = 0; j < NR; j++) {
        int left = N - p * PANEL - 16 * j;
        cols.m[j] = left >= 16 ? (__mmask16)0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
    }
    return cols;
}

/* ROWS rows of x over one panel: out[m][c] = sum_k x[m][k] w[k][c] (+ bias[c]) */
#define DEFINE_MICRO_F32(NAME, ROWS)                                                                      \
static inline void NAME(const float* x, int K, const float* w, const float* bias, float* out, int ldo,     \
                        Cols cols) {                                                                       \
    __m512 acc[ROWS][NR];                                                                                 \
    _Pragma("GCC unroll 8")                                                                               \
    for (int m = 0; m < ROWS; m++) {                                                                      \
        _Pragma("GCC unroll 4")                                                                           \
        for (int j = 0; j < NR; j++) acc[m][j] = _mm512_setzero_ps();                                     \
    }                                                                                                     \
    for (int k = 0; k < K; k++) {                                                                         \
        __m512 wj[NR];                                                                                    \
        _Pragma("GCC unroll 4")                                                                           \
        for (int j = 0; j < NR; j++) wj[j] = _mm512_loadu_ps(w + (size_t)k * PANEL + 16 * j);            \
        _Pragma("GCC unroll 8")                                                                           \
        for (int m = 0; m < ROWS; m++) {                                                                  \
            __m512 a = _mm512_set1_ps(x[(size_t)m * K + k]);                                              \
            _Pragma("GCC unroll 4")                                                                       \
            for (int j = 0; j < NR; j++) acc[m][j] = _mm512_fmadd_ps(a, wj[j], acc[m][j]);                \
        }                                                                                                 \
    }                                                                                                     \
    _Pragma("GCC unroll 4")                                                                               \
    for (int j = 0; j < NR; j++) {                                                                        \
        if (!cols.m[j]) continue;                                                                         \
        __m512 bj = bias ? _mm512_maskz_loadu_ps(cols.m[j], bias + 16 * j) : _mm512_setzero_ps();         \
        _Pragma("GCC unroll 8")                                                                           \
        for (int m = 0; m < ROWS; m++)                                                                    \
            _mm512_mask_storeu_ps(out + (size_t)m * ldo + 16 * j, cols.m[j],                              \
                                  bias ? _mm512_add_ps(acc[m][j], bj) : acc[m][j]);                       \
    }                                                                                                     \
}
#else
/* AVX2 + FMA: 16 ymm registers hold a 6 x 16 tile (12 accumulators, 2 weight vectors, 1 broadcast), the
   classic Haswell shape; panels of 16 columns (the model's widths split evenly over two threads). */
enum { NR = 2, PANEL = NR * 8, MR = 6 };
typedef struct { int valid; } Cols; /* real columns of the panel (PANEL but in the last one) */

static inline Cols f32_cols(int N, int p) {
    int left = N - p * PANEL;
    return (Cols){left < PANEL ? left : PANEL};
}

#define DEFINE_MICRO_F32(NAME, ROWS)                                                                      \
static inline void NAME(const float* x, int K, const float* w, const float* bias, float* out, int ldo,     \
                        Cols cols) {                                                                       \
    __m256 acc[ROWS][NR];                                                                                 \
    _Pragma("GCC unroll 8")                                                                               \
    for (int m = 0; m < ROWS; m++) {                                                                      \
        _Pragma("GCC unroll 4")                                                                           \
        for (int j = 0; j < NR; j++) acc[m][j] = _mm256_setzero_ps();                                     \
    }                                                                                                     \
    for (int k = 0; k < K; k++) {                                                                         \
        __m256 wj[NR];                                                                                    \
        _Pragma("GCC unroll 4")                                                                           \
        for (int j = 0; j < NR; j++) wj[j] = _mm256_loadu_ps(w + (size_t)k * PANEL + 8 * j);             \
        _Pragma("GCC unroll 8")                                                                           \
        for (int m = 0; m < ROWS; m++) {                                                                  \
            __m256 a = _mm256_broadcast_ss(x + (size_t)m * K + k);                                        \
            _Pragma("GCC unroll 4")                                                                       \
            for (int j = 0; j < NR; j++) acc[m][j] = _mm256_fmadd_ps(a, wj[j], acc[m][j]);                \
        }                                                                                                 \
    }                                                                                                     \
    if (cols.valid == PANEL) {                                                                            \
        _Pragma("GCC unroll 4")                                                                           \
        for (int j = 0; j < NR; j++) {                                                                    \
            __m256 bj = bias ? _mm256_loadu_ps(bias + 8 * j) : _mm256_setzero_ps();                       \
            _Pragma("GCC unroll 8")                                                                       \
            for (int m = 0; m < ROWS; m++)                                                                \
                _mm256_storeu_ps(out + (size_t)m * ldo + 8 * j, bias ? _mm256_add_ps(acc[m][j], bj) : acc[m][j]); \
        }                                                                                                 \
        return;                                                                                           \
    }                                                                                                     \
    _Pragma("GCC unroll 8") /* constant indices into acc keep it in registers */                         \
    for (int m = 0; m < ROWS; m++) { /* the last panel: its real columns only */                          \
        float tmp[PANEL];                                                                                 \
        _Pragma("GCC unroll 4")                                                                           \
        for (int j = 0; j < NR; j++) _mm256_storeu_ps(tmp + 8 * j, acc[m][j]);                            \
        for (int c = 0; c < cols.valid; c++) out[(size_t)m * ldo + c] = bias ? tmp[c] + bias[c] : tmp[c]; \
    }                                                                                                     \
}
#endif

/* x rows per pass: x of one pass (rows * K floats) stays within this many bytes of L2 */
enum { PASS_BYTES = 384 * 1024 };

DEFINE_MICRO_F32(f32_rows_mr, MR)
DEFINE_MICRO_F32(f32_rows4, 4)
DEFINE_MICRO_F32(f32_rows2, 2)
DEFINE_MICRO_F32(f32_rows1, 1)

/* rows m0 .. m0 + rows - 1 of x over panel p: out[:, p * PANEL ...] */
static inline void f32_panel_rows(const float* x, int m0, int rows, int K, const float* w, const float* bias,
                                  float* out, int N, Cols cols) {
    for (int m = 0; m < rows;) {
        const float* xm = x + (size_t)(m0 + m) * K;
        float* om = out + (size_t)(m0 + m) * N;
        int left = rows - m;
        if (left >= MR) { f32_rows_mr(xm, K, w, bias, om, N, cols); m += MR; }
        else if (left >= 4) { f32_rows4(xm, K, w, bias, om, N, cols); m += 4; }
        else if (left >= 2) { f32_rows2(xm, K, w, bias, om, N, cols); m += 2; }
        else { f32_rows1(xm, K, w, bias, om, N, cols); m += 1; }
    }
}

static inline int rows_per_pass(int K) {
    int per_pass = (int)(PASS_BYTES / ((size_t)K * sizeof(float))) / MR * MR;
    return per_pass < MR ? MR : per_pass;
}

/* Thread tid's share (of nt) of out[M, N] = x @ W^T (+ bias), called by every thread of a parallel region:
   per pass of rows, panels [lo, hi) of an even cut (what `omp for schedule(static)` gave gemm_f32). gemm_f32
   runs it in a region of its own; the fused decode step (decode_step.c) inside the region of its whole step.
   No barrier at the end: the caller's. */
void gemm_f32_share(const float* x, int M, int K, const float* packed, int N, const float* bias, float* out,
                    int tid, int nt) {
    int panels = (N + PANEL - 1) / PANEL, per_pass = rows_per_pass(K);
    int lo = (int)((long)panels * tid / nt), hi = (int)((long)panels * (tid + 1) / nt);
    for (int m0 = 0; m0 < M; m0 += per_pass) {
        int rows = M - m0 < per_pass ? M - m0 : per_pass;
        for (int p = lo; p < hi; p++) {
            f32_panel_rows(x, m0, rows, K, packed + (size_t)p * K * PANEL, bias ? bias + (size_t)p * PANEL : 0,
                           out + (size_t)p * PANEL, N, f32_cols(N, p));
        }
    }
}

int gemm_f32(const float* x, int M, int K, const float* packed, int N, const float* bias, float* out) {
    if (M < 0 || K < 1 || N < 1) return -1;
    int panels = (N + PANEL - 1) / PANEL, per_pass = rows_per_pass(K);
    int par = (size_t)panels * (M < per_pass ? M : per_pass) * K >= 32768;
    _Pragma("omp parallel if (par)")
    gemm_f32_share(x, M, K, packed, N, bias, out, omp_get_thread_num(), omp_get_num_threads());
    return 0;
}
#else
int gemm_f32(const float* x, int M, int K, const float* packed, int N, const float* bias, float* out) {
    (void)x; (void)M; (void)K; (void)packed; (void)N; (void)bias; (void)out;
    return -1;
}
#endif

int gemm_f32_available(void) { return HAVE_GEMM_F32; }

/* The panel width of the packed layout (columns), for the packing code to match */
int gemm_f32_panel(void) {
#if HAVE_GEMM_F32
    return PANEL;
#else
    return 0;
#endif
}
