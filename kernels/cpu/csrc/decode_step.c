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
 *
 * LoRA (a step whose rows run adapters: `lora` not NULL): each projection an adapter of the step updates adds the
 * row's adapter update (lora.c) without a phase of its own: the shrink (y = A x) runs after the thread's share
 * of the projection's GEMM, before the barrier that ends it (it reads the GEMM's input, complete by then), and
 * the expand (out += B y) runs inside the next phase's per-row (or per-chunk) loop, before that loop reads the
 * row: q/k/v before rotary, o before the norm, gate/up inside silu * up, down before the next layer's norm (the
 * last layer's after its loop). One float32 buffer y [rows, 3R] serves every projection in turn.
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

/* A step's LoRA adapters: per layer and projection (qkv, o, gate_up, down) the slots' stacked weights, a NULL
   where no adapter of the step updates that projection (worker/runner/lora/model.py's layout: a [slots, n*rank,
   in], b [slots, out, rank]); slots [rows]: each row's slot, -1 for the base model alone. */
typedef struct {
    const void* a;
    const void* b;
} StepLoraTarget;

typedef struct {
    const StepLoraTarget* targets; /* [layers * 4] */
    const int32_t* slots;
    int rank;
} StepLora;

enum { LORA_QKV, LORA_O, LORA_GATE_UP, LORA_DOWN, LORA_TARGETS };

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
                     const int32_t* lens, void* scratch, long scratch_bytes, const StepLora* lora) {            \
    const int R = sh->rows, n = sh->hidden, H = sh->heads, KVH = sh->kv_heads, D = sh->head_dim;                \
    const int inter = sh->intermediate, hq = H * D, hk = KVH * D, nqkv = hq + 2 * hk;                           \
    if (R < 1 || n % 2 || hq % 2 || inter % 2 || D % 2 || D > 512 || H % KVH) return -1;                        \
    int maxlen = 1;                                                                                             \
    for (int r = 0; r < R; r++) maxlen = lens[r] > maxlen ? lens[r] : maxlen;                                   \
    const int most = omp_get_max_threads();                                                                     \
    const size_t acts = align64(sizeof(T) * (size_t)R * (n + nqkv + hq + 3 * (size_t)inter));                   \
    const size_t per_thread = align64(paged_scratch_bytes(H, maxlen, D));                                       \
    const int lr = lora ? lora->rank : 0;                                                                       \
    const size_t ybytes = align64(sizeof(float) * (size_t)R * 3 * lr);                                          \
    const size_t need = acts + most * per_thread + ybytes + sizeof(int) * (size_t)sh->layers;                   \
    if ((size_t)scratch_bytes < need) return (long)need;                                                        \
    T *normed = (T*)scratch, *qkv = normed + (size_t)R * n, *attn = qkv + (size_t)R * nqkv;                     \
    T *gu = attn + (size_t)R * hq, *act = gu + (size_t)R * 2 * inter;                                           \
    float* ly = (float*)((char*)scratch + acts + most * per_thread); /* LoRA: [R, 3 * lr], a projection's y */  \
    int* counters = (int*)((char*)ly + ybytes); /* attention rows handed out, a layer */                        \
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
            const StepLoraTarget* LT = lora ? lora->targets + (size_t)l * LORA_TARGETS : 0;                     \
            for (int r = tid; r < R; r += nt) {                                                                 \
                size_t at = (size_t)r * n;                                                                      \
                if (l == 0) memcpy(residual + at, h + at, sizeof(T) * n);                                       \
                else if (LT) lora_expand_##S(LT - LORA_TARGETS + LORA_DOWN, lora, r, n, 0, 0, n, h + at, ly);  \
                add_rms_norm_##S(l == 0 ? 0 : h + at, residual + at, (const T*)L->input_norm, normed + at, 1, n, \
                                 sh->eps);                                                                      \
            }                                                                                                   \
            _Pragma("omp barrier")                                                                              \
            gemm_##S##_share(normed, R, n, (const T*)L->qkv, nqkv, L->qkv_bias, qkv, tid, nt);                  \
            if (LT) lora_shrink_share_##S(LT + LORA_QKV, lora, normed, R, n, 3, ly, tid, nt);                   \
            _Pragma("omp barrier")                                                                              \
            for (int r = tid; r < R; r += nt) {                                                                 \
                T* row = qkv + (size_t)r * nqkv;                                                                \
                if (LT) {                                                                                       \
                    lora_expand_##S(LT + LORA_QKV, lora, r, nqkv, 0, 0, hq, row, ly);                           \
                    lora_expand_##S(LT + LORA_QKV, lora, r, nqkv, 1, hq, hq + hk, row, ly);                     \
                    lora_expand_##S(LT + LORA_QKV, lora, r, nqkv, 2, hq + hk, nqkv, row, ly);                   \
                }                                                                                               \
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
            if (LT) lora_shrink_share_##S(LT + LORA_O, lora, attn, R, hq, 1, ly, tid, nt);                      \
            _Pragma("omp barrier")                                                                              \
            for (int r = tid; r < R; r += nt) {                                                                 \
                size_t at = (size_t)r * n;                                                                      \
                if (LT) lora_expand_##S(LT + LORA_O, lora, r, n, 0, 0, n, h + at, ly);                          \
                add_rms_norm_##S(h + at, residual + at, (const T*)L->post_norm, normed + at, 1, n, sh->eps);    \
            }                                                                                                   \
            _Pragma("omp barrier")                                                                              \
            gemm_##S##_share(normed, R, n, (const T*)L->gate_up, 2 * inter, L->gate_up_bias, gu, tid, nt);      \
            if (LT) lora_shrink_share_##S(LT + LORA_GATE_UP, lora, normed, R, n, 2, ly, tid, nt);               \
            _Pragma("omp barrier")                                                                              \
            share(R * chunks, tid, nt, &lo, &hi);                                                               \
            for (int i = lo; i < hi; i++) {                                                                     \
                int r = i / chunks, c0 = 16 * (i % chunks), c1 = c0 + 16 < inter ? c0 + 16 : inter;             \
                T* g = gu + (size_t)r * 2 * inter;                                                              \
                if (LT) {                                                                                       \
                    lora_expand_##S(LT + LORA_GATE_UP, lora, r, 2 * inter, 0, c0, c1, g, ly);                   \
                    lora_expand_##S(LT + LORA_GATE_UP, lora, r, 2 * inter, 1, inter + c0, inter + c1, g, ly);   \
                }                                                                                               \
                silu_mul_span_##S(g + c0, g + inter + c0, act + (size_t)r * inter + c0, c1 - c0);               \
            }                                                                                                   \
            _Pragma("omp barrier")                                                                              \
            gemm_##S##_share(act, R, inter, (const T*)L->down, n, L->down_bias, h, tid, nt);                    \
            if (LT) lora_shrink_share_##S(LT + LORA_DOWN, lora, act, R, inter, 1, ly, tid, nt);                 \
            _Pragma("omp barrier")                                                                              \
        }                                                                                                       \
        if (lora) { /* the last layer's down update (the others' run before the next layer's norm) */          \
            const StepLoraTarget* last = lora->targets + (size_t)(sh->layers - 1) * LORA_TARGETS + LORA_DOWN;   \
            for (int r = tid; r < R; r += nt) lora_expand_##S(last, lora, r, n, 0, 0, n, h + (size_t)r * n, ly); \
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
                      int nt);                                                                                  \
void lora_shrink_row_##S(const T* x, int in, const T* a, int k, float* y);                                      \
void lora_expand_rows_##S(const float* y, const T* b, int rank, T* out, int j0, int j1);                        \
/* this thread's rows of y = A x (x [R, in]) for a projection of `slices` output slices (NULL a: none) */       \
static void lora_shrink_share_##S(const StepLoraTarget* t, const StepLora* lora, const T* x, int R, int in,     \
                                  int slices, float* ly, int tid, int nt) {                                     \
    if (!t->a) return;                                                                                          \
    const int rk = lora->rank, k = slices * rk;                                                                 \
    for (int r = tid; r < R; r += nt) {                                                                         \
        int s = lora->slots[r];                                                                                 \
        if (s >= 0)                                                                                             \
            lora_shrink_row_##S(x + (size_t)r * in, in, (const T*)t->a + (size_t)s * k * in, k,                 \
                                ly + (size_t)r * 3 * rk);                                                       \
    }                                                                                                           \
}                                                                                                               \
/* row r's output rows [j0, j1) (of slice `slice`) of a projection with `nout` outputs: out[j] += B y */        \
static inline void lora_expand_##S(const StepLoraTarget* t, const StepLora* lora, int r, int nout, int slice,   \
                                   int j0, int j1, T* out, const float* ly) {                                   \
    const int s = lora->slots[r], rk = lora->rank;                                                              \
    if (!t->a || s < 0) return;                                                                                 \
    lora_expand_rows_##S(ly + (size_t)r * 3 * rk + (size_t)slice * rk, (const T*)t->b + (size_t)s * nout * rk,  \
                         rk, out, j0, j1);                                                                      \
}

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
