/* LoRA updates of one row, for the fused decode step (decode_step.c): the row's adapter slot's stacked weights as
 * worker/runner/lora/model.py lays them out (a [slots, n*R, in], b [slots, out, R]: n output slices, each with
 * its own rank-R part; smaller ranks zero-padded, the PEFT scale folded into b).
 *
 *   shrink: y[k] = a[s, k] . x           (k < n*R; float32 sums, y kept in float32)
 *   expand: out[j] += b[s, j] . y[i*R : (i+1)*R]   for the output rows j in [j0, j1) of slice i
 *
 * The same computation as kernels/lora.py's (one rounding of out per row: out + update, summed in float32).
 *
 * Both are dot products of consecutive weight rows with one vector, computed a block of rows at a time (16 with
 * AVX-512, 8 with AVX2): one accumulator per row, the vector loaded once per step of the loop, then the block's
 * accumulators summed across their lanes together (a transpose-and-add tree). Row by row, an expand's rank-16 dot
 * is one multiply and a horizontal sum: that cost ~35 ms of a 70 ms 32-row float32 step with 8 adapters on every
 * projection (one thread, the default model), about four times what this takes. */
#include "simd.h"

#if HAVE_AVX512
#define BLOCK 16
typedef __m512 vec;
#define VZERO _mm512_setzero_ps()
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VLOAD_F32(p) _mm512_loadu_ps(p)
#define VLOAD_BF16(p) load_bf16x16(p)
/* v[0..15] -> one vector of their 16 lane sums, in order */
static inline vec block_sums(vec* v) {
    vec s1[8], s2[4], s3[2];
    for (int i = 0; i < 8; i++)
        s1[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++)
        s2[i] = _mm512_add_ps(_mm512_shuffle_ps(s1[2 * i], s1[2 * i + 1], 0x44),
                              _mm512_shuffle_ps(s1[2 * i], s1[2 * i + 1], 0xEE));
    for (int i = 0; i < 2; i++)
        s3[i] = _mm512_add_ps(_mm512_shuffle_f32x4(s2[2 * i], s2[2 * i + 1], 0x88),
                              _mm512_shuffle_f32x4(s2[2 * i], s2[2 * i + 1], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(s3[0], s3[1], 0x88), _mm512_shuffle_f32x4(s3[0], s3[1], 0xDD));
}
#define VSTORE(p, v) _mm512_storeu_ps(p, v)
#elif HAVE_AVX2_FMA
#define BLOCK 8
typedef __m256 vec;
#define VZERO _mm256_setzero_ps()
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VLOAD_F32(p) _mm256_loadu_ps(p)
#define VLOAD_BF16(p) load_bf16x8(p)
/* v[0..7] -> one vector of their 8 lane sums, in order */
static inline vec block_sums(vec* v) {
    __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}
#define VSTORE(p, v) _mm256_storeu_ps(p, v)
#else
#define BLOCK 0 /* the portable build: row by row */
#endif

#define LOAD_F32(v) (v)
#define STORE_F32(v) (v)

/* sums[m] = w[m * stride : + n] . x[0 : n] for the `rows` rows of w (w of type TW, x of type TX) */
#define DEFINE_DOTS(NAME, TW, TX, LOADW, LOADX, VLOADW, VLOADX)                                                 \
static void NAME(const TW* w, size_t stride, const TX* x, int n, int rows, float* sums) {                       \
    int m = 0;                                                                                                  \
    DOTS_BLOCKS(TW, VLOADW, VLOADX, LOADW, LOADX)                                                               \
    for (; m < rows; m++) {                                                                                     \
        const TW* wm = w + (size_t)m * stride;                                                                  \
        float s = 0.0f;                                                                                         \
        for (int i = 0; i < n; i++) s += LOADW(wm[i]) * LOADX(x[i]);                                            \
        sums[m] = s;                                                                                            \
    }                                                                                                           \
}

#if BLOCK
#define DOTS_BLOCKS(TW, VLOADW, VLOADX, LOADW, LOADX)                                                           \
    const int whole = n / BLOCK * BLOCK;                                                                        \
    for (; m + BLOCK <= rows; m += BLOCK) {                                                                     \
        const TW* wm = w + (size_t)m * stride;                                                                  \
        vec acc[BLOCK];                                                                                         \
        for (int b = 0; b < BLOCK; b++) acc[b] = VZERO;                                                         \
        for (int i = 0; i < whole; i += BLOCK) {                                                                \
            vec xv = VLOADX(x + i);                                                                             \
            for (int b = 0; b < BLOCK; b++) acc[b] = VFMA(VLOADW(wm + (size_t)b * stride + i), xv, acc[b]);     \
        }                                                                                                       \
        VSTORE(sums + m, block_sums(acc));                                                                      \
        for (int b = 0; b < BLOCK; b++) /* the tail of n, if any */                                            \
            for (int i = whole; i < n; i++) sums[m + b] += LOADW(wm[(size_t)b * stride + i]) * LOADX(x[i]);           \
    }
#else
#define DOTS_BLOCKS(TW, VLOADW, VLOADX, LOADW, LOADX)
#endif

DEFINE_DOTS(dots_f32, float, float, LOAD_F32, LOAD_F32, VLOAD_F32, VLOAD_F32)
DEFINE_DOTS(dots_bf16, uint16_t, uint16_t, bf16_to_f32, bf16_to_f32, VLOAD_BF16, VLOAD_BF16)
DEFINE_DOTS(dots_bf16_f32, uint16_t, float, bf16_to_f32, LOAD_F32, VLOAD_BF16, VLOAD_F32)

/* y [k] = a [k, in] @ x [in] */
void lora_shrink_row_f32(const float* x, int in, const float* a, int k, float* y) { dots_f32(a, in, x, in, k, y); }
void lora_shrink_row_bf16(const uint16_t* x, int in, const uint16_t* a, int k, float* y) {
    dots_bf16(a, in, x, in, k, y);
}

/* out[j] += b[j, :rank] . y for j in [j0, j1), a block of rows at a time */
#define EXPAND_CHUNK 64
#define DEFINE_EXPAND(S, T, DOTS, LOAD, STORE)                                                                  \
void lora_expand_rows_##S(const float* y, const T* b, int rank, T* out, int j0, int j1) {                       \
    float sums[EXPAND_CHUNK];                                                                                   \
    for (int j = j0; j < j1; j += EXPAND_CHUNK) {                                                               \
        int rows = j1 - j < EXPAND_CHUNK ? j1 - j : EXPAND_CHUNK;                                               \
        DOTS(b + (size_t)j * rank, rank, y, rank, rows, sums);                                                  \
        for (int m = 0; m < rows; m++) out[j + m] = STORE(LOAD(out[j + m]) + sums[m]);                          \
    }                                                                                                           \
}
DEFINE_EXPAND(f32, float, dots_f32, LOAD_F32, STORE_F32)
DEFINE_EXPAND(bf16, uint16_t, dots_bf16_f32, bf16_to_f32, f32_to_bf16)
