/* bfloat16 GEMM for linear layers, out[M, N] = x[M, K] @ W[N, K]^T (+ bias), on CPUs with AVX512_BF16 (VDPBF16PS)
 * or, without it, AVX2 + FMA (the AVX2 section at the end: the bfloat16 weights widened to float32 in
 * registers, the same packed layout).
 *
 * Why: at decode batch sizes a linear layer streams its whole weight from memory for little compute, and
 * oneDNN's kernel does the two one after the other (measured on the default model: time at M = 32 is
 * about the time at M = 1, which is pure weight streaming, plus the compute time). Here each thread walks its
 * panels in memory order and the hardware prefetchers stream them while the micro kernels compute. (Software
 * prefetches of the next panel, issued while the first rows pass over the current one, measured 3-12% slower
 * with the weights coming from memory: 1 thread, 1-64 rows, the default model's shapes; docs/benchmarks.md,
 * "The bfloat16 GEMM, weights from memory".)
 *
 * Layout: W is pre-packed (cpu_linear.pack_as("gemm_bf16")) into panels of 64 output columns; within a panel,
 * row kp holds the 64 columns' pairs (W[n][2kp], W[n][2kp + 1]): four 64-byte lines, each exactly the B operand
 * of one VDPBF16PS (the AVX2 kernels widen each 32-byte half of a line to two float32 vectors). x is read as 32-bit pairs and broadcast. Accumulation is float32; out is rounded to bfloat16
 * (nearest even) after adding the float32 bias, as PyTorch's bfloat16 linear does.
 *
 * Weight-only quantized weights (W8A16, W4A16; hetero_infer.worker.quant.quantize) use the same micro kernels:
 * each thread dequantizes one panel at a time into a bfloat16 panel of its own (at most K * 128 bytes: it
 * stays in L2) and runs every row of x over it, so a decode step streams 1 (INT8) or 0.5 (INT4) bytes per
 * weight from memory instead of 2. INT8 panels hold the integers (exact in bfloat16) and the per-column
 * scale multiplies the float32 dot products, as the reference `(x @ q.T) * scales` does; INT4 panels hold
 * ((q - zero) * scale) rounded to bfloat16, the reference's dequantized weight in the activations' dtype.
 */
#include "simd.h"
#include <omp.h>
#include <stdio.h>

#if HAVE_GEMM_BF16

/* How far ahead (bytes) the quantized kernels prefetch the integers they stream: without it, reading them
   from memory ran at 11 GB/s on one core (measured on the dev box: 4-8 KB ahead gave 22-26 GB/s). */
enum { DEQUANT_PREFETCH = 6144 };

/* One panel of weights as the micro kernels read it: bfloat16 pairs, or INT8 / INT4 integers (with the
   INT4 group scales and zero points of the panel, [K / G][PANEL]) dequantized on the fly. */
typedef struct {
    const void* data;
    const float* scales;
    const float* zeros;
    int group;
} Panel;

enum { ROWS_PER_PASS = 240 }; /* x rows kept in L2 while every panel passes over them (a multiple of 6) */


/* Into how many blocks of rows each panel's work is cut, so that the (panel, block) items split evenly over
   the threads: with 2 threads, the default model's o and down projections have 9 panels (5 / 4 per thread,
   one thread idle a ninth of the call); as 18 items they split 9 / 9 (measured 1.09-1.17x at 16-64 rows on
   the dev box, docs/benchmarks.md). Blocks keep at least 6 rows (one micro tile); a thread's items stay
   contiguous, so each panel is still streamed by one thread (two at a boundary). */
static int row_blocks(int rows, int panels, int threads) {
    int most = rows / 6 > 1 ? rows / 6 : 1, b = 1;
    while (b < most && (panels * b) % threads && panels * b < 8 * threads) b++;
    return b;
}

/* The first row of block i of `blocks`: a multiple of 6 (whole micro tiles) nearest to an even cut */
static inline int block_start(int rows, int blocks, int i) {
    if (i >= blocks) return rows;
    int s = ((int)((long)rows * i / blocks) + 3) / 6 * 6;
    return s < rows ? s : rows;
}

/* A thread's buffer `which` (0: a dequantized panel; 1: x widened to float32, AVX2), kept from call to call: a
   fresh allocation of this size (up to K * 128 bytes) is an mmap and page faults on every call. */
static void* thread_buffer(int which, size_t bytes) {
    static __thread void* buf[2];
    static __thread size_t cap[2];
    if (bytes > cap[which]) {
        free(buf[which]);
        cap[which] = (bytes + 4095) & ~(size_t)4095;
        buf[which] = aligned_alloc(64, cap[which]);
        if (!buf[which]) cap[which] = 0;
    }
    return buf[which];
}


#if GEMM_BF16_DPBF16

/* A panel is NR * 16 output columns; MR rows of x times one panel keep MR * NR accumulators in registers,
   so each broadcast of an x pair feeds NR VDPBF16PS (a broadcast costs a vector-pipe slot too). */
enum { NR = 4, PANEL = NR * 16 };

/* The bfloat16 pairs of columns 16j .. 16j + 15 at pair row kp */
static inline __m512bh w_bf16(Panel w, int kp, int j) {
    return (__m512bh)_mm512_loadu_si512((const uint32_t*)w.data + (size_t)kp * PANEL + 16 * j);
}

/* INT8 [kh][PANEL][2]: the integers, exact in bfloat16 */
static inline __m512bh w_int8(Panel w, int kp, int j) {
    __m256i b = _mm256_loadu_si256((const __m256i*)((const int8_t*)w.data + ((size_t)kp * PANEL + 16 * j) * 2));
    __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(b)));
    __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(b, 1)));
    return _mm512_cvtne2ps_pbh(hi, lo); /* lo in the low half */
}

/* INT4 [kh][PANEL] bytes (low nibble: k = 2kp, high: 2kp + 1): (q - zero) * scale, rounded to bfloat16 */
static inline __m512bh w_int4(Panel w, int kp, int j) {
    const __m512i pairs = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                           23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    size_t g = (size_t)(2 * kp / w.group) * PANEL + 16 * j;
    __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)((const uint8_t*)w.data + (size_t)kp * PANEL
                                                                      + 16 * j)));
    __m512 s = _mm512_loadu_ps(w.scales + g), z = _mm512_loadu_ps(w.zeros + g);
    __m512 w0 = _mm512_mul_ps(_mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_and_si512(d, _mm512_set1_epi32(15))), z), s);
    __m512 w1 = _mm512_mul_ps(_mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(d, 4)), z), s);
    return (__m512bh)_mm512_permutexvar_epi16(pairs, (__m512i)_mm512_cvtne2ps_pbh(w1, w0)); /* pairs (w0, w1) */
}

/* Round an mr x nc tile of float32 sums (nc vectors of 16 columns a row) to bfloat16 and store its valid
   columns */
static inline void store_tile(const __m512* acc, int mr, int nc, uint16_t* out, int ldo, const __mmask16* cols) {
    _Pragma("GCC unroll 8")
    for (int m = 0; m < mr; m++) {
        _Pragma("GCC unroll 4")
        for (int j = 0; j < nc; j++)
            if (cols[j])
                _mm256_mask_storeu_epi16(out + (size_t)m * ldo + 16 * j, cols[j],
                                         (__m256i)_mm512_cvtneps_pbh(acc[m * nc + j]));
    }
}

/* MR rows of x over one panel: out[m][16j + c] = (sum_k x[m][k] w[k][16j + c]) (* scale) + bias. Every
   kp, `prefetch + kp * row_bytes` (row_bytes of it) is prefetched where `prefetch` is set: the integers
   DEQUANT_PREFETCH ahead for quantized weights (bfloat16 weights pass none, see the top of the file). */
/* ACC[m][j] += x[m][kp] (a bfloat16 pair, broadcast) . WJ[j] for MR rows and NC vectors of 16 columns: the
   inner step of every micro-kernel */
#define DOT_ROWS(ACC, MR, NC, X, KH, KP, WJ)                                                              \
    _Pragma("GCC unroll 8")                                                                               \
    for (int m = 0; m < (MR); m++) {                                                                      \
        __m512bh a = (__m512bh)_mm512_set1_epi32((int)(X)[(size_t)m * (KH) + (KP)]);                      \
        _Pragma("GCC unroll 4")                                                                           \
        for (int j = 0; j < (NC); j++) ACC[m][j] = _mm512_dpbf16_ps(ACC[m][j], a, WJ[j]);                 \
    }

#define DEFINE_MICRO(NAME, MR, LOAD)                                                                      \
static inline void NAME(const uint32_t* x, int kh, Panel w, const float* bias, const float* scale,        \
                        uint16_t* out, int ldo, const __mmask16* cols, const char* prefetch, int row_bytes) { \
    __m512 acc[MR][NR];                                                                                   \
    _Pragma("GCC unroll 4")                                                                               \
    for (int j = 0; j < NR; j++) {                                                                        \
        __m512 b0 = bias && !scale ? _mm512_maskz_loadu_ps(cols[j], bias + 16 * j) : _mm512_setzero_ps(); \
        _Pragma("GCC unroll 8")                                                                           \
        for (int m = 0; m < MR; m++) acc[m][j] = b0;                                                      \
    }                                                                                                     \
    for (int kp = 0; kp < kh; kp++) {                                                                     \
        __m512bh wj[NR];                                                                                  \
        _Pragma("GCC unroll 4")                                                                           \
        for (int j = 0; j < NR; j++) wj[j] = LOAD(w, kp, j);                                              \
        if (prefetch)                                                                                     \
            for (int l = 0; l < row_bytes; l += 64)                                                       \
                _mm_prefetch(prefetch + (size_t)kp * row_bytes + l, _MM_HINT_T0);                         \
        DOT_ROWS(acc, MR, NR, x, kh, kp, wj);                                                             \
    }                                                                                                     \
    if (scale) { /* the per-column scale multiplies the dot products, then the bias is added */          \
        _Pragma("GCC unroll 4")                                                                           \
        for (int j = 0; j < NR; j++) {                                                                    \
            __m512 sj = _mm512_maskz_loadu_ps(cols[j], scale + 16 * j);                                   \
            __m512 bj = bias ? _mm512_maskz_loadu_ps(cols[j], bias + 16 * j) : _mm512_setzero_ps();       \
            _Pragma("GCC unroll 8")                                                                       \
            for (int m = 0; m < MR; m++) acc[m][j] = _mm512_add_ps(_mm512_mul_ps(acc[m][j], sj), bj);     \
        }                                                                                                 \
    }                                                                                                     \
    store_tile(&acc[0][0], MR, NR, out, ldo, cols);                                                       \
}

DEFINE_MICRO(micro_6, 6, w_bf16)
DEFINE_MICRO(micro_4, 4, w_bf16)
DEFINE_MICRO(micro_2, 2, w_bf16)
DEFINE_MICRO(micro_1, 1, w_bf16)
DEFINE_MICRO(micro_int8_4, 4, w_int8)
DEFINE_MICRO(micro_int8_2, 2, w_int8)
DEFINE_MICRO(micro_int8_1, 1, w_int8)
/* INT4 levels of columns 16j .. 16j + 15 at pair row kp as bfloat16 pairs (q[2kp], q[2kp + 1]), exact: a
   table lookup (VPERMW) from the nibbles, four instructions for 32 weights */
static inline __m512bh q_int4(Panel w, int kp, int j) {
    const __m512i levels = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                            0x4170, 0x4160, 0x4150, 0x4140, 0x4130, 0x4120, 0x4110, 0x4100,
                                            0x40e0, 0x40c0, 0x40a0, 0x4080, 0x4040, 0x4000, 0x3f80, 0x0000);
    __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)((const uint8_t*)w.data + (size_t)kp * PANEL
                                                                      + 16 * j)));
    /* ((d | d << 12) & 0x000f000f): the low nibble in the low 16 bits, the high nibble in the high 16 */
    __m512i idx = _mm512_ternarylogic_epi32(d, _mm512_slli_epi32(d, 12), _mm512_set1_epi32(0x000f000f), 0xa8);
    return (__m512bh)_mm512_permutexvar_epi16(idx, levels);
}

/* MR rows of x over one INT4 panel, dequantizing nothing: per group g of G weights,
   sum_k x[k] (q[k] - z) s = s * (sum_k x[k] q[k]) - s z * (sum_k x[k]), with the levels q exact in bfloat16
   and the row sums of x per group (xsum [MR][K / G]) computed once per call. */
#define DEFINE_MICRO_INT4(NAME, MR, NC)                                                                   \
static inline void NAME(const uint32_t* x, int kh, Panel w, const float* xsum, int groups, const float* bias,\
                        uint16_t* out, int ldo, const __mmask16* cols, const char* prefetch) {            \
    __m512 acc[MR][NC];                                                                                   \
    _Pragma("GCC unroll 4")                                                                               \
    for (int j = 0; j < NC; j++) {                                                                        \
        __m512 b0 = bias ? _mm512_maskz_loadu_ps(cols[j], bias + 16 * j) : _mm512_setzero_ps();           \
        _Pragma("GCC unroll 8")                                                                           \
        for (int m = 0; m < MR; m++) acc[m][j] = b0;                                                      \
    }                                                                                                     \
    int per_group = w.group / 2;                                                                          \
    for (int g = 0; g < groups; g++) {                                                                    \
        __m512 part[MR][NC];                                                                              \
        _Pragma("GCC unroll 4")                                                                           \
        for (int j = 0; j < NC; j++) {                                                                    \
            _Pragma("GCC unroll 8")                                                                       \
            for (int m = 0; m < MR; m++) part[m][j] = _mm512_setzero_ps();                                \
        }                                                                                                 \
        for (int kp = g * per_group; kp < (g + 1) * per_group; kp++) {                                    \
            __m512bh wj[NC];                                                                              \
            _Pragma("GCC unroll 4")                                                                       \
            for (int j = 0; j < NC; j++) wj[j] = q_int4(w, kp, j);                                        \
            if (prefetch) _mm_prefetch(prefetch + (size_t)kp * PANEL, _MM_HINT_T0);                       \
            DOT_ROWS(part, MR, NC, x, kh, kp, wj);                                                        \
        }                                                                                                 \
        _Pragma("GCC unroll 4")                                                                           \
        for (int j = 0; j < NC; j++) {                                                                    \
            __m512 sj = _mm512_loadu_ps(w.scales + (size_t)g * PANEL + 16 * j);                           \
            __m512 szj = _mm512_mul_ps(sj, _mm512_loadu_ps(w.zeros + (size_t)g * PANEL + 16 * j));        \
            _Pragma("GCC unroll 8")                                                                       \
            for (int m = 0; m < MR; m++) {                                                                \
                acc[m][j] = _mm512_add_ps(acc[m][j], _mm512_mul_ps(sj, part[m][j]));                      \
                acc[m][j] = _mm512_sub_ps(acc[m][j],                                                      \
                                          _mm512_mul_ps(szj, _mm512_set1_ps(xsum[(size_t)m * groups + g]))); \
            }                                                                                             \
        }                                                                                                 \
    }                                                                                                     \
    store_tile(&acc[0][0], MR, NC, out, ldo, cols);                                                           \
}

DEFINE_MICRO_INT4(int4_rows2, 2, NR)
DEFINE_MICRO_INT4(int4_rows1, 1, NR)
DEFINE_MICRO_INT4(int4_rows4_half, 4, NR / 2)

/* Four rows hold twice the accumulators (sums and group sums): two passes over half the columns each */
static inline void int4_rows4(const uint32_t* x, int kh, Panel w, const float* xsum, int groups, const float* bias,
                              uint16_t* out, int ldo, const __mmask16* cols, const char* prefetch) {
    int half = NR / 2;
    int4_rows4_half(x, kh, w, xsum, groups, bias, out, ldo, cols, prefetch);
    Panel right = w;
    right.data = (const uint8_t*)w.data + 16 * half;
    right.scales = w.scales + 16 * half;
    right.zeros = w.zeros + 16 * half;
    int4_rows4_half(x, kh, right, xsum, groups, bias ? bias + 16 * half : 0, out + 16 * half, ldo, cols + half, 0);
}

static inline void column_masks(int N, int p, __mmask16* cols) {
    for (int j = 0; j < NR; j++) {
        int left = N - p * PANEL - 16 * j;
        cols[j] = left >= 16 ? (__mmask16)0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
    }
}

/* rows m0 .. m0 + rows - 1 of x over bfloat16 panel p: out[:, p * PANEL ...] */
static inline void panel_rows(const uint32_t* x32, int m0, int rows, int kh, int p, Panel w, const float* bias,
                              const float* scale, uint16_t* out, int N, const __mmask16* cols) {
    const float* b = bias ? bias + (size_t)p * PANEL : 0;
    for (int m = 0; m < rows;) {
        const uint32_t* xm = x32 + (size_t)(m0 + m) * kh;
        uint16_t* om = out + (size_t)(m0 + m) * N + (size_t)p * PANEL;
        int left = rows - m;
        if (left >= 6) { micro_6(xm, kh, w, b, scale, om, N, cols, 0, 0); m += 6; }
        else if (left >= 4) { micro_4(xm, kh, w, b, scale, om, N, cols, 0, 0); m += 4; }
        else if (left >= 2) { micro_2(xm, kh, w, b, scale, om, N, cols, 0, 0); m += 2; }
        else { micro_1(xm, kh, w, b, scale, om, N, cols, 0, 0); m += 1; }
    }
}

/* Thread tid's share (of nt) of out[M, N] = x @ W^T (+ bias), called by every thread of a parallel region:
   per pass of rows, the (panel, row block) items [lo, hi) of an even cut. gemm_bf16 runs it in a region of its
   own; the fused decode step (decode_step.c) inside the region of its whole step. No barrier at the end: the
   caller's. K even. */
void gemm_bf16_share(const uint16_t* x, int M, int K, const uint16_t* packed, int N, const float* bias,
                     uint16_t* out, int tid, int nt) {
    int kh = K / 2, panels = (N + PANEL - 1) / PANEL;
    const uint32_t* x32 = (const uint32_t*)x;
    const uint32_t* w32 = (const uint32_t*)packed;
    for (int m0 = 0; m0 < M; m0 += ROWS_PER_PASS) {
        int rows = M - m0 < ROWS_PER_PASS ? M - m0 : ROWS_PER_PASS;
        int blocks = row_blocks(rows, panels, nt), items = panels * blocks;
        int lo = (int)((long)items * tid / nt), hi = (int)((long)items * (tid + 1) / nt);
        for (int it = lo; it < hi; it++) {
            int p = it / blocks, r0 = block_start(rows, blocks, it % blocks);
            const uint32_t* panel = w32 + (size_t)p * kh * PANEL;
            __mmask16 cols[NR];
            column_masks(N, p, cols);
            panel_rows(x32, m0 + r0, block_start(rows, blocks, it % blocks + 1) - r0, kh, p,
                       (Panel){panel, 0, 0, 0}, bias, 0, out, N, cols);
        }
    }
}

/* A quantized panel -> bfloat16 pairs in dst [kh][PANEL] */
static void dequant_panel(int bits, Panel w, int kh, uint32_t* dst) {
    int row_bytes = bits == 8 ? 2 * PANEL : PANEL;
    for (int kp = 0; kp < kh; kp++) {
        for (int l = 0; l < row_bytes; l += 64)
            _mm_prefetch((const char*)w.data + (size_t)kp * row_bytes + l + DEQUANT_PREFETCH, _MM_HINT_T0);
        for (int j = 0; j < NR; j++)
            _mm512_store_si512(dst + (size_t)kp * PANEL + 16 * j, (__m512i)(bits == 8 ? w_int8(w, kp, j)
                                                                                       : w_int4(w, kp, j)));
    }
}

/* Up to FUSED_ROWS rows, the micro kernels dequantize in registers (each call converts the panel once); more
   rows share one panel dequantized into L2. */
/* measured on the dev box: fused is faster up to 8 rows with INT8 and slower at 16; INT4 gains up to 4 rows
   (at 8, equal) */
enum { FUSED_ROWS = 8, FUSED_ROWS_INT4 = 4 };

static void fused_rows(int bits, const uint32_t* x32, int m0, int rows, int kh, int p, Panel w, const float* bias,
                       const float* scale, const float* xsum, uint16_t* out, int N, const __mmask16* cols) {
    const float* b = bias ? bias + (size_t)p * PANEL : 0;
    int rb = bits == 8 ? 2 * PANEL : PANEL;
    const char* pf = (const char*)w.data + DEQUANT_PREFETCH;
    for (int m = 0; m < rows;) {
        const uint32_t* xm = x32 + (size_t)(m0 + m) * kh;
        uint16_t* om = out + (size_t)(m0 + m) * N + (size_t)p * PANEL;
        int left = rows - m;
        if (bits == 8) {
            if (left >= 4) { micro_int8_4(xm, kh, w, b, scale, om, N, cols, pf, rb); m += 4; }
            else if (left >= 2) { micro_int8_2(xm, kh, w, b, scale, om, N, cols, pf, rb); m += 2; }
            else { micro_int8_1(xm, kh, w, b, scale, om, N, cols, pf, rb); m += 1; }
        } else {
            int groups = 2 * kh / w.group;
            const float* xs = xsum + (size_t)(m0 + m) * groups;
            if (left >= 4) { int4_rows4(xm, kh, w, xs, groups, b, om, N, cols, pf); m += 4; }
            else if (left >= 2) { int4_rows2(xm, kh, w, xs, groups, b, om, N, cols, pf); m += 2; }
            else { int4_rows1(xm, kh, w, xs, groups, b, om, N, cols, pf); m += 1; }
        }
        pf = 0; /* prefetched by the first pass */
    }
}

/* W8A16 (bits 8: q int8 [panels][kh][PANEL][2], scales [panels * PANEL]) or W4A16 (bits 4: q uint8
   [panels][kh][PANEL], scales and zeros float32 [panels][K / G][PANEL]) */
static int gemm_quantized(int bits, const uint16_t* x, int M, int K, const void* q, const float* scales,
                          const float* zeros, int G, int N, const float* bias, uint16_t* out) {
    if (K % 2 || (bits == 4 && (G <= 0 || G % 2 || K % G))) return -1;
    int kh = K / 2, panels = (N + PANEL - 1) / PANEL, groups = bits == 4 ? K / G : 0;
    size_t panel_bytes = (size_t)kh * PANEL * (bits == 8 ? 2 : 1);
    const uint32_t* x32 = (const uint32_t*)x;
    int failed = 0;
    int fused = M <= (bits == 8 ? FUSED_ROWS : FUSED_ROWS_INT4);
    /* INT4 with few rows: the rows' sums over each group (see DEFINE_MICRO_INT4) */
    float xsum_rows[FUSED_ROWS_INT4 * 1024]; /* K / G groups per row: K up to 64k */
    float* xsum = 0;
    if (bits == 4 && fused) {
        if ((size_t)M * groups > sizeof xsum_rows / sizeof *xsum_rows) return -1;
        xsum = xsum_rows;
        for (int m = 0; m < M; m++)
            for (int g = 0; g < groups; g++) {
                float t = 0.0f;
                for (int k = g * G; k < (g + 1) * G; k++) t += bf16_to_f32(x[(size_t)m * K + k]);
                xsum[(size_t)m * groups + g] = t;
            }
    }
    for (int m0 = 0; m0 < M; m0 += ROWS_PER_PASS) {
        int rows = M - m0 < ROWS_PER_PASS ? M - m0 : ROWS_PER_PASS;
        int par = (size_t)panels * (rows + 1) * K >= 32768; /* + 1: dequantizing a panel */
        _Pragma("omp parallel if (par)")
        {
            uint32_t* buf = fused ? 0 : thread_buffer(0, (size_t)kh * PANEL * 4);
            if (!fused && !buf) {
                _Pragma("omp atomic write")
                failed = 1;
            }
            _Pragma("omp for schedule(static)")
            for (int p = 0; p < panels; p++) {
                Panel w = {(const char*)q + (size_t)p * panel_bytes, bits == 4 ? scales + (size_t)p * groups * PANEL : 0,
                           bits == 4 ? zeros + (size_t)p * groups * PANEL : 0, G};
                const float* sc = bits == 8 ? scales + (size_t)p * PANEL : 0;
                __mmask16 cols[NR];
                column_masks(N, p, cols);
                if (fused) {
                    fused_rows(bits, x32, m0, rows, kh, p, w, bias, sc, xsum, out, N, cols);
                } else if (buf) {
                    dequant_panel(bits, w, kh, buf);
                    panel_rows(x32, m0, rows, kh, p, (Panel){buf, 0, 0, 0}, bias, sc, out, N, cols);
                }
            }
        }
    }
    return failed ? -2 : 0;
}

#else /* AVX2 + FMA (also an AVX-512 CPU without AVX512_BF16) */
/* AVX2 + FMA, no bfloat16 dot product: the same packed layout (panels of 64 columns whose row kp holds each
   column's pair), each group of 8 pairs widened to two float32 vectors (the even k's weights: a shift; the odd
   k's: a mask) and multiplied by x widened to float32 once per pass (a thread buffer, so each element is one
   broadcast load). Float32 FMA sums in k order; the bias (and, for INT8, the per-column scale) applied to
   the finished sums, then one rounding to bfloat16 (nearest even). Tiles: one row over all 8 groups (the
   panel streams front to back: decode), two rows over 4 groups, four over 2 (8 accumulators each). */
enum { PANEL = 64, GROUPS = PANEL / 8 };

/* Columns 8g .. 8g + 7 at pair row kp: the even k's and the odd k's weights as float32 */
static inline void w_pairs(const uint32_t* w, int kp, int g, __m256* even, __m256* odd) {
    __m256i v = _mm256_loadu_si256((const __m256i*)(w + (size_t)kp * PANEL + 8 * g));
    *even = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    *odd = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xffff0000u)));
}

/* MR rows of x (float32, ldx apart) over NC groups of 8 columns from group g0 of a panel: out[m][8g + c] =
   (sum_k x[m][k] w[k][8g + c]) (* scale) (+ bias), the first `valid` columns of the panel stored. bias and
   scale (when set) hold the panel's 64 columns. */
#define DEFINE_MICRO2(NAME, MR, NC)                                                                       \
static inline void NAME(const float* x, int ldx, int kh, const uint32_t* w, int g0, const float* bias,     \
                        const float* scale, uint16_t* out, int ldo, int valid) {                          \
    __m256 acc[MR][NC];                                                                                   \
    _Pragma("GCC unroll 8")                                                                               \
    for (int m = 0; m < MR; m++) {                                                                        \
        _Pragma("GCC unroll 8")                                                                           \
        for (int j = 0; j < NC; j++) acc[m][j] = _mm256_setzero_ps();                                     \
    }                                                                                                     \
    for (int kp = 0; kp < kh; kp++) {                                                                     \
        if (MR <= 2) { /* x broadcast once, then each group decoded and used (16 registers: no spills) */  \
            __m256 xe[MR], xo[MR];                                                                        \
            _Pragma("GCC unroll 2")                                                                       \
            for (int m = 0; m < MR; m++) {                                                                \
                xe[m] = _mm256_broadcast_ss(x + (size_t)m * ldx + 2 * kp);                                \
                xo[m] = _mm256_broadcast_ss(x + (size_t)m * ldx + 2 * kp + 1);                            \
            }                                                                                             \
            _Pragma("GCC unroll 8")                                                                       \
            for (int j = 0; j < NC; j++) {                                                                \
                __m256 we, wo;                                                                            \
                w_pairs(w, kp, g0 + j, &we, &wo);                                                         \
                _Pragma("GCC unroll 2")                                                                   \
                for (int m = 0; m < MR; m++)                                                              \
                    acc[m][j] = _mm256_fmadd_ps(xo[m], wo, _mm256_fmadd_ps(xe[m], we, acc[m][j]));        \
            }                                                                                             \
        } else {                                                                                          \
            __m256 we[NC], wo[NC];                                                                        \
            _Pragma("GCC unroll 8")                                                                       \
            for (int j = 0; j < NC; j++) w_pairs(w, kp, g0 + j, &we[j], &wo[j]);                          \
            _Pragma("GCC unroll 8")                                                                       \
            for (int m = 0; m < MR; m++) {                                                                \
                __m256 xe = _mm256_broadcast_ss(x + (size_t)m * ldx + 2 * kp);                            \
                __m256 xo = _mm256_broadcast_ss(x + (size_t)m * ldx + 2 * kp + 1);                        \
                _Pragma("GCC unroll 8")                                                                   \
                for (int j = 0; j < NC; j++)                                                              \
                    acc[m][j] = _mm256_fmadd_ps(xo, wo[j], _mm256_fmadd_ps(xe, we[j], acc[m][j]));        \
            }                                                                                             \
        }                                                                                                 \
    }                                                                                                     \
    _Pragma("GCC unroll 8")                                                                               \
    for (int j = 0; j < NC; j++) {                                                                        \
        int col = 8 * (g0 + j);                                                                           \
        if (col >= valid) break;                                                                          \
        __m256 bj = bias ? _mm256_loadu_ps(bias + col) : _mm256_setzero_ps();                             \
        __m256 sj = scale ? _mm256_loadu_ps(scale + col) : _mm256_setzero_ps();                           \
        _Pragma("GCC unroll 8")                                                                           \
        for (int m = 0; m < MR; m++) {                                                                    \
            __m256 v = scale ? _mm256_mul_ps(acc[m][j], sj) : acc[m][j];                                  \
            if (bias) v = _mm256_add_ps(v, bj);                                                           \
            uint16_t* o = out + (size_t)m * ldo + col;                                                    \
            if (col + 8 <= valid) {                                                                       \
                store_bf16x8(o, v);                                                                       \
            } else {                                                                                      \
                uint16_t tmp[8];                                                                          \
                store_bf16x8(tmp, v);                                                                     \
                memcpy(o, tmp, sizeof(uint16_t) * (size_t)(valid - col));                                 \
            }                                                                                             \
        }                                                                                                 \
    }                                                                                                     \
}

DEFINE_MICRO2(micro2_4x2, 4, 2)
DEFINE_MICRO2(micro2_2x4, 2, 4)
DEFINE_MICRO2(micro2_1x8, 1, GROUPS)

/* rows r0 .. r0 + rows - 1 of the pass's x (float32 [*, K]) over one panel (bfloat16 pairs [kh][PANEL]):
   out (the pass's first row, the panel's first column) rows r0 ..; bias and scale: the panel's columns or
   NULL; valid: the panel's real columns (PANEL but in the last one) */
static void panel_rows2(const float* xf, int r0, int rows, int K, const uint32_t* w, const float* bias,
                        const float* scale, uint16_t* out, int N, int valid) {
    float bpad[PANEL], spad[PANEL]; /* the last panel's bias and scale, zero past its real columns */
    if (valid < PANEL) {
        for (int c = 0; c < PANEL; c++) {
            bpad[c] = bias && c < valid ? bias[c] : 0.0f;
            spad[c] = scale && c < valid ? scale[c] : 0.0f;
        }
        bias = bias ? bpad : 0;
        scale = scale ? spad : 0;
    }
    int kh = K / 2, groups = (valid + 7) / 8;
    for (int m = r0; m < r0 + rows;) {
        const float* xm = xf + (size_t)m * K;
        uint16_t* om = out + (size_t)m * N;
        int left = r0 + rows - m;
        if (left >= 4) {
            for (int g = 0; g < groups; g += 2) micro2_4x2(xm, K, kh, w, g, bias, scale, om, N, valid);
            m += 4;
        } else if (left >= 2) {
            for (int g = 0; g < groups; g += 4) micro2_2x4(xm, K, kh, w, g, bias, scale, om, N, valid);
            m += 2;
        } else {
            micro2_1x8(xm, K, kh, w, 0, bias, scale, om, N, valid);
            m += 1;
        }
    }
}

/* rows of bfloat16 x [rows, K] as float32 in this thread's buffer (exact); NULL without memory */
static float* widen_rows(const uint16_t* x, int rows, int K) {
    size_t n = (size_t)rows * K, i = 0;
    float* xf = thread_buffer(1, n * sizeof(float));
    if (!xf) return 0;
    for (; i + 8 <= n; i += 8) _mm256_store_ps(xf + i, load_bf16x8(x + i));
    for (; i < n; i++) xf[i] = bf16_to_f32(x[i]);
    return xf;
}

void gemm_bf16_share(const uint16_t* x, int M, int K, const uint16_t* packed, int N, const float* bias,
                     uint16_t* out, int tid, int nt) {
    int kh = K / 2, panels = (N + PANEL - 1) / PANEL;
    const uint32_t* w32 = (const uint32_t*)packed;
    for (int m0 = 0; m0 < M; m0 += ROWS_PER_PASS) {
        int rows = M - m0 < ROWS_PER_PASS ? M - m0 : ROWS_PER_PASS;
        int blocks = row_blocks(rows, panels, nt), items = panels * blocks;
        int lo = (int)((long)items * tid / nt), hi = (int)((long)items * (tid + 1) / nt);
        if (lo >= hi) continue;
        const float* xf = widen_rows(x + (size_t)m0 * K, rows, K);
        if (!xf) { /* a few hundred KB at most; the share has no error path (it runs inside the fused step) */
            fprintf(stderr, "gemm_bf16: out of memory widening x\n");
            abort();
        }
        for (int it = lo; it < hi; it++) {
            int p = it / blocks, r0 = block_start(rows, blocks, it % blocks);
            int valid = N - p * PANEL < PANEL ? N - p * PANEL : PANEL;
            panel_rows2(xf, r0, block_start(rows, blocks, it % blocks + 1) - r0, K, w32 + (size_t)p * kh * PANEL,
                        bias ? bias + (size_t)p * PANEL : 0, 0, out + (size_t)m0 * N + (size_t)p * PANEL, N, valid);
        }
    }
}

/* 8 float32 pairs' halves -> 8 bfloat16 pairs (even | odd << 16), each rounded to nearest even */
static inline __m256i pairs_bf16(__m256 even, __m256 odd) {
    return _mm256_or_si256(bf16_bits8(even), _mm256_slli_epi32(bf16_bits8(odd), 16));
}

/* A quantized panel -> bfloat16 pairs in dst [kh][PANEL]: INT8 [kh][PANEL][2] the integers (exact); INT4
   [kh][PANEL] bytes (low nibble k = 2kp, high 2kp + 1) as ((q - zero) * scale) rounded to bfloat16 */
static void dequant_panel(int bits, Panel w, int kh, uint32_t* dst) {
    int row_bytes = bits == 8 ? 2 * PANEL : PANEL;
    for (int kp = 0; kp < kh; kp++) {
        for (int l = 0; l < row_bytes; l += 64)
            _mm_prefetch((const char*)w.data + (size_t)kp * row_bytes + l + DEQUANT_PREFETCH, _MM_HINT_T0);
        for (int g = 0; g < GROUPS; g++) {
            __m256i v;
            if (bits == 8) { /* 8 pairs = 16 bytes; as int16 lanes: each pair's even byte low, odd byte high */
                __m256i q = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i*)((const int8_t*)w.data
                                                                                   + ((size_t)kp * PANEL + 8 * g) * 2)));
                __m256i even = _mm256_srai_epi32(_mm256_slli_epi32(q, 16), 16), odd = _mm256_srai_epi32(q, 16);
                v = pairs_bf16(_mm256_cvtepi32_ps(even), _mm256_cvtepi32_ps(odd));
            } else {
                size_t at = (size_t)(2 * kp / w.group) * PANEL + 8 * g;
                __m256i d = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)((const uint8_t*)w.data
                                                                                  + (size_t)kp * PANEL + 8 * g)));
                __m256 s = _mm256_loadu_ps(w.scales + at), z = _mm256_loadu_ps(w.zeros + at);
                __m256 w0 = _mm256_mul_ps(_mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_and_si256(d, _mm256_set1_epi32(15))), z), s);
                __m256 w1 = _mm256_mul_ps(_mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(d, 4)), z), s);
                v = pairs_bf16(w0, w1);
            }
            _mm256_store_si256((__m256i*)(dst + (size_t)kp * PANEL + 8 * g), v);
        }
    }
}

/* W8A16 / W4A16 (layouts as in the AVX-512 section): per panel, dequantized into this thread's bfloat16
   panel (it stays in L2), then every row of the pass over it */
static int gemm_quantized(int bits, const uint16_t* x, int M, int K, const void* q, const float* scales,
                          const float* zeros, int G, int N, const float* bias, uint16_t* out) {
    if (K % 2 || (bits == 4 && (G <= 0 || G % 2 || K % G))) return -1;
    int kh = K / 2, panels = (N + PANEL - 1) / PANEL, groups = bits == 4 ? K / G : 0;
    size_t panel_bytes = (size_t)kh * PANEL * (bits == 8 ? 2 : 1);
    int failed = 0;
    for (int m0 = 0; m0 < M; m0 += ROWS_PER_PASS) {
        int rows = M - m0 < ROWS_PER_PASS ? M - m0 : ROWS_PER_PASS;
        int par = (size_t)panels * (rows + 1) * K >= 32768; /* + 1: dequantizing a panel */
        _Pragma("omp parallel if (par)")
        {
            uint32_t* buf = thread_buffer(0, (size_t)kh * PANEL * 4);
            const float* xf = buf ? widen_rows(x + (size_t)m0 * K, rows, K) : 0;
            if (!xf) {
                _Pragma("omp atomic write")
                failed = 1;
            }
            _Pragma("omp for schedule(static)")
            for (int p = 0; p < panels; p++) {
                if (!xf) continue;
                Panel w = {(const char*)q + (size_t)p * panel_bytes, bits == 4 ? scales + (size_t)p * groups * PANEL : 0,
                           bits == 4 ? zeros + (size_t)p * groups * PANEL : 0, G};
                int valid = N - p * PANEL < PANEL ? N - p * PANEL : PANEL;
                dequant_panel(bits, w, kh, buf);
                panel_rows2(xf, 0, rows, K, buf, bias ? bias + (size_t)p * PANEL : 0,
                            bits == 8 ? scales + (size_t)p * PANEL : 0, out + (size_t)m0 * N + (size_t)p * PANEL, N,
                            valid);
            }
        }
    }
    return failed ? -2 : 0;
}
#endif

int gemm_bf16(const uint16_t* x, int M, int K, const uint16_t* packed, int N, const float* bias, uint16_t* out) {
    if (K % 2) return -1;
    int panels = (N + PANEL - 1) / PANEL, first = M < ROWS_PER_PASS ? M : ROWS_PER_PASS;
    int par = (size_t)panels * first * K >= 32768;
    _Pragma("omp parallel if (par)")
    gemm_bf16_share(x, M, K, packed, N, bias, out, omp_get_thread_num(), omp_get_num_threads());
    return 0;
}

int gemm_w8a16(const uint16_t* x, int M, int K, const int8_t* q, const float* scales, int N, const float* bias,
               uint16_t* out) {
    return gemm_quantized(8, x, M, K, q, scales, 0, 0, N, bias, out);
}

int gemm_w4a16(const uint16_t* x, int M, int K, const uint8_t* q, const float* scales, const float* zeros, int G,
               int N, const float* bias, uint16_t* out) {
    return gemm_quantized(4, x, M, K, q, scales, zeros, G, N, bias, out);
}

#else
int gemm_bf16(const uint16_t* x, int M, int K, const uint16_t* packed, int N, const float* bias, uint16_t* out) {
    (void)x; (void)M; (void)K; (void)packed; (void)N; (void)bias; (void)out;
    return -1;
}
int gemm_w8a16(const uint16_t* x, int M, int K, const int8_t* q, const float* scales, int N, const float* bias,
               uint16_t* out) {
    (void)x; (void)M; (void)K; (void)q; (void)scales; (void)N; (void)bias; (void)out;
    return -1;
}
int gemm_w4a16(const uint16_t* x, int M, int K, const uint8_t* q, const float* scales, const float* zeros, int G,
               int N, const float* bias, uint16_t* out) {
    (void)x; (void)M; (void)K; (void)q; (void)scales; (void)zeros; (void)G; (void)N; (void)bias; (void)out;
    return -1;
}
#endif

int gemm_bf16_available(void) { return HAVE_GEMM_BF16; }
