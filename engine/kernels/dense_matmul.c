/* y = x W^T for weights packed in groups of 16 outputs, [outputs / 16][width][16]: int8 weights with
 * one fp32 scale per output (int4.py's output layer), or fp32 weights (fp32.py's Linear layers),
 * kept as bf16 where every one of them is a bf16 value (half the bytes to read, the same numbers).
 *
 * Each weight becomes fp32 (int8's and bf16's exactly) and x . w is a chain of fused
 * multiply-adds in input order on fp32 x, each rounding once; an int8 layer's scale multiplies
 * the total. With AVX512-BF16, an int8 layer (of even width) instead rounds x to bf16, as the int4
 * layers there do, and takes its inputs in pairs through bf16 dot products (`vdpbf16ps`, exact
 * products): twice the products of a fused multiply-add per instruction, 1.7x as fast at 16 rows
 * and 1.3x at one (python -m benchmarks.kernel_ab). PyTorch's `_weight_int8pack_mm` rounds x, the
 * scales and its output to bf16 instead, and at 16 rows it is several times slower (python -m
 * benchmarks.kernels); its fp32 matmul sums a row in an order that depends on how many rows share
 * the call.
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

enum { INT8, FP32, BF16, INT8_PAIRS };  /* the packed weights' type; INT8_PAIRS: int8 on x as bf16 pairs */

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
    if (kind == BF16)  /* a bf16 value is the top half of its fp32 bits */
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)w + at))), 16));
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)((const int8_t *)w + at))));
}

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#define INT8_BF16  /* an int8 layer's x in bf16 pairs, through bf16 dot products */

/* Weights [k, +16) and [k + 1, +16) as the pairs `vdpbf16ps` takes: channel c's lane holds bf16 of
 * w[k][c] (low half) and w[k + 1][c]. An integer of at most 8 significant bits is its fp32 value's
 * top half, so each is exact. */
static inline __m512bh int8_pairs(const int8_t *w) {
    const __m512i tops = _mm512_set_epi16(63, 31, 61, 29, 59, 27, 57, 25, 55, 23, 53, 21, 51, 19, 49, 17,
                                          47, 15, 45, 13, 43, 11, 41, 9, 39, 7, 37, 5, 35, 3, 33, 1);
    __m512 first = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)w)));
    __m512 second = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(w + CHANNELS))));
    return (__m512bh)_mm512_permutex2var_epi16(_mm512_castps_si512(first), tops, _mm512_castps_si512(second));
}

/* x [rows, width] (width even) as bf16 pairs [rows][width / 2], rounded to nearest even; NULL when
 * out of memory. */
static uint32_t *bf16_pairs(const float *x, int64_t rows, int64_t width) {
    uint32_t *pairs = malloc(rows * width / 2 * sizeof(uint32_t));
    if (!pairs) return 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t k = 0; k < width; k += 16) {  /* a last part vector padded with zeros */
            int64_t n = width - k < 16 ? width - k : 16;
            float pad[16] = {0};
            memcpy(pad, x + r * width + k, n * sizeof(float));
            __m256bh halves = _mm512_cvtneps_pbh(_mm512_loadu_ps(pad));
            memcpy((uint16_t *)(pairs + r * width / 2) + k, &halves, n * sizeof(uint16_t));
        }
    return pairs;
}
#endif

/* Outputs [group * 16, +16) for `count` rows; scale NULL: none. x is fp32 [rows][width], or for
 * INT8_PAIRS bf16 pairs [rows][width / 2]. */
static inline __attribute__((always_inline)) void
tile(const void *x, const void *packed, const float *scale, float *y, int64_t width, int64_t outputs,
     int64_t group, const int count, const int kind) {
    __m512 sum[TILE];
    const int64_t base = group * width * CHANNELS;
    for (int r = 0; r < count; r++) sum[r] = _mm512_setzero_ps();
#ifdef INT8_BF16
    if (kind == INT8_PAIRS) {  /* x . w two inputs at a time, each product exact */
        const uint32_t *pairs = x;
        for (int64_t p = 0; p < width / 2; p++) {
            __m512bh weights = int8_pairs((const int8_t *)packed + base + 2 * p * CHANNELS);
            for (int r = 0; r < count; r++)
                __asm__("vdpbf16ps %2%{1to16%}, %1, %0" : "+v"(sum[r]) : "v"(weights), "m"(pairs[r * width / 2 + p]));
        }
    } else
#endif
    for (int64_t k = 0; k < width; k++) {
        __m512 weights = weights16(packed, base + k * CHANNELS, kind);
        for (int r = 0; r < count; r++) sum[r] = fma_x(sum[r], weights, (const float *)x + r * width + k);
    }
    if (scale) {
        __m512 d = _mm512_loadu_ps(scale + group * CHANNELS);
        for (int r = 0; r < count; r++) _mm512_storeu_ps(y + r * outputs + group * CHANNELS, _mm512_mul_ps(sum[r], d));
    } else {
        for (int r = 0; r < count; r++) _mm512_storeu_ps(y + r * outputs + group * CHANNELS, sum[r]);
    }
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
    if (kind == BF16) {  /* a bf16 value is the top half of its fp32 bits */
        __m128i lo = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + at));
        __m128i hi = _mm_loadu_si128((const __m128i *)((const uint16_t *)w + at + 8));
        *low = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(lo), 16));
        *high = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(hi), 16));
        return;
    }
    __m128i bytes = _mm_loadu_si128((const __m128i *)((const int8_t *)w + at));
    *low = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
    *high = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(bytes, 8)));
}

/* Outputs [group * 16, +16) for `count` rows; scale NULL: none. */
static inline __attribute__((always_inline)) void
tile(const void *x, const void *packed, const float *scale, float *y, int64_t width, int64_t outputs,
     int64_t group, const int count, const int kind) {
    __m256 sum[TILE][2];
    const int64_t base = group * width * CHANNELS;
    for (int r = 0; r < count; r++) sum[r][0] = sum[r][1] = _mm256_setzero_ps();
    for (int64_t k = 0; k < width; k++) {
        __m256 low, high;
        weights16(packed, base + k * CHANNELS, kind, &low, &high);
        for (int r = 0; r < count; r++) {
            __m256 a = _mm256_broadcast_ss((const float *)x + r * width + k);
            sum[r][0] = _mm256_fmadd_ps(a, low, sum[r][0]);
            sum[r][1] = _mm256_fmadd_ps(a, high, sum[r][1]);
        }
    }
    for (int h = 0; h < 2; h++) {
        if (scale) {
            __m256 d = _mm256_loadu_ps(scale + group * CHANNELS + 8 * h);
            for (int r = 0; r < count; r++) sum[r][h] = _mm256_mul_ps(sum[r][h], d);
        }
        for (int r = 0; r < count; r++) _mm256_storeu_ps(y + r * outputs + group * CHANNELS + 8 * h, sum[r][h]);
    }
}
#endif

int int8_matmul_ready(void) {
#ifdef INT8_BF16
    return 2;
#else
    return 1;
#endif
}

/* x [rows, width] (fp32, or bf16 pairs for INT8_PAIRS) and y [rows, outputs], contiguous; each
 * group's rows TILE at a time. */
static inline __attribute__((always_inline)) int
dense(const void *x, const void *packed, const float *scale, float *y, int64_t rows, int64_t width,
      int64_t outputs, int threads, const int kind) {
    if (rows < 1 || width < 1 || outputs % CHANNELS) return -1;
    int parallel = threads > 1 && rows * width * outputs > (1 << 16);
    #pragma omp parallel for schedule(dynamic, 16) num_threads(threads) if (parallel)
    for (int64_t group = 0; group < outputs / CHANNELS; group++)
        for (int64_t r0 = 0; r0 < rows; r0 += TILE) {
            const void *xr = kind == INT8_PAIRS ? (const void *)((const uint32_t *)x + r0 * width / 2)
                                                : (const void *)((const float *)x + r0 * width);
            float *out = y + r0 * outputs;
#define TILE_OF(N) case N: tile(xr, packed, scale, out, width, outputs, group, N, kind); break;
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

int int8_matmul(const float *x, const int8_t *packed, const float *scale, float *y, int64_t rows, int64_t width,
                int64_t outputs, int threads) {
#ifdef INT8_BF16
    if (width % 2 == 0 && rows > 0) {
        uint32_t *pairs = bf16_pairs(x, rows, width);
        if (!pairs) return -2;
        int status = dense(pairs, packed, scale, y, rows, width, outputs, threads, INT8_PAIRS);
        free(pairs);
        return status;
    }
#endif
    return dense(x, packed, scale, y, rows, width, outputs, threads, INT8);  /* fp32 x: any width */
}

int fp32_matmul(const float *x, const float *packed, float *y, int64_t rows, int64_t width, int64_t outputs,
                int threads) {
    return dense(x, packed, 0, y, rows, width, outputs, threads, FP32);
}

int bf16_matmul(const float *x, const uint16_t *packed, float *y, int64_t rows, int64_t width, int64_t outputs,
                int threads) {
    return dense(x, packed, 0, y, rows, width, outputs, threads, BF16);
}

#else
int dense_matmul_ready(void) { return 0; }

int int8_matmul_ready(void) { return 0; }

int int8_matmul(const float *x, const int8_t *packed, const float *scale, float *y, int64_t rows, int64_t width,
                int64_t outputs, int threads) {
    (void)x, (void)packed, (void)scale, (void)y, (void)rows, (void)width, (void)outputs, (void)threads;
    return -1;
}

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
