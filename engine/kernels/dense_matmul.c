/* y = x W^T for fp32 weights packed in groups of 16 outputs, [outputs / 16][width][16] (fp32.py's
 * Linear layers), kept as bf16 where every one of them is a bf16 value (half the bytes to read,
 * the same numbers).
 *
 * Each weight becomes fp32 (bf16's exactly) and x . w is a chain of fused multiply-adds in input
 * order on fp32 x, each rounding once. PyTorch's fp32 matmul sums a row in an order that depends
 * on how many rows share the call. This serves models that are not quantized, outside the one
 * arithmetic of arith.h (quant_matmul.c serves the quantized ones): its fused multiply-adds are
 * the AVX2 and AVX-512 versions' alike, but a CPU without FMA runs PyTorch's matmul instead.
 *
 * Each output is computed by one thread with the same instructions for a row whatever the other
 * rows are, so a row comes out bit for bit as it does alone. Needs AVX2 and FMA in -march=native;
 * elsewhere `dense_matmul_ready` says 0 and the callers keep PyTorch's kernels.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#define CHANNELS 16  /* outputs per group: two vectors (one with AVX-512) */

int dense_matmul_ready(void) { return 1; }

enum { FP32, BF16 };  /* the packed weights' type */

#if defined(__AVX512F__)
/* With AVX-512 a group's 16 sums are one vector, so 16 rows share each load of the weights, and x
 * is broadcast by the load itself (an embedded broadcast). Each lane's chain of fused
 * multiply-adds is the AVX2 version's, so both give the same numbers. */
#define TILE 16

static inline __m512 fma_x(__m512 acc, __m512 w, const float *x) {  /* acc + *x w */
    __asm__("vfmadd231ps %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*x));
    return acc;
}

static inline __attribute__((always_inline)) __m512 weights16(const void *w, int64_t at, const int kind) {
    if (kind == FP32) return _mm512_loadu_ps((const float *)w + at);
    /* a bf16 value is the top half of its fp32 bits */
    return _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)w + at))), 16));
}

/* Outputs [group * 16, +16) for `count` rows. */
static inline __attribute__((always_inline)) void
tile(const float *x, const void *packed, float *y, int64_t width, int64_t outputs,
     int64_t group, const int count, const int kind) {
    __m512 sum[TILE];
    const int64_t base = group * width * CHANNELS;
    for (int r = 0; r < count; r++) sum[r] = _mm512_setzero_ps();
    for (int64_t k = 0; k < width; k++) {
        __m512 weights = weights16(packed, base + k * CHANNELS, kind);
        for (int r = 0; r < count; r++) sum[r] = fma_x(sum[r], weights, x + r * width + k);
    }
    for (int r = 0; r < count; r++) _mm512_storeu_ps(y + r * outputs + group * CHANNELS, sum[r]);
}
#else
#define TILE 6  /* rows that share one load of the weights: twelve sums in registers */

static inline __attribute__((always_inline)) void weights16(const void *w, int64_t at, const int kind, __m256 *low,
                                                            __m256 *high) {
    if (kind == FP32) {
        *low = _mm256_loadu_ps((const float *)w + at);
        *high = _mm256_loadu_ps((const float *)w + at + 8);
        return;
    }
    /* a bf16 value is the top half of its fp32 bits */
    __m128i lo = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + at));
    __m128i hi = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + at + 8));
    *low = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(lo), 16));
    *high = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(hi), 16));
}

/* Outputs [group * 16, +16) for `count` rows. */
static inline __attribute__((always_inline)) void
tile(const float *x, const void *packed, float *y, int64_t width, int64_t outputs,
     int64_t group, const int count, const int kind) {
    __m256 sum[TILE][2];
    const int64_t base = group * width * CHANNELS;
    for (int r = 0; r < count; r++) sum[r][0] = sum[r][1] = _mm256_setzero_ps();
    for (int64_t k = 0; k < width; k++) {
        __m256 low, high;
        weights16(packed, base + k * CHANNELS, kind, &low, &high);
        for (int r = 0; r < count; r++) {
            __m256 a = _mm256_broadcast_ss(x + r * width + k);
            sum[r][0] = _mm256_fmadd_ps(a, low, sum[r][0]);
            sum[r][1] = _mm256_fmadd_ps(a, high, sum[r][1]);
        }
    }
    for (int h = 0; h < 2; h++)
        for (int r = 0; r < count; r++) _mm256_storeu_ps(y + r * outputs + group * CHANNELS + 8 * h, sum[r][h]);
}
#endif

/* x [rows, width] and y [rows, outputs], contiguous; each
 * group's rows TILE at a time. */
static inline __attribute__((always_inline)) int
dense(const float *x, const void *packed, float *y, int64_t rows, int64_t width,
      int64_t outputs, int threads, const int kind) {
    if (rows < 1 || width < 1 || outputs % CHANNELS) return -1;
    int parallel = threads > 1 && rows * width * outputs > (1 << 16);
    #pragma omp parallel for schedule(dynamic, 16) num_threads(threads) if (parallel)
    for (int64_t group = 0; group < outputs / CHANNELS; group++)
        for (int64_t r0 = 0; r0 < rows; r0 += TILE) {
            const float *xr = x + r0 * width;
            float *out = y + r0 * outputs;
#define TILE_OF(N) case N: tile(xr, packed, out, width, outputs, group, N, kind); break;
            switch (rows - r0 < TILE ? rows - r0 : TILE) {  /* a constant count per case */
#if TILE == 16
                TILE_OF(16) TILE_OF(15) TILE_OF(14) TILE_OF(13) TILE_OF(12) TILE_OF(11) TILE_OF(10) TILE_OF(9)
                TILE_OF(8) TILE_OF(7)
#endif
                TILE_OF(6) TILE_OF(5) TILE_OF(4) TILE_OF(3) TILE_OF(2) TILE_OF(1)
            }
#undef TILE_OF
        }
    return 0;
}

int fp32_matmul(const float *x, const float *packed, float *y, int64_t rows, int64_t width, int64_t outputs,
                int threads) {
    return dense(x, packed, y, rows, width, outputs, threads, FP32);
}

int bf16_matmul(const float *x, const uint16_t *packed, float *y, int64_t rows, int64_t width, int64_t outputs,
                int threads) {
    return dense(x, packed, y, rows, width, outputs, threads, BF16);
}

#else
int dense_matmul_ready(void) { return 0; }

int fp32_matmul(const float *x, const float *packed, float *y, int64_t rows, int64_t width, int64_t outputs,
                int threads) {
    (void)x, (void)packed, (void)y, (void)rows, (void)width, (void)outputs, (void)threads;
    return -1;
}

int bf16_matmul(const float *x, const uint16_t *packed, float *y, int64_t rows, int64_t width, int64_t outputs,
                int threads) {
    (void)x, (void)packed, (void)y, (void)rows, (void)width, (void)outputs, (void)threads;
    return -1;
}
#endif
