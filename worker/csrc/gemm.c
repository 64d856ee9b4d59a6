/* bfloat16 GEMM for linear layers, out[M, N] = x[M, K] @ W[N, K]^T (+ bias), on CPUs with AVX512_BF16.
 *
 * Why: at decode batch sizes a linear layer streams its whole weight from memory for little compute, and
 * oneDNN's kernel does the two one after the other (measured on the default model: time at M = 32 is
 * about the time at M = 1, which is pure weight streaming, plus the compute time). This kernel prefetches
 * the next weight panel while it computes on the current one, so streaming and compute overlap.
 *
 * Layout: W is pre-packed (cpu_linear.pack_bf16) into panels of 16 output columns; within a panel, row kp
 * holds the 16 columns' pairs (W[n][2kp], W[n][2kp + 1]): one 64-byte line, exactly the B operand of one
 * VDPBF16PS. x is read as 32-bit pairs and broadcast. Accumulation is float32; out is rounded to bfloat16
 * (nearest even) after adding the float32 bias, as PyTorch's bfloat16 linear does.
 */
#include "simd.h"

#if HAVE_AVX512 && defined(__AVX512BF16__)
#define HAVE_GEMM_BF16 1

/* A panel is NR * 16 output columns; MR rows of x times one panel keep MR * NR accumulators in registers,
   so each broadcast of an x pair feeds NR VDPBF16PS (a broadcast costs a vector-pipe slot too). */
enum { NR = 4, PANEL = NR * 16 };

#define DEFINE_MICRO(MR)                                                                                 \
static inline void micro_##MR(const uint32_t* x, int kh, const uint32_t* panel, const float* bias,        \
                              uint16_t* out, int ldo, const __mmask16* cols, const char* prefetch) {     \
    __m512 acc[MR][NR];                                                                                   \
    _Pragma("GCC unroll 4")                                                                               \
    for (int j = 0; j < NR; j++) {                                                                        \
        __m512 b0 = bias ? _mm512_maskz_loadu_ps(cols[j], bias + 16 * j) : _mm512_setzero_ps();           \
        _Pragma("GCC unroll 8")                                                                           \
        for (int m = 0; m < MR; m++) acc[m][j] = b0;                                                      \
    }                                                                                                     \
    for (int kp = 0; kp < kh; kp++) {                                                                     \
        const uint32_t* row = panel + (size_t)kp * PANEL;                                                 \
        __m512bh w[NR];                                                                                   \
        _Pragma("GCC unroll 4")                                                                           \
        for (int j = 0; j < NR; j++) w[j] = (__m512bh)_mm512_loadu_si512(row + 16 * j);                   \
        if (prefetch) {                                                                                   \
            _Pragma("GCC unroll 4")                                                                       \
            for (int j = 0; j < NR; j++) _mm_prefetch(prefetch + (size_t)kp * PANEL * 4 + 64 * j, _MM_HINT_T0); \
        }                                                                                                 \
        _Pragma("GCC unroll 8")                                                                           \
        for (int m = 0; m < MR; m++) {                                                                    \
            __m512bh a = (__m512bh)_mm512_set1_epi32((int)x[(size_t)m * kh + kp]);                        \
            _Pragma("GCC unroll 4")                                                                       \
            for (int j = 0; j < NR; j++) acc[m][j] = _mm512_dpbf16_ps(acc[m][j], a, w[j]);                \
        }                                                                                                 \
    }                                                                                                     \
    _Pragma("GCC unroll 8")                                                                               \
    for (int m = 0; m < MR; m++) {                                                                        \
        _Pragma("GCC unroll 4")                                                                           \
        for (int j = 0; j < NR; j++)                                                                      \
            if (cols[j])                                                                                  \
                _mm256_mask_storeu_epi16(out + (size_t)m * ldo + 16 * j, cols[j],                         \
                                         (__m256i)_mm512_cvtneps_pbh(acc[m][j]));                         \
    }                                                                                                     \
}

DEFINE_MICRO(6)
DEFINE_MICRO(4)
DEFINE_MICRO(2)
DEFINE_MICRO(1)

enum { ROWS_PER_PASS = 240 }; /* x rows kept in L2 while every panel passes over them (a multiple of 6) */

int gemm_bf16(const uint16_t* x, int M, int K, const uint16_t* packed, int N, const float* bias, uint16_t* out) {
    if (K % 2) return -1;
    int kh = K / 2, panels = (N + PANEL - 1) / PANEL;
    const uint32_t* x32 = (const uint32_t*)x;
    const uint32_t* w32 = (const uint32_t*)packed;
    for (int m0 = 0; m0 < M; m0 += ROWS_PER_PASS) {
        int rows = M - m0 < ROWS_PER_PASS ? M - m0 : ROWS_PER_PASS;
        int par = (size_t)panels * rows * K >= 32768;
        _Pragma("omp parallel for schedule(static) if (par)")
        for (int p = 0; p < panels; p++) {
            const uint32_t* panel = w32 + (size_t)p * kh * PANEL;
            const char* next = p + 1 < panels ? (const char*)(panel + (size_t)kh * PANEL) : 0;
            __mmask16 cols[NR];
            for (int j = 0; j < NR; j++) {
                int left = N - p * PANEL - 16 * j;
                cols[j] = left >= 16 ? (__mmask16)0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
            }
            const float* b = bias ? bias + (size_t)p * PANEL : 0;
            for (int m = 0; m < rows;) {
                const uint32_t* xm = x32 + (size_t)(m0 + m) * kh;
                uint16_t* om = out + (size_t)(m0 + m) * N + (size_t)p * PANEL;
                const char* pf = m == 0 ? next : 0; /* the first pass over a panel fetches the next one */
                int left = rows - m;
                if (left >= 6) { micro_6(xm, kh, panel, b, om, N, cols, pf); m += 6; }
                else if (left >= 4) { micro_4(xm, kh, panel, b, om, N, cols, pf); m += 4; }
                else if (left >= 2) { micro_2(xm, kh, panel, b, om, N, cols, pf); m += 2; }
                else { micro_1(xm, kh, panel, b, om, N, cols, pf); m += 1; }
            }
        }
    }
    return 0;
}
#else
#define HAVE_GEMM_BF16 0
int gemm_bf16(const uint16_t* x, int M, int K, const uint16_t* packed, int N, const float* bias, uint16_t* out) {
    (void)x; (void)M; (void)K; (void)packed; (void)N; (void)bias; (void)out;
    return -1;
}
#endif

int gemm_bf16_available(void) { return HAVE_GEMM_BF16; }
