/* Helpers shared by the CPU kernels: bfloat16 <-> float32 and, where the compiler targets AVX-512, vector
 * pieces (exp, bfloat16 loads and stores). */
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

#endif
