/* y = x W^T for int4.py's weights: Q4_1 blocks of 32 along the input (w = d q + m, q in 0..15).
 *
 * Per block, x . w = d (x . q) + m sum(x). x is rounded to bf16 (as PyTorch's int4 kernel does),
 * x . q runs in AVX512-BF16 dot products, whose products are exact (q is a small integer), and
 * everything after is fp32. PyTorch's `_weight_int4pack_mm_for_cpu` instead rounds the scales and
 * its output to bf16: against float64 it errs by 4e-3 to 1e-2 on SmolLM2's layer shapes, this one
 * by under 1e-6, and this one is 1.3 to 2.2 times as fast (python -m benchmarks.kernels).
 *
 * Each output is computed by one thread, with the same instructions for a row whatever the other
 * rows are, so a row comes out bit for bit as it does alone. Without AVX512-BF16 (and BW) in
 * -march=native, an AVX2 + FMA version computes the same formula (below); without those either,
 * `int4_matmul_ready` says 0 and int4.py keeps PyTorch's kernel.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int int4_matmul_ready(void);
int int4_matmul(const float *x, const uint8_t *packed, const float *scale, const float *low, float *y,
                int64_t rows, int64_t width, int64_t outputs, int threads);

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#include <immintrin.h>

#define CHANNELS 16  /* outputs per group: one vector */
#define BLOCK 32     /* inputs per Q4_1 block */
#define TILE 16      /* rows that share one unpacking of a block */

int int4_matmul_ready(void) { return 1; }

static __m512i bf16_of_nibble(void) {  /* 16-bit lane i: bf16 of the integer i mod 16 */
    uint16_t table[32];
    for (int i = 0; i < 32; i++) {
        float value = (float)(i % 16);
        uint32_t bits;
        memcpy(&bits, &value, sizeof bits);
        table[i] = (uint16_t)(bits >> 16);
    }
    return _mm512_loadu_si512(table);
}

/* One row of x: bf16 pairs, and each block's sum of those bf16 values, in input order. */
static void prepare_row(const float *x, uint32_t *pairs, float *sums, int64_t width) {
    for (int64_t k = 0; k < width; k += CHANNELS) {
        __m256bh half = _mm512_cvtneps_pbh(_mm512_loadu_ps(x + k));
        memcpy((uint16_t *)pairs + k, &half, sizeof half);
    }
    for (int64_t b = 0; b < width / BLOCK; b++) {
        float sum = 0.0f;
        for (int i = 0; i < BLOCK; i++) {
            uint32_t bits = (uint32_t)((const uint16_t *)pairs)[b * BLOCK + i] << 16;
            float value;
            memcpy(&value, &bits, sizeof value);
            sum += value;
        }
        sums[b] = sum;
    }
}

/* Outputs [group * 16, +16) for `count` rows: packed is [groups][blocks][16 pairs][16 channels]
 * bytes (low nibble: the pair's first input), scale and low [groups][blocks][16]. */
static inline __attribute__((always_inline)) void
tile(const uint32_t *pairs, const float *sums, const uint8_t *packed, const float *scale, const float *low,
     float *y, int64_t width, int64_t outputs, int64_t group, const int count, __m512i table) {
    int64_t blocks = width / BLOCK, half = width / 2;
    __m512 part[TILE];
    float total[TILE][CHANNELS] __attribute__((aligned(64)));  /* in L1: registers go to `part` */
    const __m512i nibble = _mm512_set1_epi32(0xF);
    for (int r = 0; r < count; r++) _mm512_store_ps(total[r], _mm512_setzero_ps());
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *w = packed + (group * blocks + b) * (BLOCK / 2) * CHANNELS;
        for (int r = 0; r < count; r++) part[r] = _mm512_setzero_ps();
        for (int j = 0; j < BLOCK / 2; j++) {
            __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(w + j * CHANNELS)));
            __m512i index = _mm512_or_si512(_mm512_and_si512(bytes, nibble),
                                            _mm512_slli_epi32(_mm512_srli_epi32(bytes, 4), 16));
            __m512bh q = (__m512bh)_mm512_permutexvar_epi16(index, table);
            for (int r = 0; r < count; r++)
                part[r] = _mm512_dpbf16_ps(part[r], (__m512bh)_mm512_set1_epi32((int)pairs[r * half + b * 16 + j]), q);
        }
        __m512 d = _mm512_loadu_ps(scale + (group * blocks + b) * CHANNELS);
        __m512 m = _mm512_loadu_ps(low + (group * blocks + b) * CHANNELS);
        for (int r = 0; r < count; r++) {
            __m512 sum = _mm512_fmadd_ps(part[r], d, _mm512_load_ps(total[r]));
            _mm512_store_ps(total[r], _mm512_fmadd_ps(m, _mm512_set1_ps(sums[r * blocks + b]), sum));
        }
    }
    for (int r = 0; r < count; r++) _mm512_storeu_ps(y + r * outputs + group * CHANNELS, _mm512_load_ps(total[r]));
}

static void rows_of_group(const uint32_t *pairs, const float *sums, const uint8_t *packed, const float *scale,
                          const float *low, float *y, int64_t rows, int64_t width, int64_t outputs, int64_t group,
                          __m512i table) {
    int64_t half = width / 2, blocks = width / BLOCK;
    for (int64_t r0 = 0; r0 < rows; r0 += TILE) {
        const uint32_t *p = pairs + r0 * half;
        const float *s = sums + r0 * blocks;
        float *out = y + r0 * outputs;
        switch (rows - r0 < TILE ? rows - r0 : TILE) {  /* a constant count per case, for the compiler */
            case 16: tile(p, s, packed, scale, low, out, width, outputs, group, 16, table); break;
            case 15: tile(p, s, packed, scale, low, out, width, outputs, group, 15, table); break;
            case 14: tile(p, s, packed, scale, low, out, width, outputs, group, 14, table); break;
            case 13: tile(p, s, packed, scale, low, out, width, outputs, group, 13, table); break;
            case 12: tile(p, s, packed, scale, low, out, width, outputs, group, 12, table); break;
            case 11: tile(p, s, packed, scale, low, out, width, outputs, group, 11, table); break;
            case 10: tile(p, s, packed, scale, low, out, width, outputs, group, 10, table); break;
            case 9: tile(p, s, packed, scale, low, out, width, outputs, group, 9, table); break;
            case 8: tile(p, s, packed, scale, low, out, width, outputs, group, 8, table); break;
            case 7: tile(p, s, packed, scale, low, out, width, outputs, group, 7, table); break;
            case 6: tile(p, s, packed, scale, low, out, width, outputs, group, 6, table); break;
            case 5: tile(p, s, packed, scale, low, out, width, outputs, group, 5, table); break;
            case 4: tile(p, s, packed, scale, low, out, width, outputs, group, 4, table); break;
            case 3: tile(p, s, packed, scale, low, out, width, outputs, group, 3, table); break;
            case 2: tile(p, s, packed, scale, low, out, width, outputs, group, 2, table); break;
            default: tile(p, s, packed, scale, low, out, width, outputs, group, 1, table);
        }
    }
}

/* x [rows, width] and y [rows, outputs], contiguous fp32. Returns 0, -1 for a shape it does not
 * take, -2 when out of memory. */
int int4_matmul(const float *x, const uint8_t *packed, const float *scale, const float *low, float *y,
                int64_t rows, int64_t width, int64_t outputs, int threads) {
    if (rows < 1 || width % BLOCK || outputs % CHANNELS) return -1;
    uint32_t *pairs = malloc(rows * width / 2 * sizeof(uint32_t));
    float *sums = malloc(rows * width / BLOCK * sizeof(float));
    if (!pairs || !sums) {
        free(pairs);
        free(sums);
        return -2;
    }
    __m512i table = bf16_of_nibble();
    int parallel = threads > 1 && rows * width * outputs > (1 << 16);
    #pragma omp parallel num_threads(threads) if (parallel)
    {
        #pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++)
            prepare_row(x + r * width, pairs + r * width / 2, sums + r * width / BLOCK, width);
        #pragma omp for schedule(static)
        for (int64_t group = 0; group < outputs / CHANNELS; group++)
            rows_of_group(pairs, sums, packed, scale, low, y, rows, width, outputs, group, table);
    }
    free(pairs);
    free(sums);
    return 0;
}

#elif defined(__AVX2__) && defined(__FMA__)
/* The same formula with AVX2 and FMA: each block's 4-bit steps become fp32 (exact), and x . q is a
 * chain of fused multiply-adds in input order, so the products are exact here too; 8 outputs
 * per vector, two per group of 16, and up to TILE rows share each unpacking of the weights (6:
 * twelve sums in registers, and the most that fit). */
#include <immintrin.h>

#define CHANNELS 16
#define BLOCK 32
#define TILE 6

int int4_matmul_ready(void) { return 1; }

/* One row of x rounded to bf16 (round to nearest even, as a float), and each block's sum of those
 * values, in input order. */
static void prepare_row(const float *x, float *rounded, float *sums, int64_t width) {
    const __m256i half = _mm256_set1_epi32(0x7FFF), one = _mm256_set1_epi32(1), top = _mm256_set1_epi32(-65536);
    for (int64_t k = 0; k < width; k += 8) {  /* width is a multiple of BLOCK */
        __m256i bits = _mm256_castps_si256(_mm256_loadu_ps(x + k));
        __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), one);
        bits = _mm256_and_si256(_mm256_add_epi32(bits, _mm256_add_epi32(half, odd)), top);
        _mm256_storeu_ps(rounded + k, _mm256_castsi256_ps(bits));
    }
    for (int64_t b = 0; b < width / BLOCK; b++) {
        float sum = 0.0f;
        for (int i = 0; i < BLOCK; i++) sum += rounded[b * BLOCK + i];
        sums[b] = sum;
    }
}

static inline __attribute__((always_inline)) void
tile(const float *x, const float *sums, const uint8_t *packed, const float *scale, const float *low, float *y,
     int64_t width, int64_t outputs, int64_t group, const int count) {
    int64_t blocks = width / BLOCK;
    __m256 total[TILE][2], part[TILE][2];
    const __m256i nibble = _mm256_set1_epi32(0xF);
    for (int r = 0; r < count; r++) total[r][0] = total[r][1] = _mm256_setzero_ps();
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *w = packed + (group * blocks + b) * (BLOCK / 2) * CHANNELS;
        for (int r = 0; r < count; r++) part[r][0] = part[r][1] = _mm256_setzero_ps();
        for (int j = 0; j < BLOCK / 2; j++) {
            __m128i bytes = _mm_loadu_si128((const __m128i *)(w + j * CHANNELS));
            __m256i first = _mm256_cvtepu8_epi32(bytes), second = _mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8));
            __m256 even0 = _mm256_cvtepi32_ps(_mm256_and_si256(first, nibble));   /* input 2j, channels 0-7 */
            __m256 even1 = _mm256_cvtepi32_ps(_mm256_and_si256(second, nibble));  /* channels 8-15 */
            __m256 odd0 = _mm256_cvtepi32_ps(_mm256_srli_epi32(first, 4));        /* input 2j + 1 */
            __m256 odd1 = _mm256_cvtepi32_ps(_mm256_srli_epi32(second, 4));
            for (int r = 0; r < count; r++) {
                __m256 a = _mm256_broadcast_ss(x + r * width + b * BLOCK + 2 * j);
                __m256 c = _mm256_broadcast_ss(x + r * width + b * BLOCK + 2 * j + 1);
                part[r][0] = _mm256_fmadd_ps(c, odd0, _mm256_fmadd_ps(a, even0, part[r][0]));
                part[r][1] = _mm256_fmadd_ps(c, odd1, _mm256_fmadd_ps(a, even1, part[r][1]));
            }
        }
        const float *d = scale + (group * blocks + b) * CHANNELS, *m = low + (group * blocks + b) * CHANNELS;
        for (int r = 0; r < count; r++) {
            __m256 s = _mm256_set1_ps(sums[r * blocks + b]);
            for (int h = 0; h < 2; h++)
                total[r][h] = _mm256_fmadd_ps(_mm256_loadu_ps(m + 8 * h), s,
                                              _mm256_fmadd_ps(part[r][h], _mm256_loadu_ps(d + 8 * h), total[r][h]));
        }
    }
    for (int r = 0; r < count; r++)
        for (int h = 0; h < 2; h++) _mm256_storeu_ps(y + r * outputs + group * CHANNELS + 8 * h, total[r][h]);
}

/* x [rows, width] and y [rows, outputs], contiguous fp32. Returns 0, -1 for a shape it does not
 * take, -2 when out of memory. */
int int4_matmul(const float *x, const uint8_t *packed, const float *scale, const float *low, float *y,
                int64_t rows, int64_t width, int64_t outputs, int threads) {
    if (rows < 1 || width % BLOCK || outputs % CHANNELS) return -1;
    float *rounded = malloc(rows * width * sizeof(float)), *sums = malloc(rows * width / BLOCK * sizeof(float));
    if (!rounded || !sums) {
        free(rounded);
        free(sums);
        return -2;
    }
    int parallel = threads > 1 && rows * width * outputs > (1 << 16);
    #pragma omp parallel num_threads(threads) if (parallel)
    {
        #pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++)
            prepare_row(x + r * width, rounded + r * width, sums + r * width / BLOCK, width);
        #pragma omp for schedule(static)
        for (int64_t group = 0; group < outputs / CHANNELS; group++)
            for (int64_t r0 = 0; r0 < rows; r0 += TILE) {
                const float *xr = rounded + r0 * width, *sr = sums + r0 * width / BLOCK;
                float *out = y + r0 * outputs;
                switch (rows - r0 < TILE ? rows - r0 : TILE) {  /* a constant count per case */
                    case 6: tile(xr, sr, packed, scale, low, out, width, outputs, group, 6); break;
                    case 5: tile(xr, sr, packed, scale, low, out, width, outputs, group, 5); break;
                    case 4: tile(xr, sr, packed, scale, low, out, width, outputs, group, 4); break;
                    case 3: tile(xr, sr, packed, scale, low, out, width, outputs, group, 3); break;
                    case 2: tile(xr, sr, packed, scale, low, out, width, outputs, group, 2); break;
                    default: tile(xr, sr, packed, scale, low, out, width, outputs, group, 1);
                }
            }
    }
    free(rounded);
    free(sums);
    return 0;
}

#else
int int4_matmul_ready(void) { return 0; }

int int4_matmul(const float *x, const uint8_t *packed, const float *scale, const float *low, float *y,
                int64_t rows, int64_t width, int64_t outputs, int threads) {
    (void)x, (void)packed, (void)scale, (void)low, (void)y, (void)rows, (void)width, (void)outputs, (void)threads;
    return -1;
}
#endif
