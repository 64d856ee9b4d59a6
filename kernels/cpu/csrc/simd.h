/* Helpers shared by the CPU kernels: bfloat16 <-> float32 and, where the compiler targets AVX-512 or AVX2 with
 * FMA, vector pieces (exp, bfloat16 loads and stores).
 *
 * ISA levels (native.py picks the -march: the CPU's own, or the level HETERO_INFER_CPU_ISA forces):
 *   HAVE_AVX512: AVX-512F (the 512-bit kernels; bfloat16 GEMM with AVX512_BF16 too)
 *   HAVE_AVX2:   AVX2 + FMA without AVX-512 (x86-64-v3: the 256-bit kernels, bfloat16 widened to float32)
 *   neither:     the portable C paths, vectorized by the compiler. */
#ifndef HETERO_INFER_SIMD_H
#define HETERO_INFER_SIMD_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline float bf16_to_f32(uint16_t x) {
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)x << 16;
    return v.f;
}

static inline uint16_t f32_to_bf16(float f) { /* round to nearest even, as torch does */
    union { uint32_t u; float f; } v;
    v.f = f;
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((v.u >> 16) | 0x40); /* NaN stays NaN */
    v.u += 0x7fffu + ((v.u >> 16) & 1u);
    return (uint16_t)(v.u >> 16);
}

#if defined(__AVX512F__)
#include <immintrin.h>
#define HAVE_AVX512 1

/* expf, vectorized: Cephes' polynomial (about 1 ulp), 2^n applied with scalef; 0 below -87, +inf above
   88.7 (the clamp at 100 keeps +inf from turning into NaN in the range reduction). */
static inline __m512 exp512(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(100.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

/* bfloat16 pairs -> two float32 vectors: the even elements and the odd ones. */
static inline __m512 bf16_even(__m512i x) { return _mm512_castsi512_ps(_mm512_slli_epi32(x, 16)); }
static inline __m512 bf16_odd(__m512i x) {
    return _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32((int)0xffff0000u)));
}

static inline void store_bf16(uint16_t* dst, __m512 x) {
#if defined(__AVX512BF16__)
    _mm256_storeu_si256((__m256i*)dst, (__m256i)_mm512_cvtneps_pbh(x));
#else
    float tmp[16];
    _mm512_storeu_ps(tmp, x);
    for (int i = 0; i < 16; i++) dst[i] = f32_to_bf16(tmp[i]);
#endif
}

/* 16 bfloat16 -> 16 float32 */
static inline __m512 load_bf16x16(const uint16_t* p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}
#else
#define HAVE_AVX512 0
#endif

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define HAVE_AVX2_FMA 1 /* the 256-bit helpers below; also on AVX-512 CPUs (the bfloat16 GEMM without AVX512_BF16) */

/* expf over 8 lanes: exp512's polynomial and range reduction; 2^n applied as two exponent-field multiplies
   (n up to 145 after the clamp at 100: one 2^n alone would overflow the exponent field before the product
   does). */
static inline __m256 exp256(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(100.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i ni = _mm256_cvtps_epi32(n), n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
    __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, _mm256_set1_epi32(127)), 23));
    __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, _mm256_set1_epi32(127)), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

/* 8 bfloat16 -> 8 float32 */
static inline __m256 load_bf16x8(const uint16_t* p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}

/* 8 float32 -> their nearest-even bfloat16 bits (NaN stays NaN, as f32_to_bf16), one per 32-bit lane */
static inline __m256i bf16_bits8(__m256 x) {
    __m256i u = _mm256_castps_si256(x);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
    __m256i q = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    return _mm256_blendv_epi8(r, q, nan);
}

/* 8 float32 -> 8 bfloat16 */
static inline __m128i cvt_bf16x8(__m256 x) {
    __m256i r = bf16_bits8(x); /* below 0x10000: the saturating pack keeps each lane's low 16 bits, in order */
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

static inline void store_bf16x8(uint16_t* dst, __m256 x) { _mm_storeu_si128((__m128i*)dst, cvt_bf16x8(x)); }
#else
#define HAVE_AVX2_FMA 0
#endif

/* the AVX2 level: AVX2 + FMA without AVX-512 (the 256-bit kernels throughout) */
#if HAVE_AVX2_FMA && !HAVE_AVX512
#define HAVE_AVX2 1
#else
#define HAVE_AVX2 0
#endif

/* the build's ISA level, as the Python side reports it */
#if HAVE_AVX512 && defined(__AVX512BF16__)
#define ISA_LEVEL "avx512+bf16"
#elif HAVE_AVX512
#define ISA_LEVEL "avx512"
#elif HAVE_AVX2
#define ISA_LEVEL "avx2"
#else
#define ISA_LEVEL "portable"
#endif

/* where the bfloat16 and float32 GEMMs (gemm.c, gemm_f32.c) and with them the fused decode step are built */
#if HAVE_AVX512 && defined(__AVX512BF16__) && defined(__AVX512BW__)
#define GEMM_BF16_DPBF16 1 /* gemm.c's VDPBF16PS kernels; else its AVX2 ones (widened to float32) */
#else
#define GEMM_BF16_DPBF16 0
#endif
#if GEMM_BF16_DPBF16 || HAVE_AVX2_FMA
#define HAVE_GEMM_BF16 1
#else
#define HAVE_GEMM_BF16 0
#endif
#if HAVE_AVX512 || HAVE_AVX2
#define HAVE_GEMM_F32 1
#else
#define HAVE_GEMM_F32 0
#endif

#endif
