/* y = x W^T for int4.py's weights: Q4_1 blocks of 32 along the input (w = d q + m, q in 0..15),
 * d and m in fp16 as a GGUF holds them (0.625 bytes a weight, not 0.75 with fp32 scales).
 *
 * Per block, x . w = d (x . q) + m sum(x). Three versions, by what -march=native offers:
 * - AVX512-BF16 (and BW): x is rounded to bf16 (as PyTorch's int4 kernel does), x . q runs in
 *   bf16 dot products, whose products are exact (q is a small integer), and everything after is
 *   fp32. PyTorch's `_weight_int4pack_mm_for_cpu` instead rounds the scales and its output to
 *   bf16: against float64 it errs by 4e-3 to 1e-2 on SmolLM2's layer shapes, this one by under
 *   1e-6, and this one is 1.3 to 2.2 times as fast.
 * - Elsewhere each row of x becomes int8 per block of 32, as llama.cpp's Q8 does for its own int4
 *   dot products: a block's scale dx is its largest magnitude / 127, and its steps qx = x / dx
 *   rounded to nearest even (int4.py's `int8_blocks`). Then x . w = dx d (qx . q) + m dx sum(qx),
 *   and qx . q is exact in integers, so the result is the float64 dot product of the dequantized
 *   x and w to within fp32 rounding. Two versions give the same bits, each block's integer sum
 *   taken to fp32 by the same chain ((sum dx) d + total, then m dx sum(qx) + that):
 *   - AVX512-VNNI (and BW, without BF16: Cascade Lake, Ice Lake): `vpdpbusd` sums four u8 x s8
 *     products into each int32 lane, 64 products an instruction; 8 rows share an unpacking.
 *   - AVX2 + FMA + F16C: `maddubs` pairs into int16 (eight pairs per lane at most
 *     8 * 2 * 15 * 127 < 2^15), widened to int32; 4 rows share an unpacking.
 *   x's error grows from bf16's 2^-9 of each value to 1/254 of its block's largest
 *   (docs/cpu-weights.md, Quality), and greedy answers change: where BF16 is there, it is kept.
 * `int4_matmul_ready` says which: 1 (bf16 activations), 3 (int8, VNNI), 2 (int8, AVX2), or 0
 * without any, where int4.py keeps PyTorch's kernel. python -m benchmarks.kernels times them.
 *
 * Each output is computed by one thread, with the same instructions for a row whatever the other
 * rows are, so a row comes out bit for bit as it does alone. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#define CHANNELS 16  /* outputs per group */
#define BLOCK 32     /* inputs per Q4_1 block */

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#include <immintrin.h>

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
tile(const uint32_t *pairs, const float *sums, const uint8_t *packed, const uint16_t *scale, const uint16_t *low,
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
        __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(scale + (group * blocks + b) * CHANNELS)));
        __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(low + (group * blocks + b) * CHANNELS)));
        for (int r = 0; r < count; r++) {
            __m512 sum = _mm512_fmadd_ps(part[r], d, _mm512_load_ps(total[r]));
            _mm512_store_ps(total[r], _mm512_fmadd_ps(m, _mm512_set1_ps(sums[r * blocks + b]), sum));
        }
    }
    for (int r = 0; r < count; r++) _mm512_storeu_ps(y + r * outputs + group * CHANNELS, _mm512_load_ps(total[r]));
}

static void rows_of_group(const uint32_t *pairs, const float *sums, const uint8_t *packed, const uint16_t *scale,
                          const uint16_t *low, float *y, int64_t rows, int64_t width, int64_t outputs, int64_t group,
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
int int4_matmul(const float *x, const uint8_t *packed, const uint16_t *scale, const uint16_t *low, float *y,
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

#elif defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include <immintrin.h>

#define TILE 8  /* rows that share one unpacking: 8 int32 sums and 8 fp32 totals in registers */

int int4_matmul_ready(void) { return 3; }

typedef int32_t __attribute__((may_alias)) four_steps;  /* four int8 inputs, read as one operand */

/* Outputs [group * 16, +16) for `count` rows: packed is [groups][blocks][16 pairs][16 channels]
 * bytes (low nibble: the pair's first input). A 32-byte load holds pairs 2k and 2k + 1 for the
 * 16 channels; widened to 16 bits, its nibbles split into (first, second) bytes and its halves
 * interleaved, each 32-bit lane holds one channel's steps for inputs 4k to 4k + 3, which
 * `vpdpbusd` multiplies with those four int8 inputs, broadcast by the instruction's own load. */
static inline __attribute__((always_inline)) void
tile(const int8_t *q, const float *dx, const float *dsum, const uint8_t *packed, const uint16_t *scale,
     const uint16_t *low, float *y, int64_t width, int64_t outputs, int64_t group, const int count) {
    static const uint16_t interleave[32] = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23,
                                            8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    int64_t blocks = width / BLOCK;
    __m512 total[TILE];
    __m512i sum[TILE];
    const __m512i first = _mm512_set1_epi16(0x000F), second = _mm512_set1_epi16(0x0F00);
    const __m512i order = _mm512_loadu_si512(interleave);
    for (int r = 0; r < count; r++) total[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *w = packed + (group * blocks + b) * (BLOCK / 2) * CHANNELS;
        for (int r = 0; r < count; r++) sum[r] = _mm512_setzero_si512();
        for (int k = 0; k < BLOCK / 4; k++) {
            __m512i wide = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(w + k * 2 * CHANNELS)));
            __m512i steps = _mm512_or_si512(_mm512_and_si512(wide, first),
                                            _mm512_and_si512(_mm512_slli_epi16(wide, 4), second));
            steps = _mm512_permutexvar_epi16(order, steps);
            for (int r = 0; r < count; r++)
                __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(sum[r]) : "v"(steps),
                        "m"(*(const four_steps *)(q + r * width + b * BLOCK + 4 * k)));
        }
        __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(scale + (group * blocks + b) * CHANNELS)));
        __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(low + (group * blocks + b) * CHANNELS)));
        for (int r = 0; r < count; r++) {  /* AVX2's chain, with dx and dsum broadcast by the loads */
            __m512 dot = _mm512_cvtepi32_ps(sum[r]);
            __asm__("vmulps %1%{1to16%}, %0, %0" : "+v"(dot) : "m"(dx[r * blocks + b]));
            total[r] = _mm512_fmadd_ps(dot, d, total[r]);
            __asm__("vfmadd231ps %1%{1to16%}, %2, %0" : "+v"(total[r]) : "m"(dsum[r * blocks + b]), "v"(m));
        }
    }
    for (int r = 0; r < count; r++) _mm512_storeu_ps(y + r * outputs + group * CHANNELS, total[r]);
}

#define INT8_ACTIVATIONS

#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

#define TILE 4  /* rows that share one unpacking: 8 int16 sums and 8 fp32 totals in registers */

int int4_matmul_ready(void) { return 2; }

static inline __m256 fp16x8(const uint16_t *h) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h)); }

/* Outputs [group * 16, +16) for `count` rows. A 32-byte load holds input pairs 2k and 2k + 1 for
 * the 16 channels; unpacking its nibbles gives, per 128-bit lane, one pair's steps for 8
 * channels as (first, second) bytes, which maddubs multiplies with the pair's two int8 inputs. */
static inline __attribute__((always_inline)) void
tile(const int8_t *q, const float *dx, const float *dsum, const uint8_t *packed, const uint16_t *scale,
     const uint16_t *low, float *y, int64_t width, int64_t outputs, int64_t group, const int count) {
    int64_t blocks = width / BLOCK;
    __m256 total[TILE][2];
    const __m256i nibble = _mm256_set1_epi8(0x0F);
    const __m256i pick = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,  /* lane 0: inputs 4k, +1 */
                                          2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3); /* lane 1: 4k + 2, +3 */
    for (int r = 0; r < count; r++) total[r][0] = total[r][1] = _mm256_setzero_ps();
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *w = packed + (group * blocks + b) * (BLOCK / 2) * CHANNELS;
        __m256i sum[TILE][2];  /* channels 0-7 and 8-15, each lane half of a block's pairs */
        for (int r = 0; r < count; r++) sum[r][0] = sum[r][1] = _mm256_setzero_si256();
        for (int k = 0; k < BLOCK / 4; k++) {
            __m256i bytes = _mm256_loadu_si256((const __m256i *)(w + k * 2 * CHANNELS));
            __m256i first = _mm256_and_si256(bytes, nibble), second = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), nibble);
            __m256i low8 = _mm256_unpacklo_epi8(first, second), high8 = _mm256_unpackhi_epi8(first, second);
            for (int r = 0; r < count; r++) {
                int32_t four;
                memcpy(&four, q + r * width + b * BLOCK + 4 * k, sizeof four);
                __m256i a = _mm256_shuffle_epi8(_mm256_set1_epi32(four), pick);
                sum[r][0] = _mm256_add_epi16(sum[r][0], _mm256_maddubs_epi16(low8, a));
                sum[r][1] = _mm256_add_epi16(sum[r][1], _mm256_maddubs_epi16(high8, a));
            }
        }
        const uint16_t *d = scale + (group * blocks + b) * CHANNELS, *m = low + (group * blocks + b) * CHANNELS;
        for (int r = 0; r < count; r++) {
            __m256 s = _mm256_set1_ps(dsum[r * blocks + b]), e = _mm256_set1_ps(dx[r * blocks + b]);
            for (int h = 0; h < 2; h++) {
                __m256i n = _mm256_add_epi32(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(sum[r][h])),
                                             _mm256_cvtepi16_epi32(_mm256_extracti128_si256(sum[r][h], 1)));
                __m256 dot = _mm256_mul_ps(_mm256_cvtepi32_ps(n), e);
                total[r][h] = _mm256_fmadd_ps(fp16x8(m + 8 * h), s, _mm256_fmadd_ps(dot, fp16x8(d + 8 * h), total[r][h]));
            }
        }
    }
    for (int r = 0; r < count; r++)
        for (int h = 0; h < 2; h++) _mm256_storeu_ps(y + r * outputs + group * CHANNELS + 8 * h, total[r][h]);
}

#define INT8_ACTIVATIONS

#else
int int4_matmul_ready(void) { return 0; }

int int4_matmul(const float *x, const uint8_t *packed, const uint16_t *scale, const uint16_t *low, float *y,
                int64_t rows, int64_t width, int64_t outputs, int threads) {
    (void)x, (void)packed, (void)scale, (void)low, (void)y, (void)rows, (void)width, (void)outputs, (void)threads;
    return -1;
}
#endif

#ifdef INT8_ACTIVATIONS
/* One row of x as int8 steps per block, each block's scale, and its scale times its steps' sum. */
static void quantize_row(const float *x, int8_t *q, float *dx, float *dsum, int64_t width) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < width / BLOCK; b++) {
        const float *v = x + b * BLOCK;
        __m256 top = _mm256_setzero_ps();
        for (int i = 0; i < BLOCK; i += 8) top = _mm256_max_ps(top, _mm256_andnot_ps(sign, _mm256_loadu_ps(v + i)));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        float d = _mm_cvtss_f32(h) / 127.0f, inverse = d > 0.0f ? 1.0f / d : 0.0f;
        int32_t steps[BLOCK], sum = 0;
        for (int i = 0; i < BLOCK; i += 8)  /* cvtps rounds to nearest even */
            _mm256_storeu_si256((__m256i *)(steps + i),
                                _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + i), _mm256_set1_ps(inverse))));
        for (int i = 0; i < BLOCK; i++) {
            q[b * BLOCK + i] = (int8_t)steps[i];
            sum += steps[i];
        }
        dx[b] = d;
        dsum[b] = d * (float)sum;
    }
}

/* x [rows, width] and y [rows, outputs], contiguous fp32. Returns 0, -1 for a shape it does not
 * take, -2 when out of memory. */
int int4_matmul(const float *x, const uint8_t *packed, const uint16_t *scale, const uint16_t *low, float *y,
                int64_t rows, int64_t width, int64_t outputs, int threads) {
    if (rows < 1 || width % BLOCK || outputs % CHANNELS) return -1;
    int64_t blocks = width / BLOCK;
    int8_t *q = malloc(rows * width);
    float *dx = malloc(rows * blocks * sizeof(float)), *dsum = malloc(rows * blocks * sizeof(float));
    if (!q || !dx || !dsum) {
        free(q);
        free(dx);
        free(dsum);
        return -2;
    }
    int parallel = threads > 1 && rows * width * outputs > (1 << 18);  /* below, starting threads costs more */
    #pragma omp parallel num_threads(threads) if (parallel)
    {
        #pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++)
            quantize_row(x + r * width, q + r * width, dx + r * blocks, dsum + r * blocks, width);
        #pragma omp for schedule(dynamic, 4)
        for (int64_t group = 0; group < outputs / CHANNELS; group++)
            for (int64_t r0 = 0; r0 < rows; r0 += TILE) {
                const int8_t *qr = q + r0 * width;
                const float *er = dx + r0 * blocks, *sr = dsum + r0 * blocks;
                float *out = y + r0 * outputs;
#define TILE_OF(N) case N: tile(qr, er, sr, packed, scale, low, out, width, outputs, group, N); break;
                switch (rows - r0 < TILE ? rows - r0 : TILE) {  /* a constant count per case */
#if TILE == 8
                    TILE_OF(8) TILE_OF(7) TILE_OF(6) TILE_OF(5)
#endif
                    TILE_OF(4) TILE_OF(3) TILE_OF(2) TILE_OF(1)
                }
#undef TILE_OF
            }
    }
    free(q);
    free(dx);
    free(dsum);
    return 0;
}

#endif
