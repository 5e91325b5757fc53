/* y = (x W^T) * scale for int4.py's output layer: int8 weights, one fp32 scale per output.
 *
 * The weights become fp32 (exact: they are small integers) and x . w is a chain of fused
 * multiply-adds in input order on fp32 x, so each product is exact and each sum rounds once;
 * the scale multiplies the total. PyTorch's `_weight_int8pack_mm` rounds x, the scales and its
 * output to bf16 instead, and at 16 rows it is several times slower (python -m benchmarks.kernels).
 *
 * Each output is computed by one thread with the same instructions for a row whatever the other
 * rows are, so a row comes out bit for bit as it does alone. Needs AVX2 and FMA in -march=native;
 * elsewhere `int8_matmul_ready` says 0 and int4.py keeps PyTorch's kernel.
 */
#include <stdint.h>

#include "kernels.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#define CHANNELS 16  /* outputs per group: two vectors (one with AVX-512) */

int int8_matmul_ready(void) { return 1; }

#if defined(__AVX512F__)
/* With AVX-512 a group's 16 sums are one vector, so 16 rows share each conversion of the weights,
 * and x is broadcast by the load itself (an embedded broadcast). Each lane's chain of fused
 * multiply-adds is the AVX2 version's, so both give the same numbers. */
#define TILE 16

static inline __m512 fma_x(__m512 acc, __m512 w, const float *x) {  /* acc + *x w */
    __asm__("vfmadd231ps %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*x));
    return acc;
}

static inline __attribute__((always_inline)) void
tile(const float *x, const int8_t *packed, const float *scale, float *y, int64_t width, int64_t outputs,
     int64_t group, const int count) {
    __m512 sum[TILE];
    const int8_t *w = packed + group * width * CHANNELS;
    for (int r = 0; r < count; r++) sum[r] = _mm512_setzero_ps();
    for (int64_t k = 0; k < width; k++) {
        __m512 weights = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(w + k * CHANNELS))));
        for (int r = 0; r < count; r++) sum[r] = fma_x(sum[r], weights, x + r * width + k);
    }
    __m512 d = _mm512_loadu_ps(scale + group * CHANNELS);
    for (int r = 0; r < count; r++) _mm512_storeu_ps(y + r * outputs + group * CHANNELS, _mm512_mul_ps(sum[r], d));
}
#else
#define TILE 6  /* rows that share one conversion of the weights: twelve sums in registers */

/* Outputs [group * 16, +16) for `count` rows; packed is [groups][width][16 channels]. */
static inline __attribute__((always_inline)) void
tile(const float *x, const int8_t *packed, const float *scale, float *y, int64_t width, int64_t outputs,
     int64_t group, const int count) {
    __m256 sum[TILE][2];
    const int8_t *w = packed + group * width * CHANNELS;
    for (int r = 0; r < count; r++) sum[r][0] = sum[r][1] = _mm256_setzero_ps();
    for (int64_t k = 0; k < width; k++) {
        __m128i bytes = _mm_loadu_si128((const __m128i *)(w + k * CHANNELS));
        __m256 low = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
        __m256 high = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(bytes, 8)));
        for (int r = 0; r < count; r++) {
            __m256 a = _mm256_broadcast_ss(x + r * width + k);
            sum[r][0] = _mm256_fmadd_ps(a, low, sum[r][0]);
            sum[r][1] = _mm256_fmadd_ps(a, high, sum[r][1]);
        }
    }
    for (int h = 0; h < 2; h++) {
        __m256 d = _mm256_loadu_ps(scale + group * CHANNELS + 8 * h);
        for (int r = 0; r < count; r++)
            _mm256_storeu_ps(y + r * outputs + group * CHANNELS + 8 * h, _mm256_mul_ps(sum[r][h], d));
    }
}
#endif

/* x [rows, width] and y [rows, outputs], contiguous fp32. Returns 0, or -1 for a shape it does
 * not take. */
int int8_matmul(const float *x, const int8_t *packed, const float *scale, float *y, int64_t rows, int64_t width,
                int64_t outputs, int threads) {
    if (rows < 1 || width < 1 || outputs % CHANNELS) return -1;
    int parallel = threads > 1 && rows * width * outputs > (1 << 16);
    #pragma omp parallel for schedule(dynamic, 16) num_threads(threads) if (parallel)
    for (int64_t group = 0; group < outputs / CHANNELS; group++)
        for (int64_t r0 = 0; r0 < rows; r0 += TILE) {
            const float *xr = x + r0 * width;
            float *out = y + r0 * outputs;
#define TILE_OF(N) case N: tile(xr, packed, scale, out, width, outputs, group, N); break;
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

#else
int int8_matmul_ready(void) { return 0; }

int int8_matmul(const float *x, const int8_t *packed, const float *scale, float *y, int64_t rows, int64_t width,
                int64_t outputs, int threads) {
    (void)x, (void)packed, (void)scale, (void)y, (void)rows, (void)width, (void)outputs, (void)threads;
    return -1;
}
#endif
