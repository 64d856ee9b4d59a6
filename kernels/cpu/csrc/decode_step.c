/* The decoder stack of a Llama-family model for the rows of a decode step, bfloat16 or float32, in one C call
 * and one OpenMP parallel region.
 *
 * Why: the per-op path spends ~8 ms of a 32-row bfloat16 step (37 ms) and about as long as the weight stream at
 * one row in ~270 Python/ctypes dispatches and ~200 OpenMP fork/joins. Here the threads are forked once per
 * step and meet at barriers between the phases of each layer:
 *
 *   add + RMSNorm -> qkv linear -> rotary + KV write -> paged attention -> o linear -> add + RMSNorm ->
 *   gate_up linear -> silu * up -> down linear
 *
 * Numerics are those of the per-op path, bit for bit, because every phase is the per-op path's own code: the
 * linears are each GEMM's per-thread share (gemm_bf16_share in gemm.c, gemm_f32_share in gemm_f32.c: the
 * same items, micro kernels and packed weights the per-op call runs); the norms, rotary and activation are
 * ops.c's functions on one row (their `omp parallel for if (...)` runs inline); the attention is
 * paged_attention.c's per-thread row loop or per-head unit.
 *
 * Work split: the linears as their GEMMs split them (panels, cut into row blocks where the panel count does
 * not divide evenly over the threads); attention by rows handed out from a counter with the next row's
 * blocks prefetched (paged_decode's loop) when there are at least two rows per thread, else by (row, KV
 * head); the norms and rotary by rows; silu * up by 16-column chunks.
 *
 * The layer loop is written once (DEFINE_STEP) over the element type: S names the type's kernels (bf16, f32).
 */
#include "simd.h"

#include <omp.h>

typedef struct {
    const void* input_norm; /* [hidden] */
    const void* post_norm;
    const void* qkv; /* packed for the dtype's GEMM; biases float32 [N] or NULL */
    const float* qkv_bias;
    const void* o;
    const float* o_bias;
    const void* gate_up;
    const float* gate_up_bias;
    const void* down;
    const float* down_bias;
    void* k_cache; /* [num_blocks, block_size, KVH, D] */
    void* v_cache;
} StepLayer;

typedef struct {
    int layers, rows, hidden, heads, kv_heads, head_dim, intermediate, block_size, max_blocks;
    float eps, scale;
} StepShape;

/* from paged_attention.c */
size_t paged_scratch_bytes(int H, int len, int D);

/* this thread's share [*lo, *hi) of `total` items */
static inline void share(int total, int tid, int nt, int* lo, int* hi) {
    *lo = (int)((long)total * tid / nt);
    *hi = (int)((long)total * (tid + 1) / nt);
}

static inline size_t align64(size_t bytes) { return (bytes + 63) & ~(size_t)63; }

/* h [rows, hidden]: in, the embeddings; out, the last layer's MLP output. residual [rows, hidden]: out, the
   residual stream (the caller applies the final norm to h + residual). positions, slots: int64 [rows];
   tables [rows, max_blocks], lens [rows] (each row's causal context, itself included): the attention's.
   scratch: the caller's buffer of scratch_bytes, kept from step to step (a fresh allocation of this size is
   an mmap and page faults every step). Returns 0; the bytes of scratch needed when scratch_bytes is fewer
   (nothing computed: call again with a larger buffer); -1 for shapes it does not take. */
#define DEFINE_STEP(S, T)                                                                                       \
long decode_step_##S(const StepLayer* layers, const StepShape* sh, T* h, T* residual, const int64_t* positions,  \
                     const int64_t* slots, const T* cos_t, const T* sin_t, const int32_t* tables,               \
                     const int32_t* lens, void* scratch, long scratch_bytes) {                                  \
    const int R = sh->rows, n = sh->hidden, H = sh->heads, KVH = sh->kv_heads, D = sh->head_dim;                \
    const int inter = sh->intermediate, hq = H * D, hk = KVH * D, nqkv = hq + 2 * hk;                           \
    if (R < 1 || n % 2 || hq % 2 || inter % 2 || D % 2 || D > 512 || H % KVH) return -1;                        \
    int maxlen = 1;                                                                                             \
    for (int r = 0; r < R; r++) maxlen = lens[r] > maxlen ? lens[r] : maxlen;                                   \
    const int most = omp_get_max_threads();                                                                     \
    const size_t acts = align64(sizeof(T) * (size_t)R * (n + nqkv + hq + 3 * (size_t)inter));                   \
    const size_t per_thread = align64(paged_scratch_bytes(H, maxlen, D));                                       \
    const size_t need = acts + most * per_thread + sizeof(int) * (size_t)sh->layers;                            \
    if ((size_t)scratch_bytes < need) return (long)need;                                                        \
    T *normed = (T*)scratch, *qkv = normed + (size_t)R * n, *attn = qkv + (size_t)R * nqkv;                     \
    T *gu = attn + (size_t)R * hq, *act = gu + (size_t)R * 2 * inter;                                           \
    int* counters = (int*)((char*)scratch + acts + most * per_thread); /* attention rows handed out, a layer */  \
    memset(counters, 0, sizeof(int) * (size_t)sh->layers);                                                      \
    const int chunks = (inter + 15) / 16;                                                                       \
    _Pragma("omp parallel")                                                                                     \
    {                                                                                                           \
        const int tid = omp_get_thread_num(), nt = omp_get_num_threads();                                       \
        float* s = (float*)((char*)scratch + acts + tid * per_thread);                                          \
        int lo, hi;                                                                                             \
        for (int l = 0; l < sh->layers; l++) {                                                                  \
            const StepLayer* L = layers + l;                                                                    \
            T *kc = (T*)L->k_cache, *vc = (T*)L->v_cache;                                                       \
            for (int r = tid; r < R; r += nt) {                                                                 \
                size_t at = (size_t)r * n;                                                                      \
                if (l == 0) memcpy(residual + at, h + at, sizeof(T) * n);                                       \
                add_rms_norm_##S(l == 0 ? 0 : h + at, residual + at, (const T*)L->input_norm, normed + at, 1, n, \
                                 sh->eps);                                                                      \
            }                                                                                                   \
            _Pragma("omp barrier")                                                                              \
            gemm_##S##_share(normed, R, n, (const T*)L->qkv, nqkv, L->qkv_bias, qkv, tid, nt);                  \
            _Pragma("omp barrier")                                                                              \
            for (int r = tid; r < R; r += nt) {                                                                 \
                T* row = qkv + (size_t)r * nqkv;                                                                \
                rope_and_cache_##S(row, nqkv, row + hq, nqkv, row + hq + hk, nqkv, positions + r, cos_t, sin_t, \
                                   kc, vc, slots + r, 1, H, KVH, D);                                            \
            }                                                                                                   \
            _Pragma("omp barrier")                                                                              \
            if (R >= 2 * nt) {                                                                                  \
                paged_decode_##S##_rows(qkv, nqkv, kc, vc, tables, lens, attn, hq, R, H, KVH, D, sh->block_size, \
                                        sh->max_blocks, sh->scale, counters + l, s);                            \
            } else {                                                                                            \
                share(R * KVH, tid, nt, &lo, &hi);                                                              \
                for (int i = lo; i < hi;) { /* consecutive KV heads of one row in one call */                   \
                    int r = i / KVH, kh0 = i % KVH, kh1 = kh0 + (hi - i);                                       \
                    if (kh1 > KVH) kh1 = KVH;                                                                   \
                    paged_heads_##S(qkv + (size_t)r * nqkv, kc, vc, tables + (size_t)r * sh->max_blocks, lens[r], \
                                    attn + (size_t)r * hq, kh0, kh1, H, KVH, D, sh->block_size, sh->scale, s);  \
                    i += kh1 - kh0;                                                                             \
                }                                                                                               \
            }                                                                                                   \
            _Pragma("omp barrier")                                                                              \
            gemm_##S##_share(attn, R, hq, (const T*)L->o, n, L->o_bias, h, tid, nt);                            \
            _Pragma("omp barrier")                                                                              \
            for (int r = tid; r < R; r += nt) {                                                                 \
                size_t at = (size_t)r * n;                                                                      \
                add_rms_norm_##S(h + at, residual + at, (const T*)L->post_norm, normed + at, 1, n, sh->eps);    \
            }                                                                                                   \
            _Pragma("omp barrier")                                                                              \
            gemm_##S##_share(normed, R, n, (const T*)L->gate_up, 2 * inter, L->gate_up_bias, gu, tid, nt);      \
            _Pragma("omp barrier")                                                                              \
            share(R * chunks, tid, nt, &lo, &hi);                                                               \
            for (int i = lo; i < hi; i++) {                                                                     \
                int r = i / chunks, c0 = 16 * (i % chunks), c1 = c0 + 16 < inter ? c0 + 16 : inter;             \
                const T* g = gu + (size_t)r * 2 * inter;                                                        \
                silu_mul_span_##S(g + c0, g + inter + c0, act + (size_t)r * inter + c0, c1 - c0);               \
            }                                                                                                   \
            _Pragma("omp barrier")                                                                              \
            gemm_##S##_share(act, R, inter, (const T*)L->down, n, L->down_bias, h, tid, nt);                    \
            _Pragma("omp barrier")                                                                              \
        }                                                                                                       \
    }                                                                                                           \
    return 0;                                                                                                   \
}

/* the step's kernels, from ops.c, paged_attention.c, gemm.c and gemm_f32.c */
#define DECLARE_KERNELS(S, T)                                                                                   \
void add_rms_norm_##S(const T* x, T* residual, const T* w, T* out, int rows, int n, float eps);                 \
void rope_and_cache_##S(T* q, long q_stride, T* k, long k_stride, const T* v, long v_stride,                    \
                        const int64_t* positions, const T* cos_t, const T* sin_t, T* k_cache, T* v_cache,       \
                        const int64_t* slots, int tokens, int H, int KVH, int D);                               \
void paged_heads_##S(const T* qb, const T* kc, const T* vc, const int32_t* table, int len, T* ob, int kh0,      \
                     int kh1, int H, int KVH, int D, int bs, float scale, float* s);                            \
void paged_decode_##S##_rows(const T* q, long q_stride, const T* kc, const T* vc, const int32_t* tables,        \
                             const int32_t* lens, T* out, long out_stride, int B, int H, int KVH, int D, int bs, \
                             int max_blocks, float scale, int* counter, float* s);                              \
void silu_mul_span_##S(const T* g, const T* u, T* o, int n);                                                    \
void gemm_##S##_share(const T* x, int M, int K, const T* packed, int N, const float* bias, T* out, int tid,      \
                      int nt);

/* where the dtype's GEMM is built (simd.h: AVX512_BF16 or AVX2 + FMA for bfloat16, AVX-512F or AVX2 + FMA for
   float32) */
#if HAVE_GEMM_BF16
#define HAVE_STEP_BF16 1
DECLARE_KERNELS(bf16, uint16_t)
DEFINE_STEP(bf16, uint16_t)
#else
#define HAVE_STEP_BF16 0
long decode_step_bf16(void) { return -1; }
#endif

#if HAVE_GEMM_F32
#define HAVE_STEP_F32 1
DECLARE_KERNELS(f32, float)
DEFINE_STEP(f32, float)
#else
#define HAVE_STEP_F32 0
long decode_step_f32(void) { return -1; }
#endif

/* 1 where decode_step_<dtype> is built: bf16 = 1 for bfloat16, 0 for float32 */
int decode_step_available(int bf16) { return bf16 ? HAVE_STEP_BF16 : HAVE_STEP_F32; }
