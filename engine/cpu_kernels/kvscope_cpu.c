/* kvscope's native CPU kernels (fp32 arithmetic, AVX2 + FMA or AVX-512, OpenMP): where a decode step on a
 * CPU spent its time on something other than the arithmetic and memory traffic it must do.
 *
 * 1. Skinny linears. A decode step multiplies a few rows by every weight of the model, so it is
 *    bound by how fast the weights stream from memory. Weights are packed once into panels of 16
 *    output columns ([ceil(N/16)][K][16]): a panel is one sequential stream, and each weight
 *    loaded is used by every row of the step before it leaves the registers.
 * 2. Paged attention. Each decode, and each prompt's tile of query rows, reads its keys and
 *    values straight from the paged cache through its block table: no gathered copy, no
 *    padding to the longest sequence.
 * 3. The small ops between them (RMSNorm, RoPE, SiLU-and-mul): one call each instead of five to
 *    ten torch ops, whose dispatch costs more than their arithmetic at a few rows.
 * 4. Greedy sampling with the candidates the explorer shows, in one pass over the logits.
 * 5. A whole decode forward (kv_decode_forward), embedding to logits: 1-3 in one call and one
 *    parallel region.
 *
 * Weights and the KV cache are stored in fp32 or in bf16 (dtype='bfloat16' on a CPU): a bf16
 * value is the top half of an fp32 one, so widening it is one shift and the arithmetic stays
 * fp32, while every byte streamed from memory carries twice the values. Stores into a bf16
 * cache round to nearest even, as torch's .to(torch.bfloat16) does.
 *
 * Built and loaded by engine/cpu_kernels/__init__.py (gcc, a second or two); the engine falls
 * back to torch's kernels where it cannot be built. Every routine is checked against torch in
 * tests/engine/test_cpu_kernels.py. OpenMP here is the libgomp torch already loaded, so both
 * share one thread pool. */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <omp.h>

#define NR 16     /* panel width: two 8-float AVX2 vectors */
#define MR 6      /* rows per micro-kernel call: 12 accumulators + 2 weights + 1 broadcast */
/* One row (one stream's decode) reads this many panels side by side on each thread (see
 * one_row_body): fp32 panels need more streams in flight than bf16 ones, which spend more
 * instructions per byte and more registers per stream. */
#define FP32_STREAMS 6
#define BF16_STREAMS 4
_Static_assert(BF16_STREAMS <= FP32_STREAMS, "one_row_body's arrays hold FP32_STREAMS runs");

/* This file builds once per CPU kind (engine/cpu_kernels/__init__.py picks the build): 'avx2'
 * (AVX2 + FMA) everywhere; 'avx512' where the CPU has AVX-512 (F, BW, VL, DQ): fp32 panels are
 * multiplied a whole 16-column panel per zmm FMA, 12 rows per call in 12 of its 32 registers
 * (micro_wide), where AVX2 needs two FMAs and has room for 6 rows; and 'avx512_bf16', which adds
 * AVX512_BF16's dot product (vdpbf16ps): there a bf16 engine's panels hold their weights in
 * pairs of k steps, which that instruction multiplies by a pair of bf16 inputs, twice the
 * multiply-adds of an fp32 FMA per instruction (see micro_pairs). Each output column is the same
 * chain of FMAs over k in every build, so fp32 gives the same bits in all three. Everything
 * else is the same code in every build. */
#define WIDE_MR 12  /* rows per wide or pair micro-kernel call: 12 zmm accumulators of the 32 */
#if defined(__AVX512F__)
#define WIDE_FP32 1
#else
#define WIDE_FP32 0
#endif
#if defined(__AVX512F__) && defined(__AVX512BF16__)
#define PAIR_PANELS 1
#define KV_VARIANT "avx512_bf16"
#elif WIDE_FP32
#define PAIR_PANELS 0
#define KV_VARIANT "avx512"
#else
#define PAIR_PANELS 0
#define KV_VARIANT "avx2"
#endif

const char *kv_variant(void) { return KV_VARIANT; }

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* The calling thread's even, contiguous share [*lo, *hi) of n items (inside a parallel region). */
static inline void thread_share(int64_t n, int64_t *lo, int64_t *hi) {
    const int64_t share = (n + omp_get_num_threads() - 1) / omp_get_num_threads();
    *lo = min64(n, omp_get_thread_num() * share);
    *hi = min64(n, *lo + share);
}

/* The first key position a query at position seq_len - 1 reads: 0, or with a sliding window
 * of `window` tokens (its own included; 0: none) the window's first. */
static inline int64_t window_start(int64_t seq_len, int64_t window) {
    return window > 0 && seq_len > window ? seq_len - window : 0;
}

/* ---- bf16 <-> fp32 ---------------------------------------------------------------------- */

static inline uint16_t bf16_round(float f) {  /* round to nearest even (no NaNs arise here) */
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline __m256 bf16x8_to_fp32(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}

/* f rounded to the nearest bf16 value (even on ties), kept as an fp32 value: bf16_round's bits,
 * widened. */
static inline float bf16_value(float f) {
    const uint32_t u = (uint32_t)bf16_round(f) << 16;
    float out;
    memcpy(&out, &u, 4);
    return out;
}

/* The same rounding on 8 lanes at once (bf16_round's arithmetic, so the same bits). */
static inline __m256 bf16_values8(__m256 v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), odd);
    return _mm256_castsi256_ps(_mm256_and_si256(r, _mm256_set1_epi32((int)0xffff0000u)));
}

/* dst rows = src rows rounded to bf16 values (in place when dst == src): a bf16 engine's
 * linears take and give bf16 values, as vLLM's bf16 GEMMs do (see kv_linear's `rounding`). */
static void bf16_rows_body(const float *src, int64_t src_stride, float *dst, int64_t dst_stride, int64_t rows,
                           int64_t n) {
    #pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *in = src + r * src_stride;
        float *out = dst + r * dst_stride;
        int64_t i = 0;
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, bf16_values8(_mm256_loadu_ps(in + i)));
        for (; i < n; i++) out[i] = bf16_value(in[i]);
    }
}

/* 8 values at p (fp32, or bf16 when bf16) as 8 fp32 lanes; `bf16` is a constant where inlined. */
static inline __attribute__((always_inline)) __m256 load8(const void *p, int64_t i, const int bf16) {
    return bf16 ? bf16x8_to_fp32((const uint16_t *)p + i) : _mm256_loadu_ps((const float *)p + i);
}

/* ---- skinny linears ------------------------------------------------------------------ */

/* The k steps a panel holds: k, or k rounded up to even for pair panels (the last pair's high
 * half zero where k is odd). */
static inline int64_t panel_depth(int64_t k, int bf16) { return (PAIR_PANELS && bf16) ? (k + 1) / 2 * 2 : k; }

int64_t kv_packed_values(int64_t n, int64_t k, int64_t bf16) {
    return (n + NR - 1) / NR * panel_depth(k, (int)bf16) * NR;
}

/* Where weight (column j of the panel, k step kk) lies in a bf16 panel. The AVX2 build lays each
 * k step's 16 columns out so that one 256-bit load widens with two instructions: 32-bit lane j
 * holds column j in its low half and column 8 + j in its high half (shift left 16: columns 0-7;
 * mask the low half: 8-15). Pair panels hold k steps 2q and 2q + 1 of column j in lane j of pair
 * q's 512 bits (low, high half): vdpbf16ps's operand, or two widened fp32 vectors in column order. */
static inline int64_t bf16_slot(int64_t kk, int j) {
    if (PAIR_PANELS)
        return (kk / 2) * 2 * NR + 2 * j + (kk & 1);
    return kk * NR + (j < 8 ? 2 * j : 2 * (j - 8) + 1);
}

/* W [n, k] (row-major, like nn.Linear.weight) -> panels [ceil(n/16)][depth][16], zero-padded, in
 * fp32 or (bf16) in bf16 rounded to nearest even, laid out as bf16_slot says. */
void kv_pack_panels(const float *w, int64_t n, int64_t k, int64_t bf16, void *out) {
    const int64_t panels = (n + NR - 1) / NR, depth = panel_depth(k, (int)bf16);
    #pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < panels; p++)
        for (int64_t kk = 0; kk < depth; kk++)
            for (int j = 0; j < NR; j++) {
                const int64_t row = p * NR + j, at = p * depth * NR;
                const float value = row < n && kk < k ? w[row * k + kk] : 0.0f;
                if (bf16)
                    ((uint16_t *)out)[at + bf16_slot(kk, j)] = bf16_round(value);
                else
                    ((float *)out)[at + kk * NR + j] = value;
            }
}

/* x's rows as bf16 pairs for the pair kernels: row r at xb + r * depth, rounded to nearest even,
 * a zero after an odd k (inside a parallel region). */
static void bf16_pairs_body(const float *x, int64_t k, uint16_t *xb, int64_t rows) {
    const int64_t depth = (k + 1) / 2 * 2;
    #pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = 0; i < k; i++) xb[r * depth + i] = bf16_round(x[r * k + i]);
        if (depth > k) xb[r * depth + k] = 0;
    }
}

/* y[r, 0:cols] = bias16 + x[r, :] . panel, for R rows; R is a constant where it is inlined,
 * so the accumulators stay in registers. */
static inline __attribute__((always_inline)) void micro(
        const int R, const int bf16, const void *restrict panel, const float *restrict x, int64_t ldx, int64_t k,
        const float *bias16, float *restrict y, int64_t ldy, int cols) {
    __m256 acc0[MR], acc1[MR];
    const __m256 b0 = _mm256_loadu_ps(bias16), b1 = _mm256_loadu_ps(bias16 + 8);
    const __m256i high_half = _mm256_set1_epi32((int)0xffff0000u);
    #pragma GCC unroll 6
    for (int r = 0; r < R; r++) { acc0[r] = b0; acc1[r] = b1; }
    for (int64_t kk = 0; kk < k; kk++) {
        __m256 w0, w1;
        if (bf16) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)((const uint16_t *)panel + kk * NR));
            w0 = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
            w1 = _mm256_castsi256_ps(_mm256_and_si256(v, high_half));
        } else {
            w0 = _mm256_loadu_ps((const float *)panel + kk * NR);
            w1 = _mm256_loadu_ps((const float *)panel + kk * NR + 8);
        }
        #pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            const __m256 xb = _mm256_broadcast_ss(x + r * ldx + kk);
            acc0[r] = _mm256_fmadd_ps(w0, xb, acc0[r]);
            acc1[r] = _mm256_fmadd_ps(w1, xb, acc1[r]);
        }
    }
    #pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        if (cols == NR) {
            _mm256_storeu_ps(y + r * ldy, acc0[r]);
            _mm256_storeu_ps(y + r * ldy + 8, acc1[r]);
        } else {
            float tmp[NR];
            _mm256_storeu_ps(tmp, acc0[r]);
            _mm256_storeu_ps(tmp + 8, acc1[r]);
            memcpy(y + r * ldy, tmp, (size_t)cols * sizeof(float));
        }
    }
}

#if WIDE_FP32
/* y[r, 0:cols] = bias16 + x[r, :] . panel over an fp32 panel, for R rows (R constant where
 * inlined): the panel's 16 columns in one zmm, one FMA per k step and row, in k order (micro's
 * two half-panel FMAs, lane for lane: the same bits). */
static inline __attribute__((always_inline)) void micro_wide(
        const int R, const float *restrict panel, const float *restrict x, int64_t ldx, int64_t k,
        const float *bias16, float *restrict y, int64_t ldy, int cols) {
    __m512 acc[WIDE_MR];
    const __m512 b = _mm512_loadu_ps(bias16);
    #pragma GCC unroll 12
    for (int r = 0; r < R; r++) acc[r] = b;
    for (int64_t kk = 0; kk < k; kk++) {
        const __m512 w = _mm512_loadu_ps(panel + kk * NR);
        #pragma GCC unroll 12
        for (int r = 0; r < R; r++) acc[r] = _mm512_fmadd_ps(w, _mm512_set1_ps(x[r * ldx + kk]), acc[r]);
    }
    const __mmask16 keep = (__mmask16)(cols == NR ? 0xffffu : (1u << cols) - 1u);
    #pragma GCC unroll 12
    for (int r = 0; r < R; r++) _mm512_mask_storeu_ps(y + r * ldy, keep, acc[r]);
}

static void micro_rows_wide(int rows, const void *panel, const float *x, int64_t ldx, int64_t k,
                            const float *bias16, float *y, int64_t ldy, int cols) {
    const float *w = (const float *)panel;
    switch (rows) {
    case 1: micro_wide(1, w, x, ldx, k, bias16, y, ldy, cols); break;
    case 2: micro_wide(2, w, x, ldx, k, bias16, y, ldy, cols); break;
    case 3: micro_wide(3, w, x, ldx, k, bias16, y, ldy, cols); break;
    case 4: micro_wide(4, w, x, ldx, k, bias16, y, ldy, cols); break;
    case 5: micro_wide(5, w, x, ldx, k, bias16, y, ldy, cols); break;
    case 6: micro_wide(6, w, x, ldx, k, bias16, y, ldy, cols); break;
    case 7: micro_wide(7, w, x, ldx, k, bias16, y, ldy, cols); break;
    case 8: micro_wide(8, w, x, ldx, k, bias16, y, ldy, cols); break;
    case 9: micro_wide(9, w, x, ldx, k, bias16, y, ldy, cols); break;
    case 10: micro_wide(10, w, x, ldx, k, bias16, y, ldy, cols); break;
    case 11: micro_wide(11, w, x, ldx, k, bias16, y, ldy, cols); break;
    default: micro_wide(12, w, x, ldx, k, bias16, y, ldy, cols); break;
    }
}
#endif

#if PAIR_PANELS
/* y[r, 0:cols] = bias16 + x[r, :] . panel over a pair panel, for R rows (R constant where inlined).
 * With xb (x's rows as bf16 pairs: a linear whose inputs round to bf16), one vdpbf16ps per pair of
 * k steps and row. Without it, x in fp32: each half of a pair widened and multiplied by one FMA
 * per k step in k order, the AVX2 build's sums bit for bit. */
static inline __attribute__((always_inline)) void micro_pairs(
        const int R, const uint16_t *restrict panel, const float *restrict x, int64_t ldx,
        const uint16_t *restrict xb, int64_t k, const float *bias16, float *restrict y, int64_t ldy, int cols) {
    __m512 acc[WIDE_MR];
    const __m512 b = _mm512_loadu_ps(bias16);
    #pragma GCC unroll 12
    for (int r = 0; r < R; r++) acc[r] = b;
    const int64_t depth = (k + 1) / 2 * 2;
    if (xb) {
        for (int64_t q = 0; q < depth / 2; q++) {
            const __m512bh w = (__m512bh)_mm512_loadu_si512(panel + q * 2 * NR);
            #pragma GCC unroll 12
            for (int r = 0; r < R; r++) {
                int32_t two;
                memcpy(&two, xb + r * depth + 2 * q, 4);
                acc[r] = _mm512_dpbf16_ps(acc[r], (__m512bh)_mm512_set1_epi32(two), w);
            }
        }
    } else {
        const __m512i high_half = _mm512_set1_epi32((int)0xffff0000u);
        for (int64_t kk = 0; kk < k; kk += 2) {
            const __m512i v = _mm512_loadu_si512(panel + kk * NR);
            const __m512 w0 = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
            const __m512 w1 = _mm512_castsi512_ps(_mm512_and_si512(v, high_half));
            #pragma GCC unroll 12
            for (int r = 0; r < R; r++) {
                acc[r] = _mm512_fmadd_ps(w0, _mm512_set1_ps(x[r * ldx + kk]), acc[r]);
                if (kk + 1 < k)
                    acc[r] = _mm512_fmadd_ps(w1, _mm512_set1_ps(x[r * ldx + kk + 1]), acc[r]);
            }
        }
    }
    const __mmask16 keep = (__mmask16)(cols == NR ? 0xffffu : (1u << cols) - 1u);
    #pragma GCC unroll 12
    for (int r = 0; r < R; r++) _mm512_mask_storeu_ps(y + r * ldy, keep, acc[r]);
}

static void micro_rows_pairs(int rows, const void *panel, const float *x, int64_t ldx, const uint16_t *xb,
                             int64_t k, const float *bias16, float *y, int64_t ldy, int cols) {
    const uint16_t *w = (const uint16_t *)panel;
    switch (rows) {
    case 1: micro_pairs(1, w, x, ldx, xb, k, bias16, y, ldy, cols); break;
    case 2: micro_pairs(2, w, x, ldx, xb, k, bias16, y, ldy, cols); break;
    case 3: micro_pairs(3, w, x, ldx, xb, k, bias16, y, ldy, cols); break;
    case 4: micro_pairs(4, w, x, ldx, xb, k, bias16, y, ldy, cols); break;
    case 5: micro_pairs(5, w, x, ldx, xb, k, bias16, y, ldy, cols); break;
    case 6: micro_pairs(6, w, x, ldx, xb, k, bias16, y, ldy, cols); break;
    case 7: micro_pairs(7, w, x, ldx, xb, k, bias16, y, ldy, cols); break;
    case 8: micro_pairs(8, w, x, ldx, xb, k, bias16, y, ldy, cols); break;
    case 9: micro_pairs(9, w, x, ldx, xb, k, bias16, y, ldy, cols); break;
    case 10: micro_pairs(10, w, x, ldx, xb, k, bias16, y, ldy, cols); break;
    case 11: micro_pairs(11, w, x, ldx, xb, k, bias16, y, ldy, cols); break;
    default: micro_pairs(12, w, x, ldx, xb, k, bias16, y, ldy, cols); break;
    }
}

/* One row against S pair panels at once (micro_streams' job for pair panels). */
static inline __attribute__((always_inline)) void micro_streams_pairs(
        const int S, const char *const *panel, const float *restrict x, const uint16_t *restrict xb, int64_t k,
        const float (*bias16)[NR], float *const *y, const int *cols) {
    __m512 acc[FP32_STREAMS];
    #pragma GCC unroll 8
    for (int s = 0; s < S; s++) acc[s] = _mm512_loadu_ps(bias16[s]);
    if (xb) {
        for (int64_t q = 0; q < (k + 1) / 2; q++) {
            int32_t two;
            memcpy(&two, xb + 2 * q, 4);
            const __m512bh xx = (__m512bh)_mm512_set1_epi32(two);
            #pragma GCC unroll 8
            for (int s = 0; s < S; s++)
                acc[s] = _mm512_dpbf16_ps(acc[s], xx, (__m512bh)_mm512_loadu_si512((const uint16_t *)panel[s] + q * 2 * NR));
        }
    } else {
        const __m512i high_half = _mm512_set1_epi32((int)0xffff0000u);
        for (int64_t kk = 0; kk < k; kk += 2) {
            const __m512 x0 = _mm512_set1_ps(x[kk]), x1 = _mm512_set1_ps(kk + 1 < k ? x[kk + 1] : 0.0f);
            #pragma GCC unroll 8
            for (int s = 0; s < S; s++) {
                const __m512i v = _mm512_loadu_si512((const uint16_t *)panel[s] + kk * NR);
                acc[s] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(v, 16)), x0, acc[s]);
                if (kk + 1 < k)
                    acc[s] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(v, high_half)), x1, acc[s]);
            }
        }
    }
    #pragma GCC unroll 8
    for (int s = 0; s < S; s++)
        _mm512_mask_storeu_ps(y[s], (__mmask16)(cols[s] == NR ? 0xffffu : (1u << cols[s]) - 1u), acc[s]);
}
#endif

/* One instance per (rows, weight type), so the row loops unroll and the load is fixed. */
#define MICRO_ROWS(name, bf16)                                                                         \
    static void name(int rows, const void *panel, const float *x, int64_t ldx, int64_t k,              \
                     const float *bias16, float *y, int64_t ldy, int cols) {                           \
        switch (rows) {                                                                                \
        case 1: micro(1, bf16, panel, x, ldx, k, bias16, y, ldy, cols); break;                         \
        case 2: micro(2, bf16, panel, x, ldx, k, bias16, y, ldy, cols); break;                         \
        case 3: micro(3, bf16, panel, x, ldx, k, bias16, y, ldy, cols); break;                         \
        case 4: micro(4, bf16, panel, x, ldx, k, bias16, y, ldy, cols); break;                         \
        case 5: micro(5, bf16, panel, x, ldx, k, bias16, y, ldy, cols); break;                         \
        default: micro(6, bf16, panel, x, ldx, k, bias16, y, ldy, cols); break;                        \
        }                                                                                              \
    }
MICRO_ROWS(micro_rows_fp32, 0)
MICRO_ROWS(micro_rows_bf16, 1)

/* One row against S panels at once: y_s[0:cols_s] = bias_s + x . panel_s. A core here keeps
 * only so many cache lines in flight per stream it reads (2-core AMD EPYC: a plain one-stream
 * sum reads ~9-11 GB/s per core); S sequential streams side by side keep more in flight. S and
 * bf16 are constants where inlined, so the 2 * S accumulators stay in registers. */
static inline __attribute__((always_inline)) void micro_streams(
        const int S, const int bf16, const char *const *panel, const float *restrict x, int64_t k,
        const float (*bias16)[NR], float *const *y, const int *cols) {
    __m256 acc0[FP32_STREAMS], acc1[FP32_STREAMS];
    const __m256i high_half = _mm256_set1_epi32((int)0xffff0000u);
    #pragma GCC unroll 8
    for (int s = 0; s < S; s++) { acc0[s] = _mm256_loadu_ps(bias16[s]); acc1[s] = _mm256_loadu_ps(bias16[s] + 8); }
    for (int64_t kk = 0; kk < k; kk++) {
        const __m256 xb = _mm256_broadcast_ss(x + kk);
        #pragma GCC unroll 8
        for (int s = 0; s < S; s++) {
            __m256 w0, w1;
            if (bf16) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)((const uint16_t *)panel[s] + kk * NR));
                w0 = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
                w1 = _mm256_castsi256_ps(_mm256_and_si256(v, high_half));
            } else {
                w0 = _mm256_loadu_ps((const float *)panel[s] + kk * NR);
                w1 = _mm256_loadu_ps((const float *)panel[s] + kk * NR + 8);
            }
            acc0[s] = _mm256_fmadd_ps(w0, xb, acc0[s]);
            acc1[s] = _mm256_fmadd_ps(w1, xb, acc1[s]);
        }
    }
    #pragma GCC unroll 8
    for (int s = 0; s < S; s++) {
        float tmp[NR];
        _mm256_storeu_ps(tmp, acc0[s]);
        _mm256_storeu_ps(tmp + 8, acc1[s]);
        memcpy(y[s], tmp, (size_t)cols[s] * sizeof(float));
    }
}

/* The bias of panel p (zero where there is none or past n) and its column count. */
static inline int panel_bias(const float *bias, int64_t n, int64_t p, float *bias16) {
    const int cols = (int)min64(NR, n - p * NR);
    memset(bias16, 0, NR * sizeof(float));
    if (bias) memcpy(bias16, bias + p * NR, (size_t)cols * sizeof(float));
    return cols;
}

/* Panel p of a packed weight (k * NR values each, fp32 or bf16). */
static inline const char *panel_at(const void *panels, int64_t p, int64_t k, int bf16) {
    return (const char *)panels + p * panel_depth(k, bf16) * NR * (bf16 ? 2 : 4);
}

/* Panels first, first + stride, ..., S of them, read side by side (micro_streams). */
static inline void panels_side_by_side(const float *x, const uint16_t *xb, int64_t k, const void *panels, int bf16,
                                       int64_t n, const float *bias, float *y, int64_t first, int64_t stride) {
    const int S = bf16 ? BF16_STREAMS : FP32_STREAMS;
    const char *panel[FP32_STREAMS];
    float *out[FP32_STREAMS], bias16[FP32_STREAMS][NR];
    int cols[FP32_STREAMS];
    for (int s = 0; s < S; s++) {
        const int64_t p = first + s * stride;
        panel[s] = panel_at(panels, p, k, bf16);
        out[s] = y + p * NR;
        cols[s] = panel_bias(bias, n, p, bias16[s]);
    }
#if PAIR_PANELS
    if (bf16)
        micro_streams_pairs(BF16_STREAMS, panel, x, xb, k, (const float (*)[NR])bias16, out, cols);
    else
#else
    (void)xb;
    if (bf16)
        micro_streams(BF16_STREAMS, 1, panel, x, k, (const float (*)[NR])bias16, out, cols);
    else
#endif
        micro_streams(FP32_STREAMS, 0, panel, x, k, (const float (*)[NR])bias16, out, cols);
}

/* Rows [0, rows) of x (xb: as bf16 pairs, or NULL) against panel p: rows <= rows_per_call. */
static inline void panel_rows(int rows, const float *x, const uint16_t *xb, int64_t k, const void *panels, int bf16,
                              int64_t n, const float *bias16, int cols, float *y, int64_t p) {
    const void *panel = panel_at(panels, p, k, bf16);
#if PAIR_PANELS
    if (bf16) {
        micro_rows_pairs(rows, panel, x, k, xb, k, bias16, y + p * NR, n, cols);
        return;
    }
#else
    (void)xb;
#endif
#if WIDE_FP32
    if (!bf16) {
        micro_rows_wide(rows, panel, x, k, k, bias16, y + p * NR, n, cols);
        return;
    }
#endif
    (bf16 ? micro_rows_bf16 : micro_rows_fp32)(rows, panel, x, k, k, bias16, y + p * NR, n, cols);
}

/* How many rows one micro-kernel call of this build takes for fp32 or bf16 panels. */
static inline int rows_per_call(int bf16) {
    if (bf16) return PAIR_PANELS ? WIDE_MR : MR;
    return WIDE_FP32 ? WIDE_MR : MR;
}

static inline void one_panel(const float *x, const uint16_t *xb, int64_t k, const void *panels, int bf16, int64_t n,
                             const float *bias, float *y, int64_t p) {
    float bias16[NR];
    const int cols = panel_bias(bias, n, p, bias16);
    panel_rows(1, x, xb, k, panels, bf16, n, bias16, cols, y, p);
}

/* y [1, n] = x [1, k] W^T + bias. Each thread takes an even, contiguous share of the first
 * panels, cuts it into S runs and reads the runs side by side (micro_streams), the share's
 * last few panels one at a time. One stream's decode of the default model, alternated in one
 * process with one panel at a time (medians; 2-core AMD EPYC): fp32 18.9 against 27.4 ms, bf16
 * 14.7 against 17.1 ms; a plain 2-thread sum of the same bytes took 23.8 and 14.5 ms.
 * The last 1/DYNAMIC_TAIL of the panels go S at a time to whichever thread is free: on a
 * machine shared with other VMs one core often reads slower than the other for a while, and
 * with even shares alone the faster waited at every linear's barrier (~0.9-1.7 ms of a 15 ms
 * one-stream bf16 step). */
#define DYNAMIC_TAIL 8
#define PAIR_ROWS_LCM 12  /* a row block holds whole micro-kernel calls of MR (6) or WIDE_MR (12) rows */
static void one_row_body(const float *x, const uint16_t *xb, int64_t k, const void *panels, int bf16, int64_t n,
                         const float *bias, float *y) {
    const int64_t np = (n + NR - 1) / NR, head = np - np / DYNAMIC_TAIL;
    const int S = bf16 ? BF16_STREAMS : FP32_STREAMS;
    int64_t p0, p1;
    thread_share(head, &p0, &p1);
    const int64_t run = (p1 - p0) / S;
    for (int64_t i = 0; i < run; i++) panels_side_by_side(x, xb, k, panels, bf16, n, bias, y, p0 + i, run);
    for (int64_t p = p0 + S * run; p < p1; p++) one_panel(x, xb, k, panels, bf16, n, bias, y, p);
    #pragma omp for schedule(dynamic, 1)  /* its barrier: every column is written before anyone reads y */
    for (int64_t first = head; first < np; first += S) {
        if (first + S <= np)
            panels_side_by_side(x, xb, k, panels, bf16, n, bias, y, first, 1);
        else
            for (int64_t p = first; p < np; p++) one_panel(x, xb, k, panels, bf16, n, bias, y, p);
    }
}

/* y [m, n] = x [m, k] W^T + bias, W given as panels. Rows are taken in blocks whose slice of x
 * (~192 KB) stays in L2 while the panels stream past it; the (row block, panel) pairs are split
 * evenly between the threads, so one decode row still uses every core, and each thread streams
 * one contiguous run of panels (dynamic hand-outs of four panels broke that run into 72 KB
 * pieces and were ~0.3-1 ms slower over the default model's 30 layers at one row).
 *
 * Each routine below has a body whose loops are orphaned `omp for` constructs: called inside a
 * parallel region (kv_decode_forward's), the region's threads share the loop and meet at its
 * barrier; the exported kv_* wrapper opens a region of its own. */
static void linear_body(const float *x, const uint16_t *xb, int64_t m, int64_t k, const void *panels, int bf16,
                        int64_t n, const float *bias, float *y) {
    if (m == 1) {
        one_row_body(x, xb, k, panels, bf16, n, bias, y);
        return;
    }
    const int64_t np = (n + NR - 1) / NR, depth = (k + 1) / 2 * 2;
    const int mr = rows_per_call(bf16);
    int64_t mb = (192 * 1024 / 4) / k / PAIR_ROWS_LCM * PAIR_ROWS_LCM;
    if (mb < PAIR_ROWS_LCM) mb = PAIR_ROWS_LCM;
    const int64_t nmb = (m + mb - 1) / mb;
    #pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < nmb; b++)
        for (int64_t p = 0; p < np; p++) {
            float bias16[NR];
            const int cols = panel_bias(bias, n, p, bias16);
            const int64_t end = min64(m, (b + 1) * mb);
            for (int64_t r = b * mb; r < end; r += mr)
                panel_rows((int)min64(mr, end - r), x + r * k, xb ? xb + r * depth : NULL, k, panels, bf16, n, bias16,
                           cols, y + r * n, p);
        }
}

/* `rounding` (a bf16 engine's linears; ROUND_* as engine/cpu_kernels/__init__.py names them):
 * ROUND_INPUT multiplies x's rows rounded to bf16 values (a rounded copy: x is the caller's),
 * ROUND_OUTPUT rounds y to bf16 values after the bias. The products of two bf16 values are exact
 * in fp32, so every path that rounds at the same places (oneDNN's bf16 GEMM, these panels, the
 * native decode) differs only in the order of its fp32 sums. */
#define ROUND_INPUT 1
#define ROUND_OUTPUT 2
void kv_linear(const float *x, int64_t m, int64_t k, const void *panels, int64_t bf16, int64_t n,
               const float *bias, float *y, int64_t rounding) {
    /* Rounded rows: as bf16 pairs where pair panels multiply them, else as a rounded fp32 copy. */
    const int pairs = PAIR_PANELS && bf16 && (rounding & ROUND_INPUT);
    float *rounded = (rounding & ROUND_INPUT) && !pairs ? malloc((size_t)(m * k) * sizeof(float)) : NULL;
    uint16_t *xb = pairs ? malloc((size_t)(m * ((k + 1) / 2 * 2)) * sizeof(uint16_t)) : NULL;
    #pragma omp parallel
    {
        if (rounded)
            bf16_rows_body(x, k, rounded, k, m, k);
        if (xb)
            bf16_pairs_body(x, k, xb, m);
        linear_body(rounded ? rounded : x, xb, m, k, panels, (int)bf16, n, bias, y);
        if (rounding & ROUND_OUTPUT)
            bf16_rows_body(y, n, y, n, m, n);
    }
    free(rounded);
    free(xb);
}

/* ---- vector helpers ------------------------------------------------------------------ */

/* e^x with x clamped to [-87.3, 88.3] (the finite single-precision range), Cephes' polynomial
 * as in avx_mathfun: about 1 ulp. */
static inline __m256 exp256(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
    __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    __m256i n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(n));
}

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* ---- small ops -------------------------------------------------------------------------
 * Written with the same operations, in the same order per element, as the torch code they
 * replace (engine/model/layers.py); built with -ffp-contract=off so no multiply-add is fused
 * where torch rounds twice. Two things differ: the RMSNorm sum of squares is added in another
 * order, and SiLU's e^-g is the polynomial above (about 1 ulp) where torch uses Sleef's. */

static inline float sum_of_squares(const float *x, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) { __m256 v = _mm256_loadu_ps(x + i); acc = _mm256_add_ps(acc, _mm256_mul_ps(v, v)); }
    float s = hsum(acc);
    for (; i < n; i++) s += x[i] * x[i];
    return s;
}

/* out[r] = weight * (x[r] * rsqrt(mean(x[r]^2) + eps)), rows of length n. With a residual
 * (vLLM's fused_add_rms_norm): residual[r] = x[r] + residual[r] first, in place, and that sum
 * is what gets normalized. */
static inline void rms_norm_row(const float *x, const float *weight, int64_t n, float eps, float *out) {
    const float scale = 1.0f / sqrtf(sum_of_squares(x, n) / (float)n + eps);
    for (int64_t i = 0; i < n; i++) out[i] = weight[i] * (x[i] * scale);  /* out may be x */
}

static void rms_norm_body(const float *x, float *residual, const float *weight, int64_t rows, int64_t n,
                          float eps, float *out) {
    #pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        if (residual) {
            float *res = residual + r * n;
            for (int64_t i = 0; i < n; i++) res[i] = xr[i] + res[i];
            xr = res;
        }
        rms_norm_row(xr, weight, n, eps, out + r * n);
    }
}

void kv_rms_norm(const float *x, float *residual, const float *weight, int64_t rows, int64_t n, float eps,
                 float *out) {
    #pragma omp parallel if (rows >= 16)
    rms_norm_body(x, residual, weight, rows, n, eps, out);
}

/* Neox-style rotary embedding, in place on the first `heads` heads of each row of x (q's heads
 * then k's, as the packed qkv projection lays them out): x1, x2 = halves of a head;
 * x1' = x1 * cos - x2 * sin, x2' = x2 * cos + x1 * sin, with cos/sin rows [max_pos, d]
 * (each half repeated) looked up by the token's position. */
static void rope_body(float *x, const int64_t *positions, const float *cos_table, const float *sin_table,
                      int64_t tokens, int64_t row_stride, int64_t heads, int64_t d) {
    const int64_t half = d / 2;
    #pragma omp for schedule(static)
    for (int64_t t = 0; t < tokens; t++) {
        const float *c = cos_table + positions[t] * d, *s = sin_table + positions[t] * d;
        for (int64_t h = 0; h < heads; h++) {
            float *x1 = x + t * row_stride + h * d, *x2 = x1 + half;
            for (int64_t i = 0; i < half; i++) {
                const float a = x1[i], b = x2[i];
                x1[i] = a * c[i] + (-b) * s[i];
                x2[i] = b * c[half + i] + a * s[half + i];
            }
        }
    }
}

void kv_rope_inplace(float *x, const int64_t *positions, const float *cos_table, const float *sin_table,
                     int64_t tokens, int64_t row_stride, int64_t heads, int64_t d) {
    #pragma omp parallel if (tokens >= 16)
    rope_body(x, positions, cos_table, sin_table, tokens, row_stride, heads, d);
}

/* out[t, j] = silu(gate) * up for gate_up [tokens, 2 * n] = [gate | up]; silu(g) = g / (1 + e^-g). */
static void silu_and_mul_body(const float *gate_up, int64_t tokens, int64_t n, float *out) {
    #pragma omp for schedule(static)
    for (int64_t t = 0; t < tokens; t++) {
        const float *g = gate_up + t * 2 * n, *u = g + n;
        float *o = out + t * n;
        int64_t j = 0;
        for (; j + 8 <= n; j += 8) {
            const __m256 gv = _mm256_loadu_ps(g + j);
            const __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), gv));
            const __m256 silu = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
            _mm256_storeu_ps(o + j, _mm256_mul_ps(silu, _mm256_loadu_ps(u + j)));
        }
        for (; j < n; j++) o[j] = g[j] / (1.0f + expf(-g[j])) * u[j];
    }
}

void kv_silu_and_mul(const float *gate_up, int64_t tokens, int64_t n, float *out) {
    #pragma omp parallel if (tokens >= 4)
    silu_and_mul_body(gate_up, tokens, n, out);
}

/* dst[0:n] = src[0:n], into an fp32 row or (bf16) rounded into a bf16 row. */
static inline void store_row(void *dst, int64_t slot, const float *src, int64_t n, int bf16) {
    if (!bf16) {
        memcpy((float *)dst + slot * n, src, (size_t)n * sizeof(float));
        return;
    }
    uint16_t *out = (uint16_t *)dst + slot * n;
    for (int64_t i = 0; i < n; i++) out[i] = bf16_round(src[i]);
}

/* vLLM's reshape_and_cache: each token's K and V rows (kvh * d floats, rows of the packed qkv
 * projection: k_stride / v_stride floats apart) stored at its slot of the paged caches
 * (slot = block * block_size + offset, each slot a row of kvh * d, fp32 or bf16); slot -1 is
 * skipped. */
static void reshape_and_cache_body(const float *k, int64_t k_stride, const float *v, int64_t v_stride,
                                   void *k_cache, void *v_cache, int bf16, const int64_t *slots, int64_t tokens,
                                   int64_t row_floats) {
    #pragma omp for schedule(static)
    for (int64_t t = 0; t < tokens; t++) {
        if (slots[t] < 0) continue;
        store_row(k_cache, slots[t], k + t * k_stride, row_floats, bf16);
        store_row(v_cache, slots[t], v + t * v_stride, row_floats, bf16);
    }
}

void kv_reshape_and_cache(const float *k, int64_t k_stride, const float *v, int64_t v_stride,
                          void *k_cache, void *v_cache, int64_t bf16, const int64_t *slots, int64_t tokens,
                          int64_t row_floats) {
    #pragma omp parallel if (tokens >= 64)
    reshape_and_cache_body(k, k_stride, v, v_stride, k_cache, v_cache, (int)bf16, slots, tokens, row_floats);
}

/* ---- memory read bandwidth ------------------------------------------------------------ */

/* acc[s] += the vectors first + s * stride + [0, len), s < FP32_STREAMS, read side by side. */
static inline void add_runs(const float *p, int64_t first, int64_t stride, int64_t len, __m256 *acc) {
    for (int64_t i = 0; i < len; i++) {
        #pragma GCC unroll 8
        for (int s = 0; s < FP32_STREAMS; s++)
            acc[s] = _mm256_add_ps(acc[s], _mm256_loadu_ps(p + 8 * (first + s * stride + i)));
    }
}

/* acc[0] += the vectors [from, to), one stream (a share's or the tail's last few). */
static inline void add_vectors(const float *p, int64_t from, int64_t to, __m256 *acc) {
    for (int64_t v = from; v < to; v++) acc[0] = _mm256_add_ps(acc[0], _mm256_loadu_ps(p + 8 * v));
}

/* Reads floats [0, n) as one_row_body reads panels (each thread an even contiguous share of
 * the first vectors, cut into FP32_STREAMS runs read side by side; the last 1/DYNAMIC_TAIL to
 * whichever thread is free, FP32_STREAMS runs of a fp32 panel's size at a time) and returns
 * their sum, so that no read is skipped. The bench's bandwidth floor (benchmarks/bandwidth.py)
 * takes the faster of this and torch's sum: a floor that the engine's own reads beat would
 * flatter it. */
#define TAIL_RUN 1152  /* vectors: a fp32 panel of the default model's hidden size (16 x 576 floats) */
double kv_read_streams(const float *p, int64_t n) {
    const int64_t vectors = n / 8, head = vectors - vectors / DYNAMIC_TAIL, chunk = FP32_STREAMS * TAIL_RUN;
    double total = 0.0;
    #pragma omp parallel reduction(+:total)
    {
        int64_t v0, v1;
        thread_share(head, &v0, &v1);
        const int64_t run = (v1 - v0) / FP32_STREAMS;
        __m256 acc[FP32_STREAMS];
        for (int s = 0; s < FP32_STREAMS; s++) acc[s] = _mm256_setzero_ps();
        add_runs(p, v0, run, run, acc);
        add_vectors(p, v0 + FP32_STREAMS * run, v1, acc);
        #pragma omp for schedule(dynamic, 1)
        for (int64_t first = head; first < vectors; first += chunk) {
            if (first + chunk <= vectors)
                add_runs(p, first, TAIL_RUN, TAIL_RUN, acc);
            else
                add_vectors(p, first, vectors, acc);
        }
        for (int s = 0; s < FP32_STREAMS; s++) total += hsum(acc[s]);
    }
    for (int64_t i = vectors * 8; i < n; i++) total += p[i];
    return total;
}

/* ---- greedy sampling ------------------------------------------------------------------ */

/* Inserts (value, index) into the descending list of the n best so far (capacity k); an equal
 * value goes after those already there, so ties keep the lower index first. */
static inline void keep_best(float value, int64_t index, float *vals, int64_t *ids, int64_t *n, int64_t k) {
    if (*n == k && !(value > vals[k - 1])) return;
    int64_t j = *n < k ? (*n)++ : k - 1;
    for (; j > 0 && value > vals[j - 1]; j--) { vals[j] = vals[j - 1]; ids[j] = ids[j - 1]; }
    vals[j] = value;
    ids[j] = index;
}

/* Greedy sampling with the candidates the explorer shows, per row of logits [rows, vocab]: the
 * k largest logits in descending order (ties: lower index first, so ids[0] is torch.argmax's
 * token) and their probabilities exp(logit - logsumexp(row)). One pass keeps the top k (a lane
 * is looked at only when it beats the current k-th best), one sums the exponentials; torch's
 * argmax, topk and logsumexp read the row three times with a dispatch each (~1 ms a step for one
 * 49k-token row on the 2-core AMD EPYC). */
void kv_greedy_top(const float *logits, int64_t rows, int64_t vocab, int64_t k, int64_t *top_ids,
                   float *top_probs) {
    #pragma omp parallel for schedule(static) if (rows >= 8)
    for (int64_t r = 0; r < rows; r++) {
        const float *x = logits + r * vocab;
        int64_t *ids = top_ids + r * k, n = 0;
        float *vals = top_probs + r * k;  /* the k best logits, then their probabilities */
        int64_t i = 0;
        for (; i + 8 <= vocab; i += 8) {
            const __m256 kth = _mm256_set1_ps(n < k ? -INFINITY : vals[k - 1]);
            int mask = n < k ? 0xff : _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), kth, _CMP_GT_OQ));
            for (; mask; mask &= mask - 1) {
                const int lane = __builtin_ctz(mask);
                keep_best(x[i + lane], i + lane, vals, ids, &n, k);
            }
        }
        for (; i < vocab; i++) keep_best(x[i], i, vals, ids, &n, k);
        const float mx = vals[0];
        const __m256 vmx = _mm256_set1_ps(mx);
        __m256 vsum = _mm256_setzero_ps();
        for (i = 0; i + 8 <= vocab; i += 8) vsum = _mm256_add_ps(vsum, exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), vmx)));
        float sum = hsum(vsum);
        for (; i < vocab; i++) sum += expf(x[i] - mx);
        const float lse = mx + logf(sum);
        for (int64_t j = 0; j < n; j++) vals[j] = expf(vals[j] - lse);
    }
}

/* ---- paged decode attention ---------------------------------------------------------- */

/* a . b over d floats; b is fp32 or (bf16) bf16. */
static inline __attribute__((always_inline)) float dot(const float *a, const void *b, int64_t d, const int bf16) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < d; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load8(b, i, bf16), acc);
    return hsum(acc);
}

/* In place: s[0:len] = e^(s[0:len] - mx); returns their sum. */
static float exp_and_sum(float *s, int64_t len, float mx) {
    const __m256 vmx = _mm256_set1_ps(mx);
    __m256 vsum = _mm256_setzero_ps();
    int64_t t = 0;
    for (; t + 8 <= len; t += 8) {
        __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(s + t), vmx));
        _mm256_storeu_ps(s + t, e);
        vsum = _mm256_add_ps(vsum, e);
    }
    float sum = hsum(vsum);
    for (; t < len; t++) { s[t] = expf(s[t] - mx); sum += s[t]; }
    return sum;
}

/* One decode's attention over a part of its context, kept unnormalized so that parts combine
 * (FlashDecoding's split-KV): a part holds, per query head j, m[j] the largest score, l[j] the
 * sum of e^(score - m[j]) and acc[j] the sum of e^(score - m[j]) * v: 2h + h*d floats. */
static inline int64_t part_floats(int64_t h, int64_t d) { return h * (2 + d); }

/* Four query heads' dot products with their keys, k_r = key of head j + r: each lane summed in
 * hsum's order, so lane r equals dot(q_r, k_r) to the bit; the four chains run side by side
 * instead of one after another (a lone d = 64 dot waits on its 8 fused multiply-adds in turn). */
static inline __attribute__((always_inline)) __m128 dot4(const float *q, int64_t d, const char *const *k,
                                                          const int bf16) {
    __m256 a[4];
    for (int r = 0; r < 4; r++) a[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < d; i += 8)
        #pragma GCC unroll 4
        for (int r = 0; r < 4; r++) a[r] = _mm256_fmadd_ps(_mm256_loadu_ps(q + r * d + i), load8(k[r], i, bf16), a[r]);
    __m128 b[4];
    for (int r = 0; r < 4; r++) b[r] = _mm_add_ps(_mm256_castps256_ps128(a[r]), _mm256_extractf128_ps(a[r], 1));
    _MM_TRANSPOSE4_PS(b[0], b[1], b[2], b[3]);  /* b[i] lane r: head r's partial sum i */
    return _mm_add_ps(_mm_add_ps(b[0], b[2]), _mm_add_ps(b[1], b[3]));
}

/* Token t's row in a paged cache, and through *n how many of the following rows up to token t1
 * lie in the same block, contiguous (the walks below go block by block, a sequential stream
 * per block that the hardware prefetches). */
static inline const char *block_rows(const void *cache, const int64_t *table, int64_t t, int64_t t1,
                                     int64_t block_size, int64_t row_bytes, int64_t *n) {
    const int64_t off = t % block_size;
    *n = min64(block_size - off, t1 - t);
    return (const char *)cache + (table[t / block_size] * block_size + off) * row_bytes;
}

/* acc[0 : 8 * V] = sum over tokens [t0, t1) of p[t - t0] * v_t[0 : 8 * V], in token order,
 * where v_t starts `at` bytes into token t's V row; the V accumulators stay in registers (V is a
 * constant where inlined). */
static inline __attribute__((always_inline)) void weighted_values(
        const int V, const int bf16, const float *p, const void *v_cache, const int64_t *table, int64_t t0,
        int64_t t1, int64_t block_size, int64_t row_bytes, int64_t at, float *acc) {
    __m256 a[8];
    for (int v = 0; v < V; v++) a[v] = _mm256_setzero_ps();
    for (int64_t b0 = t0, n_in; b0 < t1; b0 += n_in) {
        const char *row = block_rows(v_cache, table, b0, t1, block_size, row_bytes, &n_in) + at;
        for (int64_t t = b0 - t0; t < b0 - t0 + n_in; t++, row += row_bytes) {
            const __m256 w = _mm256_set1_ps(p[t]);
            #pragma GCC unroll 8
            for (int v = 0; v < V; v++) a[v] = _mm256_fmadd_ps(w, load8(row, 8 * v, bf16), a[v]);
        }
    }
    for (int v = 0; v < V; v++) _mm256_storeu_ps(acc + 8 * v, a[v]);
}

/* The part of tokens [t0, t1) of the decode whose query is qi, read through its block table:
 * its tokens in order, block by block (block_rows). Query head j reads KV head j / (h / kvh), as
 * grouped-query attention does. Scores go four heads at a time (dot4); the weighted sum of V
 * goes head by head, 64 values of a row at a time, its 8 accumulators held in registers across
 * the tokens (every row of a part is ~KBs: the re-reads per head come from L1/L2). Both keep
 * dot()'s and the token order's sums, so the bits are those of one token and one head at a
 * time (one stream's attention over ~100 tokens, 30 layers: 0.6-0.7 ms of a bf16 step before,
 * 0.47 ms after, on the 2-core AMD EPYC). `scores` is h * (t1 - t0) floats of scratch. */
static inline __attribute__((always_inline)) void attend_part(
        const int bf16, const float *qi, const void *k_cache, const void *v_cache, const int64_t *table,
        int64_t t0, int64_t t1, int64_t h, int64_t kvh, int64_t d, int64_t block_size, float scale, float *scores,
        float *part) {
    const int64_t g = h / kvh, len = t1 - t0, value_bytes = bf16 ? 2 : 4, row_bytes = kvh * d * value_bytes;
    const int64_t head_bytes = d * value_bytes;
    float *m = part, *l = part + h, *acc = part + 2 * h;
    const __m128 vscale = _mm_set1_ps(scale);
    for (int64_t b0 = t0, n_in; b0 < t1; b0 += n_in) {
        const char *row = block_rows(k_cache, table, b0, t1, block_size, row_bytes, &n_in);
        for (int64_t t = b0 - t0; t < b0 - t0 + n_in; t++, row += row_bytes) {
            int64_t j = 0;
            for (; j + 4 <= h; j += 4) {
                const char *k[4];
                for (int r = 0; r < 4; r++) k[r] = row + ((j + r) / g) * head_bytes;
                float s4[4];
                _mm_storeu_ps(s4, _mm_mul_ps(dot4(qi + j * d, d, k, bf16), vscale));
                for (int r = 0; r < 4; r++) scores[(j + r) * len + t] = s4[r];
            }
            for (; j < h; j++) scores[j * len + t] = dot(qi + j * d, row + (j / g) * head_bytes, d, bf16) * scale;
        }
    }
    for (int64_t j = 0; j < h; j++) {
        float mx = -INFINITY;
        for (int64_t t = 0; t < len; t++) mx = scores[j * len + t] > mx ? scores[j * len + t] : mx;
        m[j] = mx;
        l[j] = len ? exp_and_sum(scores + j * len, len, mx) : 0.0f;
    }
    for (int64_t j = 0; j < h; j++)
        for (int64_t e = 0; e < d; e += 64) {
            if (e + 64 <= d)
                weighted_values(8, bf16, scores + j * len, v_cache, table, t0, t1, block_size, row_bytes,
                                (j / g) * head_bytes + e * value_bytes, acc + j * d + e);
            else
                for (int64_t f = e; f < d; f += 8)
                    weighted_values(1, bf16, scores + j * len, v_cache, table, t0, t1, block_size, row_bytes,
                                    (j / g) * head_bytes + f * value_bytes, acc + j * d + f);
        }
}

/* out[0:d] = query head j's attention output from `nparts` parts `stride` floats apart: each
 * part's sums rescaled to the largest maximum, added, and divided by the total weight. */
static void combine_parts(const float *parts, int64_t nparts, int64_t stride, int64_t h, int64_t d, int64_t j,
                          float *out) {
    float mx = -INFINITY, total = 0.0f;
    for (int64_t p = 0; p < nparts; p++) mx = parts[p * stride + j] > mx ? parts[p * stride + j] : mx;
    for (int64_t e = 0; e < d; e++) out[e] = 0.0f;
    for (int64_t p = 0; p < nparts; p++) {
        const float *part = parts + p * stride;
        if (part[h + j] == 0.0f) continue;  /* an empty part (more threads than tokens) */
        const float w = expf(part[j] - mx);
        total += w * part[h + j];
        const float *acc = part + 2 * h + j * d;
        for (int64_t e = 0; e < d; e++) out[e] += w * acc[e];
    }
    const float inv = 1.0f / total;
    for (int64_t e = 0; e < d; e++) out[e] *= inv;
}

/* Flushes denormals to zero on the calling thread (FTZ | DAZ) and returns the MXCSR to restore
 * after: softmax weights of far-off keys fall below FLT_MIN, and x86 takes ~100 cycles per
 * denormal operand. Such weights are ~1e-38 against a sum >= 1: nothing is lost. */
static inline unsigned int flush_denormals(void) {
    const unsigned int csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040);
    return csr;
}

/* Single-query attention of each decode over its own context, read through its block table.
 * q: [T, h, d] with rows q_stride floats apart (a view into the packed qkv projection);
 * out: [T, h, d] contiguous; rows[i] is decode i's query row; caches: [blocks, block_size, kvh, d]
 * in fp32 or (bf16) bf16; tables: [n, table_stride] block ids; d a multiple of 8; `window` > 0:
 * a sliding window of that many positions (the blocks before it are never read).
 *
 * With at least as many decodes as threads, one task per decode (a task per (decode, KV head)
 * read a third of each row at a stride and waited on DRAM latency: 4x slower on a real model's
 * cache). With fewer, each decode's tokens are split between all the threads and the parts
 * combined: one stream's attention otherwise ran on one core while the other waited (~0.8 ms of
 * a 13 ms bf16 step at one row on the 2-core AMD EPYC; ~0.5 ms split). `scores` (h * the longest
 * length) is the calling thread's own scratch; `parts` holds a part per thread (part_floats),
 * shared. */
static inline __attribute__((always_inline)) void decode_attention(
        const int bf16, const float *q, int64_t q_stride, const void *k_cache, const void *v_cache,
        const int64_t *rows, const int64_t *seq_lens, const int64_t *tables, int64_t table_stride, int64_t n,
        int64_t h, int64_t kvh, int64_t d, int64_t block_size, int64_t window, float scale, float *out, float *scores,
        float *parts) {
    const int64_t threads = omp_get_num_threads(), stride = part_floats(h, d);
    float *mine = parts + omp_get_thread_num() * stride;
    const unsigned int csr = flush_denormals();
    if (n >= threads) {
        #pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < n; i++) {
            attend_part(bf16, q + rows[i] * q_stride, k_cache, v_cache, tables + i * table_stride,
                        window_start(seq_lens[i], window), seq_lens[i], h, kvh, d, block_size, scale, scores, mine);
            for (int64_t j = 0; j < h; j++) combine_parts(mine, 1, stride, h, d, j, out + (rows[i] * h + j) * d);
        }
    } else {
        for (int64_t i = 0; i < n; i++) {
            int64_t t0, t1;
            const int64_t first = window_start(seq_lens[i], window);
            thread_share(seq_lens[i] - first, &t0, &t1);
            attend_part(bf16, q + rows[i] * q_stride, k_cache, v_cache, tables + i * table_stride, first + t0,
                        first + t1, h, kvh, d, block_size, scale, scores, mine);
            #pragma omp barrier
            #pragma omp for schedule(static)
            for (int64_t j = 0; j < h; j++) combine_parts(parts, threads, stride, h, d, j, out + (rows[i] * h + j) * d);
        }
    }
    _mm_setcsr(csr);
}

static void decode_attention_body(const float *q, int64_t q_stride, const void *k_cache, const void *v_cache, int bf16,
                                  const int64_t *rows, const int64_t *seq_lens, const int64_t *tables,
                                  int64_t table_stride, int64_t n, int64_t h, int64_t kvh, int64_t d,
                                  int64_t block_size, int64_t window, float scale, float *out, float *scores,
                                  float *parts) {
    if (bf16)
        decode_attention(1, q, q_stride, k_cache, v_cache, rows, seq_lens, tables, table_stride, n, h, kvh, d,
                         block_size, window, scale, out, scores, parts);
    else
        decode_attention(0, q, q_stride, k_cache, v_cache, rows, seq_lens, tables, table_stride, n, h, kvh, d,
                         block_size, window, scale, out, scores, parts);
}

static int64_t longest(const int64_t *seq_lens, int64_t n) {
    int64_t max_len = 1;
    for (int64_t i = 0; i < n; i++) max_len = seq_lens[i] > max_len ? seq_lens[i] : max_len;
    return max_len;
}

void kv_paged_decode_attention(const float *q, int64_t q_stride, const void *k_cache, const void *v_cache,
                               int64_t bf16, const int64_t *rows, const int64_t *seq_lens, const int64_t *tables,
                               int64_t table_stride, int64_t n, int64_t h, int64_t kvh, int64_t d,
                               int64_t block_size, int64_t window, float scale, float *out) {
    const int64_t max_len = longest(seq_lens, n);
    float *parts = malloc((size_t)(omp_get_max_threads() * part_floats(h, d)) * sizeof(float));
    #pragma omp parallel
    {
        float *scores = malloc((size_t)(h * max_len) * sizeof(float));
        decode_attention_body(q, q_stride, k_cache, v_cache, (int)bf16, rows, seq_lens, tables, table_stride, n, h, kvh, d,
                              block_size, window, scale, out, scores, parts);
        free(scores);
    }
    free(parts);
}

/* ---- paged prefill attention ----------------------------------------------------------
 * The causal attention of a step's prompt rows (fresh prompts, chunks, prefix hits alike),
 * every key and value read from the paged cache through the block table after this step's
 * stores: a fresh prompt attends to its K/V as the cache holds them, as a prefix hit does.
 *
 * A task is one KV head's query heads over TILE_ROWS (query, head) pairs of one sequence, one
 * pair per vector lane: the tile's queries are transposed once, and each step of the walk
 * scores CHUNK_KEYS keys against all of them with broadcast-and-FMA (four keys by three
 * vectors of lanes, twelve accumulators), then adds the weighted values the same way. The
 * softmax is online (FlashAttention's running maximum and sum), per lane.
 *
 * Every lane is computed alone, in a fixed order: its dot products over d in order, its keys
 * in position order, in chunks of CHUNK_KEYS at positions aligned to CHUNK_KEYS, keys past its
 * own position weighted exactly 0 (a max with -inf, an FMA with 0, a rescale by e^0 = 1 leave
 * its sums as they were). So a query row gets the same bits whichever tile, step or chunk of
 * the prompt it is computed in, and whether its context came fresh or from a prefix hit. */
#define TILE_ROWS 24   /* (query, head) pairs per task: three vectors of 8 lanes */
#define TILE_VECS 3
#define CHUNK_KEYS 16  /* keys per step of the walk */

/* A thread's scratch for one tile: queries and output transposed, a chunk's keys and values, its weights. */
static inline int64_t prefill_scratch_floats(int64_t d) {
    return 2 * d * TILE_ROWS + 2 * CHUNK_KEYS * d + CHUNK_KEYS * TILE_ROWS;
}

/* All ones in the lanes that see key position t: their query position (lane_pos) is at or
 * past t, and with a sliding window (window > 0) fewer than `window` positions past it. */
static inline __m256 lanes_seeing(__m256i lane_pos, int64_t t, int64_t window) {
    const __m256i at_or_past = _mm256_cmpgt_epi32(lane_pos, _mm256_set1_epi32((int32_t)(t - 1)));
    if (window <= 0) return _mm256_castsi256_ps(at_or_past);
    const __m256i within = _mm256_cmpgt_epi32(_mm256_set1_epi32((int32_t)(t + window)), lane_pos);
    return _mm256_castsi256_ps(_mm256_and_si256(at_or_past, within));
}

/* dst[0:d] = the d values (fp32 or bf16) at src, in fp32. */
static inline __attribute__((always_inline)) void widen_row(const int bf16, const char *src, int64_t d, float *dst) {
    for (int64_t e = 0; e < d; e += 8) _mm256_storeu_ps(dst + e, load8(src, e, bf16));
}

/* One tile: pairs [pair0, pair0 + npairs) of the sequence whose queries are rows q_start.. of
 * q, at positions ctx.., for KV head c (pair p: query p / g, query head c * g + p % g). */
static inline __attribute__((always_inline)) void prefill_tile(
        const int bf16, const float *q, int64_t q_stride, const void *k_cache, const void *v_cache,
        const int64_t *table, int64_t q_start, int64_t ctx, int64_t pair0, int64_t npairs, int64_t c, int64_t g,
        int64_t h, int64_t kvh, int64_t d, int64_t block_size, int64_t window, float scale, float *out, float *w) {
    float *qt = w, *ot = qt + d * TILE_ROWS, *kc = ot + d * TILE_ROWS, *vc = kc + CHUNK_KEYS * d;
    float *p = vc + CHUNK_KEYS * d;
    const int64_t value_bytes = bf16 ? 2 : 4, row_bytes = kvh * d * value_bytes, at = c * d * value_bytes;
    int32_t pos[TILE_ROWS];
    for (int r = 0; r < TILE_ROWS; r++) {
        const int64_t pair = pair0 + (r < npairs ? r : 0);  /* spare lanes repeat the first pair, unwritten */
        const int64_t qi = pair / g;
        pos[r] = (int32_t)(ctx + qi);
        const float *src = q + (q_start + qi) * q_stride + (c * g + pair % g) * d;
        for (int64_t e = 0; e < d; e++) qt[e * TILE_ROWS + r] = src[e];
    }
    memset(ot, 0, (size_t)(d * TILE_ROWS) * sizeof(float));
    __m256 m[TILE_VECS], l[TILE_VECS];
    __m256i lane_pos[TILE_VECS];
    for (int v = 0; v < TILE_VECS; v++) {
        m[v] = _mm256_set1_ps(-INFINITY);
        l[v] = _mm256_setzero_ps();
        lane_pos[v] = _mm256_loadu_si256((const __m256i *)(pos + 8 * v));
    }
    const __m256 vscale = _mm256_set1_ps(scale);
    const int64_t end = ctx + (pair0 + npairs - 1) / g + 1;  /* past the tile's last query position */
    /* A sliding window: the walk starts at the chunk holding the first key the tile's first
     * query sees. A lane whose window starts later sees nothing in the first chunks: its max
     * stays -inf and its sums 0 there (the rescale of an all -inf chunk is taken as 1). */
    const int64_t first_key = window_start(ctx + pair0 / g + 1, window);
    for (int64_t t0 = first_key / CHUNK_KEYS * CHUNK_KEYS; t0 < end; t0 += CHUNK_KEYS) {
        const int64_t nk = min64(CHUNK_KEYS, end - t0);
        for (int64_t k = 0; k < nk; k++) {
            const int64_t t = t0 + k, slot = table[t / block_size] * block_size + t % block_size;
            widen_row(bf16, (const char *)k_cache + slot * row_bytes + at, d, kc + k * d);
            widen_row(bf16, (const char *)v_cache + slot * row_bytes + at, d, vc + k * d);
        }
        /* scores: p[k][lane] = (q_lane . key k) * scale */
        for (int64_t k = 0; k < nk; k += 4) {
            __m256 acc[4][TILE_VECS];
            for (int kk = 0; kk < 4; kk++)
                for (int v = 0; v < TILE_VECS; v++) acc[kk][v] = _mm256_setzero_ps();
            const int keys = (int)min64(4, nk - k);
            for (int64_t e = 0; e < d; e++) {
                __m256 qv[TILE_VECS];
                for (int v = 0; v < TILE_VECS; v++) qv[v] = _mm256_loadu_ps(qt + e * TILE_ROWS + 8 * v);
                #pragma GCC unroll 4
                for (int kk = 0; kk < 4; kk++) {
                    const __m256 b = _mm256_broadcast_ss(kc + (k + (kk < keys ? kk : 0)) * d + e);
                    for (int v = 0; v < TILE_VECS; v++) acc[kk][v] = _mm256_fmadd_ps(qv[v], b, acc[kk][v]);
                }
            }
            for (int kk = 0; kk < 4; kk++)  /* rows past nk hold a repeat of key k, never read */
                for (int v = 0; v < TILE_VECS; v++)
                    _mm256_storeu_ps(p + (k + kk) * TILE_ROWS + 8 * v, _mm256_mul_ps(acc[kk][v], vscale));
        }
        /* the online softmax: a key past a lane's position is masked out of its max and weighs 0 */
        __m256 corr[TILE_VECS];
        for (int v = 0; v < TILE_VECS; v++) {
            __m256 mx = m[v];
            for (int64_t k = 0; k < nk; k++) {
                const __m256 s = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), _mm256_loadu_ps(p + k * TILE_ROWS + 8 * v),
                                                  lanes_seeing(lane_pos[v], t0 + k, window));
                mx = _mm256_max_ps(mx, s);
            }
            corr[v] = exp256(_mm256_sub_ps(m[v], mx));
            if (window > 0)  /* -inf - -inf: nothing seen yet, nothing to rescale */
                corr[v] = _mm256_blendv_ps(corr[v], _mm256_set1_ps(1.0f),
                                           _mm256_cmp_ps(mx, _mm256_set1_ps(-INFINITY), _CMP_EQ_OQ));
            m[v] = mx;
            l[v] = _mm256_mul_ps(l[v], corr[v]);
            for (int64_t k = 0; k < nk; k++) {
                float *pk = p + k * TILE_ROWS + 8 * v;
                const __m256 e = _mm256_and_ps(exp256(_mm256_sub_ps(_mm256_loadu_ps(pk), mx)),
                                               lanes_seeing(lane_pos[v], t0 + k, window));
                _mm256_storeu_ps(pk, e);
                l[v] = _mm256_add_ps(l[v], e);
            }
        }
        /* values: ot[e][lane] = ot[e][lane] * corr + sum over keys in order of p[k][lane] * v_k[e] */
        for (int64_t e = 0; e < d; e += 4) {
            __m256 acc[4][TILE_VECS];
            for (int ee = 0; ee < 4; ee++)
                for (int v = 0; v < TILE_VECS; v++)
                    acc[ee][v] = _mm256_mul_ps(_mm256_loadu_ps(ot + (e + ee) * TILE_ROWS + 8 * v), corr[v]);
            for (int64_t k = 0; k < nk; k++) {
                __m256 pv[TILE_VECS];
                for (int v = 0; v < TILE_VECS; v++) pv[v] = _mm256_loadu_ps(p + k * TILE_ROWS + 8 * v);
                #pragma GCC unroll 4
                for (int ee = 0; ee < 4; ee++) {
                    const __m256 b = _mm256_broadcast_ss(vc + k * d + e + ee);
                    for (int v = 0; v < TILE_VECS; v++) acc[ee][v] = _mm256_fmadd_ps(pv[v], b, acc[ee][v]);
                }
            }
            for (int ee = 0; ee < 4; ee++)
                for (int v = 0; v < TILE_VECS; v++) _mm256_storeu_ps(ot + (e + ee) * TILE_ROWS + 8 * v, acc[ee][v]);
        }
    }
    float inv[TILE_ROWS];
    for (int v = 0; v < TILE_VECS; v++) _mm256_storeu_ps(inv + 8 * v, _mm256_div_ps(_mm256_set1_ps(1.0f), l[v]));
    for (int r = 0; r < npairs; r++) {
        const int64_t pair = pair0 + r;
        float *dst = out + ((q_start + pair / g) * h + c * g + pair % g) * d;
        for (int64_t e = 0; e < d; e++) dst[e] = ot[e * TILE_ROWS + r] * inv[r];
    }
}

static void prefill_tile_any(const int bf16, const float *q, int64_t q_stride, const void *k_cache,
                             const void *v_cache, const int64_t *table, int64_t q_start, int64_t ctx, int64_t pair0,
                             int64_t npairs, int64_t c, int64_t g, int64_t h, int64_t kvh, int64_t d,
                             int64_t block_size, int64_t window, float scale, float *out, float *w) {
    if (bf16)
        prefill_tile(1, q, q_stride, k_cache, v_cache, table, q_start, ctx, pair0, npairs, c, g, h, kvh, d,
                     block_size, window, scale, out, w);
    else
        prefill_tile(0, q, q_stride, k_cache, v_cache, table, q_start, ctx, pair0, npairs, c, g, h, kvh, d,
                     block_size, window, scale, out, w);
}

/* Sequence i's queries are rows q_starts[i] .. + q_lens[i] of q ([T, h, d], rows q_stride floats
 * apart, each row contiguous), at positions ctx_lens[i] ..; its context, these rows' K/V
 * included, is in the caches ([blocks, block_size, kvh, d], fp32 or bf16) through row i of
 * tables ([n, table_stride]). Writes their rows of out ([T, h, d], contiguous); d a multiple
 * of 8. `window` > 0: a sliding window, each query reads its last `window` positions only. Tasks go to the threads as they free up, the costliest (a sequence's last tiles, which
 * read its longest context) first. */
void kv_paged_prefill_attention(const float *q, int64_t q_stride, const void *k_cache, const void *v_cache,
                                int64_t bf16, const int64_t *q_starts, const int64_t *q_lens, const int64_t *ctx_lens,
                                const int64_t *tables, int64_t table_stride, int64_t n, int64_t h, int64_t kvh,
                                int64_t d, int64_t block_size, int64_t window, float scale, float *out) {
    const int64_t g = h / kvh;
    int64_t *first = malloc((size_t)(n + 1) * sizeof(int64_t));  /* sequence i's tasks start at first[i] */
    first[0] = 0;
    for (int64_t i = 0; i < n; i++) first[i + 1] = first[i] + kvh * ((q_lens[i] * g + TILE_ROWS - 1) / TILE_ROWS);
    const int64_t tasks = first[n];
    #pragma omp parallel
    {
        float *w = malloc((size_t)prefill_scratch_floats(d) * sizeof(float));
        const unsigned int csr = flush_denormals();
        #pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < tasks; task++) {
            int64_t i = 0;
            while (first[i + 1] <= task) i++;
            const int64_t tiles = (first[i + 1] - first[i]) / kvh, local = task - first[i];
            const int64_t c = local % kvh, pair0 = (tiles - 1 - local / kvh) * TILE_ROWS;
            prefill_tile_any((int)bf16, q, q_stride, k_cache, v_cache, tables + i * table_stride, q_starts[i],
                             ctx_lens[i], pair0, min64(TILE_ROWS, q_lens[i] * g - pair0), c, g, h, kvh, d,
                             block_size, window, scale, out, w);
        }
        _mm_setcsr(csr);
        free(w);
    }
    free(first);
}

/* ---- a whole decode forward in one call ------------------------------------------------
 * A decode step of a few rows runs ten small operations per layer. From Python each is a call
 * with its own dispatch, allocation and thread wake-up, which on a CPU costs as much as the
 * operation itself at one row (~13 ms of a 58 ms step on the 2-core AMD EPYC). Here the whole
 * forward, embedding to logits, is one call and one parallel region: the same bodies as the
 * per-operation kernels above, so the same arithmetic in the same order (the same bits), with
 * the threads meeting at each loop's barrier instead of starting afresh. The structs mirror
 * engine/cpu_kernels/__init__.py's ctypes Structures; engine/native_decode.py fills them. */
typedef struct {
    const float *input_norm, *post_attention_norm;  /* [hidden] */
    const void *qkv_panels;                         /* panels in fp32 or bf16, as kv_decoder.bf16 says */
    const float *qkv_bias;                          /* NULL unless the model has one */
    const float *q_norm, *k_norm;                   /* [head_dim], NULL without per-head q/k norms */
    const void *o_panels, *gate_up_panels, *down_panels;
    void *k_cache, *v_cache;                        /* [blocks, block_size, kv_heads, head_dim] */
    int64_t group;                                  /* its KV cache group: 0 full attention, 1 sliding window */
    int64_t window;                                 /* the positions it attends to (0: all) */
} kv_layer;

typedef struct {
    int64_t num_layers, hidden, heads, kv_heads, head_dim, intermediate, block_size, vocab;
    int64_t bf16;                         /* 1: every panel and the KV caches in bf16; 0: fp32 */
    int64_t round_bf16;                   /* 1: layer linears take and give bf16 values, the LM head
                                             takes them (kv_linear's ROUND_INPUT | ROUND_OUTPUT) */
    float eps, attn_scale;
    const float *embedding;               /* [vocab, hidden] */
    const float *final_norm;              /* [hidden] */
    const void *lm_head_panels;           /* [vocab, hidden] packed, as every other linear */
    const float *cos_table, *sin_table;   /* [max_positions, head_dim] */
    const kv_layer *layers;
} kv_decoder;

typedef struct {
    int64_t rows, table_stride;           /* decodes (one token each); block_tables' row stride */
    const int64_t *token_ids, *positions, *slots, *decode_rows, *seq_lens, *block_tables;
    float *x, *residual, *normed, *qkv, *attn, *gate_up, *act, *logits;  /* workspaces of `rows` rows */
    /* The sliding-window group's slots and block tables (a kv_layer of group 1 reads them). */
    int64_t group_table_stride;
    const int64_t *group_slots, *group_block_tables;
} kv_decode_batch;

/* Per-head RMSNorm in place on the q and k heads of each row of the packed qkv (Qwen3). */
static void qk_norm_body(float *qkv, int64_t tokens, int64_t row_stride, const kv_decoder *m, const kv_layer *l) {
    const int64_t d = m->head_dim;
    #pragma omp for schedule(static)
    for (int64_t t = 0; t < tokens; t++)
        for (int64_t j = 0; j < m->heads + m->kv_heads; j++) {
            float *head = qkv + t * row_stride + j * d;
            rms_norm_row(head, j < m->heads ? l->q_norm : l->k_norm, d, m->eps, head);
        }
}

/* The model's forward for a batch of decodes: embedding, every layer (storing each layer's new
 * K/V at the batch's slots), final norm and the LM head; every row's logits end in b->logits
 * (each decode samples). The order of operations is CausalLM's (engine/model/decoder.py). */
/* A workspace of `rows` rows, `width` floats each, rounded to bf16 values in place when the
 * engine's linears round (inside kv_decode_forward's parallel region). */
#define ROUNDED(work, width) do { if (rnd) bf16_rows_body(work, width, work, width, rows, width); } while (0)

/* A linear's input rows where the engine's linears round: as bf16 pairs for pair panels (the
 * pairs returned, as kv_linear makes them), else rounded in place (NULL returned). */
static const uint16_t *rounded_input(float *x, int64_t width, int64_t rows, uint16_t *pairs) {
#if PAIR_PANELS
    bf16_pairs_body(x, width, pairs, rows);
    return pairs;
#else
    (void)pairs;
    bf16_rows_body(x, width, x, width, rows, width);
    return NULL;
#endif
}
#define ROUNDED_INPUT(work, width) (rnd ? rounded_input(work, width, rows, pairs) : NULL)

void kv_decode_forward(const kv_decoder *m, const kv_decode_batch *b) {
    const int64_t rows = b->rows, hidden = m->hidden, d = m->head_dim, inter = m->intermediate;
    const int64_t q_size = m->heads * d, kv_size = m->kv_heads * d, qkv_n = q_size + 2 * kv_size;
    const int64_t max_len = longest(b->seq_lens, rows);
    const int bf16 = (int)m->bf16, rnd = (int)m->round_bf16;
    float *parts = malloc((size_t)(omp_get_max_threads() * part_floats(m->heads, d)) * sizeof(float));
    /* The rounded input rows as bf16 pairs (pair panels; see rounded_input), as wide as the widest. */
    const int64_t widest = hidden > inter ? (hidden > q_size ? hidden : q_size) : (inter > q_size ? inter : q_size);
    uint16_t *pairs = PAIR_PANELS && rnd ? malloc((size_t)(rows * ((widest + 1) / 2 * 2)) * sizeof(uint16_t)) : NULL;
    #pragma omp parallel
    {
        float *scores = malloc((size_t)(m->heads * max_len) * sizeof(float));
        #pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++)  /* the embedding is the first residual */
            memcpy(b->residual + r * hidden, m->embedding + b->token_ids[r] * hidden, (size_t)hidden * sizeof(float));
        for (int64_t i = 0; i < m->num_layers; i++) {
            const kv_layer *l = m->layers + i;
            if (i == 0)
                rms_norm_body(b->residual, NULL, l->input_norm, rows, hidden, m->eps, b->normed);
            else  /* residual += x, normalized */
                rms_norm_body(b->x, b->residual, l->input_norm, rows, hidden, m->eps, b->normed);
            /* Each linear's input and output rounded where kv_linear rounds them. */
            linear_body(b->normed, ROUNDED_INPUT(b->normed, hidden), rows, hidden, l->qkv_panels, bf16, qkv_n,
                        l->qkv_bias, b->qkv);
            ROUNDED(b->qkv, qkv_n);
            if (l->q_norm)
                qk_norm_body(b->qkv, rows, qkv_n, m, l);
            rope_body(b->qkv, b->positions, m->cos_table, m->sin_table, rows, qkv_n, m->heads + m->kv_heads, d);
            /* The layer's KV cache group: its own slots and block tables over the shared pool. */
            const int sliding = l->group == 1;
            reshape_and_cache_body(b->qkv + q_size, qkv_n, b->qkv + q_size + kv_size, qkv_n, l->k_cache, l->v_cache,
                                   bf16, sliding ? b->group_slots : b->slots, rows, kv_size);
            decode_attention_body(b->qkv, qkv_n, l->k_cache, l->v_cache, bf16, b->decode_rows, b->seq_lens,
                                  sliding ? b->group_block_tables : b->block_tables,
                                  sliding ? b->group_table_stride : b->table_stride, rows, m->heads, m->kv_heads, d,
                                  m->block_size, l->window, m->attn_scale, b->attn, scores, parts);
            linear_body(b->attn, ROUNDED_INPUT(b->attn, q_size), rows, q_size, l->o_panels, bf16, hidden, NULL, b->x);
            ROUNDED(b->x, hidden);
            rms_norm_body(b->x, b->residual, l->post_attention_norm, rows, hidden, m->eps, b->normed);
            linear_body(b->normed, ROUNDED_INPUT(b->normed, hidden), rows, hidden, l->gate_up_panels, bf16, 2 * inter,
                        NULL, b->gate_up);
            ROUNDED(b->gate_up, 2 * inter);
            silu_and_mul_body(b->gate_up, rows, inter, b->act);
            linear_body(b->act, ROUNDED_INPUT(b->act, inter), rows, inter, l->down_panels, bf16, hidden, NULL, b->x);
            ROUNDED(b->x, hidden);
        }
        rms_norm_body(b->x, b->residual, m->final_norm, rows, hidden, m->eps, b->normed);
        const uint16_t *head_input = ROUNDED_INPUT(b->normed, hidden);  /* bf16 values in, fp32 logits out */
        /* The head in the same region: from Python it cost an index, a call and a thread wake-up,
         * ~0.3-0.5 ms of a 16 ms one-stream bf16 step on the 2-core AMD EPYC. */
        linear_body(b->normed, head_input, rows, hidden, m->lm_head_panels, bf16, m->vocab, NULL, b->logits);
        free(scores);
    }
    free(parts);
    free(pairs);
}
