/* Paged decode attention for the CPU: one query token per sequence, K/V read in place from the block pool.
 *
 * Layouts: q and out [B, H, D]; caches [num_blocks, bs, KVH, D]; tables [B, max_blocks]; lens [B].
 * q, the caches and out share one element type (float32 or bfloat16); all arithmetic is float32.
 *
 * Work is split over sequences (rows); the g = H / KVH query heads of a KV head share every K/V row they
 * read. Two implementations:
 *   - AVX-512 (compiled with -march=native on a CPU that has it; D = 64 or 128): blocks are read whole, as
 *     contiguous streams, prefetched well ahead (see DEFINE_AVX512); scores of 16 tokens are summed with one
 *     transpose-add tree instead of a horizontal reduction per dot product; bfloat16 dot products use
 *     VDPBF16PS where the CPU has AVX512_BF16 (exact bf16 x bf16 products, float32 sums); the exponential
 *     is a vector polynomial; the output accumulators of up to 16 / (D / 16) heads stay in registers while
 *     a block's V rows stream by.
 *   - AVX2 + FMA without AVX-512 (any D that is a multiple of 8): the same block streams over 8-lane vectors,
 *     scores of 8 tokens summed by one horizontal-add tree, bfloat16 widened to float32 (see DEFINE_AVX2).
 *   - portable C for everything else (any D), vectorized by the compiler.
 */
#include "simd.h"

/* ---------------------------------------------------------------- portable path */

#define DEFINE_GENERIC(NAME, T, LOAD, STORE)                                                          \
static void NAME(const T* q, const T* kc, const T* vc, const int32_t* table, int len, T* out, int kh,  \
                 int g, int KVH, int D, int bs, float scale, float* s, float* qf, float* acc) {        \
    size_t row = (size_t)KVH * D;                                                                     \
    for (int i = 0; i < g * D; i++) qf[i] = LOAD(q[(size_t)kh * g * D + i]);                          \
    for (int p0 = 0, blk = 0; p0 < len; p0 += bs, blk++) {                                            \
        int n = len - p0 < bs ? len - p0 : bs;                                                        \
        const T* kb = kc + (size_t)table[blk] * bs * row + (size_t)kh * D;                            \
        for (int t = 0; t < n; t++) {                                                                 \
            const T* kr = kb + t * row;                                                               \
            for (int h = 0; h < g; h++) {                                                             \
                const float* qq = qf + (size_t)h * D;                                                 \
                float a = 0.f;                                                                        \
                _Pragma("omp simd reduction(+:a)")                                                    \
                for (int d = 0; d < D; d++) a += qq[d] * LOAD(kr[d]);                                 \
                s[(size_t)h * len + p0 + t] = a * scale;                                              \
            }                                                                                         \
        }                                                                                             \
    }                                                                                                 \
    for (int h = 0; h < g; h++) {                                                                     \
        float* sh = s + (size_t)h * len;                                                              \
        float m = -INFINITY, sum = 0.f;                                                               \
        for (int p = 0; p < len; p++) m = sh[p] > m ? sh[p] : m;                                      \
        _Pragma("omp simd reduction(+:sum)")                                                          \
        for (int p = 0; p < len; p++) { sh[p] = expf(sh[p] - m); sum += sh[p]; }                      \
        float inv = 1.f / sum;                                                                        \
        for (int p = 0; p < len; p++) sh[p] *= inv;                                                   \
    }                                                                                                 \
    memset(acc, 0, sizeof(float) * (size_t)g * D);                                                    \
    for (int p0 = 0, blk = 0; p0 < len; p0 += bs, blk++) {                                            \
        int n = len - p0 < bs ? len - p0 : bs;                                                        \
        const T* vb = vc + (size_t)table[blk] * bs * row + (size_t)kh * D;                            \
        for (int t = 0; t < n; t++) {                                                                 \
            const T* vr = vb + t * row;                                                               \
            for (int h = 0; h < g; h++) {                                                             \
                float w = s[(size_t)h * len + p0 + t];                                                \
                float* oo = acc + (size_t)h * D;                                                      \
                _Pragma("omp simd")                                                                   \
                for (int d = 0; d < D; d++) oo[d] += w * LOAD(vr[d]);                                 \
            }                                                                                         \
        }                                                                                             \
    }                                                                                                 \
    for (int i = 0; i < g * D; i++) out[(size_t)kh * g * D + i] = STORE(acc[i]);                      \
}

#define ID(x) (x)
DEFINE_GENERIC(item_generic_f32, float, ID, ID)
DEFINE_GENERIC(item_generic_bf16, uint16_t, bf16_to_f32, f32_to_bf16)

/* ---------------------------------------------------------------- AVX-512 path */

#if HAVE_AVX512
/* r[i] = sum of the 16 lanes of v[i]: a transpose-add tree, 45 instructions for 16 sums. */
static inline __m512 reduce16(const __m512* v) {
    __m512 u[8], w[4], x0, x1;
    for (int i = 0; i < 8; i++)
        u[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int i = 0; i < 4; i++) {
        __m512d a = _mm512_castps_pd(u[2 * i]), b = _mm512_castps_pd(u[2 * i + 1]);
        w[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    }
    x0 = _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], 0x88), _mm512_shuffle_f32x4(w[0], w[1], 0xdd));
    x1 = _mm512_add_ps(_mm512_shuffle_f32x4(w[2], w[3], 0x88), _mm512_shuffle_f32x4(w[2], w[3], 0xdd));
    return _mm512_add_ps(_mm512_shuffle_f32x4(x0, x1, 0x88), _mm512_shuffle_f32x4(x0, x1, 0xdd));
}

/* Dot products of one query head (NC 16-lane chunks, already in registers) with one K row. */
static inline __m512 dot_f32(const __m512* qv, const float* kr, int nc) {
    __m512 a = _mm512_mul_ps(qv[0], _mm512_loadu_ps(kr));
    for (int c = 1; c < nc; c++) a = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(kr + 16 * c), a);
    return a;
}

#if defined(__AVX512BF16__)
typedef __m512bh qvec_bf16;
static inline qvec_bf16 qload_bf16(const uint16_t* q) { return (__m512bh)_mm512_loadu_si512(q); }
static inline __m512 dot_bf16(const qvec_bf16* qv, const uint16_t* kr, int nc) { /* nc = D / 32 */
    __m512 a = _mm512_dpbf16_ps(_mm512_setzero_ps(), qv[0], (__m512bh)_mm512_loadu_si512(kr));
    for (int c = 1; c < nc; c++) a = _mm512_dpbf16_ps(a, qv[c], (__m512bh)_mm512_loadu_si512(kr + 32 * c));
    return a;
}
#else
typedef __m512i qvec_bf16;
static inline qvec_bf16 qload_bf16(const uint16_t* q) { return _mm512_loadu_si512(q); }
static inline __m512 dot_bf16(const qvec_bf16* qv, const uint16_t* kr, int nc) {
    __m512 a = _mm512_setzero_ps();
    for (int c = 0; c < nc; c++) {
        __m512i k = _mm512_loadu_si512(kr + 32 * c);
        a = _mm512_fmadd_ps(bf16_even(qv[c]), bf16_even(k), a);
        a = _mm512_fmadd_ps(bf16_odd(qv[c]), bf16_odd(k), a);
    }
    return a;
}
#endif

/* softmax numerators in place over s[0..len); returns 1 / their sum */
static inline float softmax_row(float* s, int len) {
    __m512 m = _mm512_set1_ps(-INFINITY);
    int p = 0;
    for (; p + 16 <= len; p += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(s + p));
    if (p < len) m = _mm512_mask_max_ps(m, (__mmask16)((1u << (len - p)) - 1), m, _mm512_loadu_ps(s + p));
    __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(m)), sum = _mm512_setzero_ps();
    for (p = 0; p + 16 <= len; p += 16) {
        __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(s + p), mx));
        _mm512_storeu_ps(s + p, e);
        sum = _mm512_add_ps(sum, e);
    }
    if (p < len) {
        __mmask16 k = (__mmask16)((1u << (len - p)) - 1);
        __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + p), mx));
        _mm512_mask_storeu_ps(s + p, k, e);
        sum = _mm512_mask_add_ps(sum, k, sum, e);
    }
    return 1.f / _mm512_reduce_add_ps(sum);
}

static inline void prefetch_lines(const void* p, size_t bytes) {
    for (size_t i = 0; i < bytes; i += 64) _mm_prefetch((const char*)p + i, _MM_HINT_T0);
}
static inline void prefetch_lines_l2(const void* p, size_t bytes) {
    for (size_t i = 0; i < bytes; i += 64) _mm_prefetch((const char*)p + i, _MM_HINT_T1);
}
/* How many blocks ahead the K pass prefetches K into L2 (one block, 6-12 KB, is too short a lead to keep
   enough misses in flight: 1.6x slower; 2-8 measured within noise of each other). */
#define PA_AHEAD 4
/* the next block is prefetched in H shares, one per head processed, so the requests spread over the block's
   compute instead of arriving in one burst (bytes per share, whole cache lines) */
#define PREFETCH_SHARE(tokens_left, H, ELEM)                                                            \
    (((ELEM) * row * (size_t)((tokens_left) < bs ? (tokens_left) : bs) + 64 * (size_t)(H) - 1) /    \
     (64 * (size_t)(H)) * 64)

/* One sequence, all KV heads, block by block: each block's K (then V) rows are read as one contiguous
   stream (decode attention is bound by memory once the weights of a step have flushed the caches). The K
   pass prefetches K PA_AHEAD blocks ahead and the V block of the same position into L2, so the V pass reads
   from L2 (with the next block prefetched into L1) and leaves the memory free for ntable's first K blocks:
   the next row this thread will take (null: none). NC = D / 16 chunks per row; HT = heads whose accumulators stay in
   registers while a block's V rows stream by. s: [H][len] scores, o: [H][D] float32 partial outputs. */
#define DEFINE_AVX512(NAME, T, NC, IS_BF16)                                                            \
static void NAME(const T* qb, const T* kc, const T* vc, const int32_t* table, int len, T* ob, int H,    \
                 int KVH, int row_kvh, int bs, float scale, float* s, float* o, const int32_t* ntable,  \
                 int nlen) {                                                                            \
    enum { D = NC * 16, HT = 16 / NC };                                                                 \
    int g = H / KVH;                                                                                    \
    size_t row = (size_t)row_kvh * D, block = (size_t)bs * row;                                         \
    for (int p0 = 0, blk = 0; p0 < len; p0 += bs, blk++) {                                              \
        int n = len - p0 < bs ? len - p0 : bs;                                                          \
        const T* kb = kc + (size_t)table[blk] * block;                                                  \
        int pb = blk + PA_AHEAD, np_ = len - pb * bs;                                                   \
        const char* kfar = np_ > 0 ? (const char*)(kc + (size_t)table[pb] * block) : 0;                 \
        size_t kfar_share = kfar ? PREFETCH_SHARE(np_, H, sizeof(T)) : 0;                               \
        const char* vnow = (const char*)(vc + (size_t)table[blk] * block);                              \
        size_t vshare = PREFETCH_SHARE(n, H, sizeof(T));                                                \
        if (blk == 0)                                                                                   \
            for (int a = 1; a < PA_AHEAD && a * bs < len; a++)                                          \
                prefetch_lines_l2(kc + (size_t)table[a] * block,                                        \
                                  sizeof(T) * row * (size_t)(len - a * bs < bs ? len - a * bs : bs));   \
        for (int h = 0; h < H; h++) {                                                                   \
            if (kfar) prefetch_lines_l2(kfar + h * kfar_share, kfar_share);                             \
            prefetch_lines_l2(vnow + h * vshare, vshare);                                               \
            const T* kh_base = kb + (size_t)(h / g) * D;                                                \
            QREGS_##IS_BF16(NC)                                                                         \
            for (int t0 = 0; t0 < n; t0 += 16) {                                                        \
                int m = n - t0 < 16 ? n - t0 : 16;                                                      \
                __m512 acc[16];                                                                         \
                _Pragma("GCC unroll 16")                                                                \
                for (int t = 0; t < 16; t++)                                                            \
                    acc[t] = t < m ? DOT_##IS_BF16(qv, kh_base + (size_t)(t0 + t) * row, NC) : _mm512_setzero_ps(); \
                __m512 r = _mm512_mul_ps(reduce16(acc), _mm512_set1_ps(scale));                         \
                _mm512_mask_storeu_ps(s + (size_t)h * len + p0 + t0, (__mmask16)((1u << m) - 1), r);    \
            }                                                                                           \
        }                                                                                               \
    }                                                                                                   \
    float inv[H];                                                                                       \
    for (int h = 0; h < H; h++) inv[h] = softmax_row(s + (size_t)h * len, len);                        \
    memset(o, 0, sizeof(float) * (size_t)H * D);                                                        \
    for (int p0 = 0, blk = 0; p0 < len; p0 += bs, blk++) {                                              \
        int n = len - p0 < bs ? len - p0 : bs;                                                          \
        const T* vb = vc + (size_t)table[blk] * block;                                                  \
        if (ntable && blk < PA_AHEAD && blk * bs < nlen)                                                \
            prefetch_lines_l2(kc + (size_t)ntable[blk] * block,                                         \
                              sizeof(T) * row * (size_t)(nlen - blk * bs < bs ? nlen - blk * bs : bs)); \
        const char* next = p0 + bs < len ? (const char*)(vc + (size_t)table[blk + 1] * block) : 0;      \
        size_t share = next ? PREFETCH_SHARE(len - p0 - bs, H, sizeof(T)) : 0;                                 \
        for (int h0 = 0, ht; h0 < H; h0 += ht) {                                                        \
            if (next) prefetch_lines(next + h0 * share, share * HT);                                    \
            /* a tile of heads never straddles two KV heads: it ends at the group's end */              \
            int group_end = (h0 / g + 1) * g;                                                           \
            ht = group_end - h0 < HT ? group_end - h0 : HT;                                             \
            const T* vh_base = vb + (size_t)(h0 / g) * D;                                               \
            __m512 acc[HT][NC];                                                                         \
            _Pragma("GCC unroll 16")                                                                    \
            for (int i = 0; i < HT; i++)                                                                \
                if (i < ht)                                                                             \
                    for (int c = 0; c < NC; c++) acc[i][c] = _mm512_loadu_ps(o + (size_t)(h0 + i) * D + 16 * c); \
            for (int t = 0; t < n; t++) {                                                               \
                const T* vr = vh_base + (size_t)t * row;                                                \
                VROW_##IS_BF16(NC)                                                                      \
                _Pragma("GCC unroll 16")                                                                \
                for (int i = 0; i < HT; i++) {                                                          \
                    if (i < ht) {                                                                       \
                        __m512 w = _mm512_set1_ps(s[(size_t)(h0 + i) * len + p0 + t]);                  \
                        _Pragma("GCC unroll 8")                                                         \
                        for (int c = 0; c < NC; c++) acc[i][c] = _mm512_fmadd_ps(w, vv[c], acc[i][c]); \
                    }                                                                                   \
                }                                                                                       \
            }                                                                                           \
            _Pragma("GCC unroll 16")                                                                    \
            for (int i = 0; i < HT; i++)                                                                \
                if (i < ht)                                                                             \
                    for (int c = 0; c < NC; c++) _mm512_storeu_ps(o + (size_t)(h0 + i) * D + 16 * c, acc[i][c]); \
        }                                                                                               \
    }                                                                                                   \
    for (int h = 0; h < H; h++) {                                                                       \
        __m512 sc = _mm512_set1_ps(inv[h]), a[NC];                                                      \
        for (int c = 0; c < NC; c++) a[c] = _mm512_loadu_ps(o + (size_t)h * D + 16 * c);                \
        T* dst = ob + (size_t)h * D;                                                                    \
        STORE_##IS_BF16(NC)                                                                             \
    }                                                                                                   \
}

/* float32 pieces */
#define QREGS_0(NC) __m512 qv[NC]; for (int c = 0; c < NC; c++) qv[c] = _mm512_loadu_ps(qb + (size_t)h * D + 16 * c);
#define DOT_0(qv, kr, NC) dot_f32(qv, kr, NC)
#define VROW_0(NC) __m512 vv[NC]; for (int c = 0; c < NC; c++) vv[c] = _mm512_loadu_ps(vr + 16 * c);
#define STORE_0(NC) for (int c = 0; c < NC; c++) _mm512_storeu_ps(dst + 16 * c, _mm512_mul_ps(a[c], sc));

/* bfloat16 pieces: V rows are split into even and odd elements (vv[2c], vv[2c+1]), so the accumulators
   hold the output de-interleaved; STORE puts the elements back in order and rounds to bfloat16. */
#define QREGS_1(NC) qvec_bf16 qv[NC / 2]; for (int c = 0; c < NC / 2; c++) qv[c] = qload_bf16(qb + (size_t)h * D + 32 * c);
#define DOT_1(qv, kr, NC) dot_bf16(qv, kr, NC / 2)
#define VROW_1(NC) __m512 vv[NC];                                                                       \
    for (int c = 0; c < NC / 2; c++) {                                                                  \
        __m512i x = _mm512_loadu_si512(vr + 32 * c);                                                    \
        vv[2 * c] = bf16_even(x); vv[2 * c + 1] = bf16_odd(x);                                          \
    }
#define STORE_1(NC)                                                                                     \
    for (int c = 0; c < NC / 2; c++) {                                                                  \
        const __m512i lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);    \
        const __m512i hi = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8); \
        __m512 e = _mm512_mul_ps(a[2 * c], sc), od = _mm512_mul_ps(a[2 * c + 1], sc);                   \
        store_bf16(dst + 32 * c, _mm512_permutex2var_ps(e, lo, od));                                    \
        store_bf16(dst + 32 * c + 16, _mm512_permutex2var_ps(e, hi, od));                               \
    }

DEFINE_AVX512(item_avx512_f32_d64, float, 4, 0)
DEFINE_AVX512(item_avx512_f32_d128, float, 8, 0)
DEFINE_AVX512(item_avx512_bf16_d64, uint16_t, 4, 1)
DEFINE_AVX512(item_avx512_bf16_d128, uint16_t, 8, 1)
#endif

/* ---------------------------------------------------------------- AVX2 path */

#if HAVE_AVX2
static inline void prefetch_rows_l2(const void* p, size_t bytes) {
    for (size_t i = 0; i < bytes; i += 64) _mm_prefetch((const char*)p + i, _MM_HINT_T1);
}

/* r[i] = sum of the 8 lanes of v[i] */
static inline __m256 reduce8(const __m256* v) {
    __m256 t0 = _mm256_hadd_ps(v[0], v[1]), t1 = _mm256_hadd_ps(v[2], v[3]);
    __m256 t2 = _mm256_hadd_ps(v[4], v[5]), t3 = _mm256_hadd_ps(v[6], v[7]);
    __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

static inline __m256 load8_f32(const float* p) { return _mm256_loadu_ps(p); }
static inline __m256 load8_bf16(const uint16_t* p) { return load_bf16x8(p); }
static inline void store8_out_f32(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
static inline void store8_out_bf16(uint16_t* p, __m256 v) { store_bf16x8(p, v); }

static inline float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

static inline float hsum8(__m256 v) {
    __m128 m = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_add_ps(m, _mm_movehl_ps(m, m));
    m = _mm_add_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* softmax numerators in place over s[0..len) (s has room to a multiple of 8); returns 1 / their sum */
static inline float softmax_row8(float* s, int len) {
    __m256 m = _mm256_set1_ps(-INFINITY);
    int p = 0;
    for (; p + 8 <= len; p += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(s + p));
    float mx = hmax8(m);
    for (; p < len; p++) mx = s[p] > mx ? s[p] : mx;
    __m256 vmx = _mm256_set1_ps(mx), sum = _mm256_setzero_ps();
    for (p = 0; p + 8 <= len; p += 8) {
        __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(s + p), vmx));
        _mm256_storeu_ps(s + p, e);
        sum = _mm256_add_ps(sum, e);
    }
    if (p < len) { /* the tail through the same lanes */
        float t[8];
        for (int i = 0; i < 8; i++) t[i] = p + i < len ? s[p + i] - mx : -INFINITY;
        __m256 e = exp256(_mm256_loadu_ps(t));
        _mm256_storeu_ps(t, e);
        for (int i = 0; p + i < len; i++) s[p + i] = t[i];
        sum = _mm256_add_ps(sum, _mm256_blendv_ps(_mm256_setzero_ps(), e,
                                                  _mm256_castsi256_ps(_mm256_cmpgt_epi32(
                                                      _mm256_set1_epi32(len - p),
                                                      _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)))));
    }
    return 1.f / hsum8(sum);
}

/* One sequence, KV heads kv0 .. kv0 + nkv - 1 (H = nkv * g query heads), any D that is a multiple of 8 (up to
   512): block by block, every head's 8-token batches of scores (q widened to float32 once, in qf [H][D]); the
   softmax; then per block and head the V rows accumulated into o [H][D] 64 columns at a time (8 registers).
   Each block's K and V rows are read as contiguous streams; the next block is prefetched into L2 while the
   current one is processed (and ntable's first block, the next row this thread takes, during the V pass). */
#define DEFINE_AVX2(NAME, T, S)                                                                         \
static void NAME(const T* qb, const T* kc, const T* vc, const int32_t* table, int len, T* ob, int H,    \
                 int KVH, int row_kvh, int D, int bs, float scale, float* s, float* o, float* qf,        \
                 const int32_t* ntable, int nlen) {                                                     \
    int g = H / KVH, nc = D / 8;                                                                        \
    size_t row = (size_t)row_kvh * D, block = (size_t)bs * row;                                         \
    for (int i = 0; i < H * D; i += 8) _mm256_storeu_ps(qf + i, load8_##S(qb + i));                     \
    for (int p0 = 0, blk = 0; p0 < len; p0 += bs, blk++) {                                              \
        int n = len - p0 < bs ? len - p0 : bs;                                                          \
        const T* kb = kc + (size_t)table[blk] * block;                                                  \
        if (p0 + bs < len) {                                                                            \
            int nn = len - p0 - bs < bs ? len - p0 - bs : bs;                                           \
            prefetch_rows_l2(kc + (size_t)table[blk + 1] * block, sizeof(T) * row * (size_t)nn);        \
        }                                                                                               \
        for (int h = 0; h < H; h++) {                                                                   \
            const T* kh_base = kb + (size_t)(h / g) * D;                                                \
            const float* qh = qf + (size_t)h * D;                                                       \
            for (int t0 = 0; t0 < n; t0 += 8) {                                                         \
                int m = n - t0 < 8 ? n - t0 : 8;                                                        \
                __m256 acc[8];                                                                          \
                _Pragma("GCC unroll 8")                                                                 \
                for (int t = 0; t < 8; t++) {                                                           \
                    acc[t] = _mm256_setzero_ps();                                                       \
                    if (t < m) {                                                                        \
                        const T* kr = kh_base + (size_t)(t0 + t) * row;                                 \
                        for (int c = 0; c < nc; c++)                                                    \
                            acc[t] = _mm256_fmadd_ps(_mm256_loadu_ps(qh + 8 * c), load8_##S(kr + 8 * c), acc[t]); \
                    }                                                                                   \
                }                                                                                       \
                float r[8];                                                                             \
                _mm256_storeu_ps(r, _mm256_mul_ps(reduce8(acc), _mm256_set1_ps(scale)));                \
                memcpy(s + (size_t)h * len + p0 + t0, r, sizeof(float) * (size_t)m);                    \
            }                                                                                           \
        }                                                                                               \
    }                                                                                                   \
    float inv[H];                                                                                       \
    for (int h = 0; h < H; h++) inv[h] = softmax_row8(s + (size_t)h * len, len);                       \
    memset(o, 0, sizeof(float) * (size_t)H * D);                                                        \
    for (int p0 = 0, blk = 0; p0 < len; p0 += bs, blk++) {                                              \
        int n = len - p0 < bs ? len - p0 : bs;                                                          \
        const T* vb = vc + (size_t)table[blk] * block;                                                  \
        if (p0 + bs < len) {                                                                            \
            int nn = len - p0 - bs < bs ? len - p0 - bs : bs;                                           \
            prefetch_rows_l2(vc + (size_t)table[blk + 1] * block, sizeof(T) * row * (size_t)nn);        \
        }                                                                                               \
        if (ntable && blk == 0 && nlen > 0)                                                             \
            prefetch_rows_l2(kc + (size_t)ntable[0] * block, sizeof(T) * row * (size_t)(nlen < bs ? nlen : bs)); \
        for (int h = 0; h < H; h++) {                                                                   \
            const T* vh_base = vb + (size_t)(h / g) * D;                                                \
            const float* sh = s + (size_t)h * len + p0;                                                 \
            for (int c0 = 0; c0 < nc; c0 += 8) {                                                        \
                int cn = nc - c0 < 8 ? nc - c0 : 8;                                                     \
                float* oh = o + (size_t)h * D + 8 * c0;                                                 \
                __m256 acc[8];                                                                          \
                _Pragma("GCC unroll 8")                                                                 \
                for (int c = 0; c < 8; c++) acc[c] = c < cn ? _mm256_loadu_ps(oh + 8 * c) : _mm256_setzero_ps(); \
                for (int t = 0; t < n; t++) {                                                           \
                    const T* vr = vh_base + (size_t)t * row + 8 * c0;                                   \
                    __m256 w = _mm256_broadcast_ss(sh + t);                                             \
                    _Pragma("GCC unroll 8")                                                             \
                    for (int c = 0; c < 8; c++)                                                         \
                        if (c < cn) acc[c] = _mm256_fmadd_ps(w, load8_##S(vr + 8 * c), acc[c]);         \
                }                                                                                       \
                _Pragma("GCC unroll 8")                                                                 \
                for (int c = 0; c < 8; c++)                                                             \
                    if (c < cn) _mm256_storeu_ps(oh + 8 * c, acc[c]);                                   \
            }                                                                                           \
        }                                                                                               \
    }                                                                                                   \
    for (int h = 0; h < H; h++) {                                                                       \
        __m256 sc = _mm256_set1_ps(inv[h]);                                                             \
        for (int c = 0; c < nc; c++)                                                                    \
            store8_out_##S(ob + (size_t)h * D + 8 * c, _mm256_mul_ps(_mm256_loadu_ps(o + (size_t)h * D + 8 * c), sc)); \
    }                                                                                                   \
}

DEFINE_AVX2(item_avx2_f32, float, f32)
DEFINE_AVX2(item_avx2_bf16, uint16_t, bf16)
#endif

/* ---------------------------------------------------------------- entry points */

/* One row's attention over KV heads kh0 .. kh1 - 1 (their g query heads each): q, out [H, D] of the row. The
   unit of work of paged_decode and of the fused decode step (decode_step.c), which splits one row's heads
   over its threads. */
#define DEFINE_HEADS(NAME, T, GENERIC, FAST64, FAST128, AVX2ITEM)                                                 \
static void NAME##_item(const T* qb, const T* kc, const T* vc, const int32_t* table, int len, T* ob, int kh0, \
                        int kh1, int H, int KVH, int D, int bs, float scale, const int32_t* ntable, int nlen, \
                        float* s) {                                                                     \
    int g = H / KVH, nk = kh1 - kh0;                                                                    \
    int fast = HAVE_AVX512 && (D == 64 || D == 128) && H <= 1024;                                       \
    int avx2 = HAVE_AVX2 && D % 8 == 0 && D <= 512 && H <= 1024;                                        \
    size_t qo = (size_t)kh0 * g * D, ko = (size_t)kh0 * D;                                              \
    (void)qo; (void)ko; (void)ntable; (void)nlen; /* unused without AVX-512 */                          \
    if (fast) {                                                                                         \
        if (D == 64) FAST64(qb + qo, kc + ko, vc + ko, table, len, ob + qo, nk * g, nk, KVH, bs, scale, s, \
                            s + (size_t)H * len, ntable, nlen);                                         \
        else FAST128(qb + qo, kc + ko, vc + ko, table, len, ob + qo, nk * g, nk, KVH, bs, scale, s,     \
                     s + (size_t)H * len, ntable, nlen);                                                \
    } else if (avx2) {                                                                                  \
        AVX2ITEM(qb + qo, kc + ko, vc + ko, table, len, ob + qo, nk * g, nk, KVH, D, bs, scale, s,       \
                 s + (size_t)H * len, s + (size_t)H * len + (size_t)H * D, ntable, nlen);               \
    } else {                                                                                            \
        float* qf = s + (size_t)g * len;                                                                \
        for (int kh = kh0; kh < kh1; kh++)                                                              \
            GENERIC(qb, kc, vc, table, len, ob, kh, g, KVH, D, bs, scale, s, qf, qf + (size_t)g * D);   \
    }                                                                                                   \
}                                                                                                       \
void NAME(const T* qb, const T* kc, const T* vc, const int32_t* table, int len, T* ob, int kh0, int kh1, \
          int H, int KVH, int D, int bs, float scale, float* s) {                                       \
    NAME##_item(qb, kc, vc, table, len, ob, kh0, kh1, H, KVH, D, bs, scale, 0, 0, s);                  \
}

/* scores [H][len] and two [H][D] float32 buffers */
#define SCRATCH_BYTES(H, len, D) (sizeof(float) * ((size_t)(H) * (len) + 2 * (size_t)(H) * (D)))

/* Rows are handed out one at a time from a shared counter, each thread claiming its next row before it
   starts the current one: while the current row's V pass runs from the L2 cache (its V blocks were
   prefetched during its K pass), the first K blocks of the next row are prefetched. NAME##_rows is one
   thread's part, run by every thread of a parallel region with the shared *counter at 0 and a scratch buffer
   of SCRATCH_BYTES(H, longest len, D) each: paged_decode's region, and the fused decode step's (decode_step.c),
   whose q and out rows lie inside wider rows (q_stride, out_stride elements apart). */
#define DEFINE_ENTRY(NAME, T, ITEM)                                                                     \
void NAME##_rows(const T* q, long q_stride, const T* kc, const T* vc, const int32_t* tables,            \
                 const int32_t* lens, T* out, long out_stride, int B, int H, int KVH, int D, int bs,    \
                 int max_blocks, float scale, int* counter, float* s) {                                 \
    int b, nb;                                                                                          \
    _Pragma("omp atomic capture")                                                                       \
    b = (*counter)++;                                                                                   \
    while (b < B) {                                                                                     \
        _Pragma("omp atomic capture")                                                                   \
        nb = (*counter)++;                                                                              \
        ITEM(q + (size_t)b * q_stride, kc, vc, tables + (size_t)b * max_blocks, lens[b],                \
             out + (size_t)b * out_stride, 0, KVH, H, KVH, D, bs, scale,                                \
             nb < B ? tables + (size_t)nb * max_blocks : 0, nb < B ? lens[nb] : 0, s);                  \
        b = nb;                                                                                         \
    }                                                                                                   \
}                                                                                                       \
void NAME(const T* q, const T* kc, const T* vc, const int32_t* tables, const int32_t* lens, T* out,     \
          int B, int H, int KVH, int D, int bs, int max_blocks, float scale) {                          \
    int maxlen = 0, counter = 0;                                                                        \
    for (int b = 0; b < B; b++) maxlen = lens[b] > maxlen ? lens[b] : maxlen;                           \
    _Pragma("omp parallel")                                                                             \
    {                                                                                                   \
        float* s = (float*)malloc(SCRATCH_BYTES(H, maxlen, D));                                         \
        NAME##_rows(q, (long)H * D, kc, vc, tables, lens, out, (long)H * D, B, H, KVH, D, bs, max_blocks, \
                    scale, &counter, s);                                                                \
        free(s);                                                                                        \
    }                                                                                                   \
}

/* bytes of scratch one thread of paged_decode_*_rows or paged_heads_* needs for rows of up to `len` tokens */
size_t paged_scratch_bytes(int H, int len, int D) { return SCRATCH_BYTES(H, len, D); }

#define NONE(...) (void)0
#if HAVE_AVX512
DEFINE_HEADS(paged_heads_f32, float, item_generic_f32, item_avx512_f32_d64, item_avx512_f32_d128, NONE)
DEFINE_HEADS(paged_heads_bf16, uint16_t, item_generic_bf16, item_avx512_bf16_d64, item_avx512_bf16_d128, NONE)
#elif HAVE_AVX2
DEFINE_HEADS(paged_heads_f32, float, item_generic_f32, NONE, NONE, item_avx2_f32)
DEFINE_HEADS(paged_heads_bf16, uint16_t, item_generic_bf16, NONE, NONE, item_avx2_bf16)
#else
DEFINE_HEADS(paged_heads_f32, float, item_generic_f32, NONE, NONE, NONE)
DEFINE_HEADS(paged_heads_bf16, uint16_t, item_generic_bf16, NONE, NONE, NONE)
#endif
DEFINE_ENTRY(paged_decode_f32, float, paged_heads_f32_item)
DEFINE_ENTRY(paged_decode_bf16, uint16_t, paged_heads_bf16_item)

/* which implementation serves D = 64 / 128 (the Python side reports it) */
const char* paged_decode_variant(void) {
#if HAVE_AVX512 && defined(__AVX512BF16__)
    return "avx512+bf16";
#elif HAVE_AVX512
    return "avx512";
#elif HAVE_AVX2
    return "avx2";
#else
    return "portable";
#endif
}

/* the ISA level the library was built for (simd.h): "avx512+bf16", "avx512", "avx2" or "portable" */
const char* kernels_isa(void) { return ISA_LEVEL; }
