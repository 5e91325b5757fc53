/* quant_tiles8.h's integer sums on AVX2 (`pmaddwd`, 16 products an instruction): the same
 * integers as the plain C and AVX-512 sums, so the same bits. A register holds an input pair's
 * weights for 8 of a group's 16 outputs, each output's two steps side by side as int16; x's pair
 * is broadcast from memory, and `pmaddwd` takes a row's 16 products. Three rows share each
 * unpacking of the weights (16 registers: two accumulators a row). */
#ifndef ENGINE_KERNELS_QUANT_TILES256_H
#define ENGINE_KERNELS_QUANT_TILES256_H
#include <immintrin.h>

#define PATH 2
#define TILE 3  /* rows that share one unpacking of a block's weights */
#define WIDE_TILE TILE
#define TWO_GROUPS 0  /* int4 tiles take one group (quant_tiles512.h has int4_tile_two) */

/* int8 sums leave pmaddwd's lanes as they are: channels 0-3 and 8-11 in the first 8, 4-7 and 12-15
 * in the second. The tiles bring each block's scales to that order (one shuffle for all the rows)
 * and their totals back once at the end, instead of each row's sums every block: the same
 * operations on each channel's values, so the same bits. On a Zen 2 machine Gemma 3 270M's
 * output layer at 16 rows went 1.025x as fast, its gate and up 1.02x to 1.04x. */
#define SPLIT_LANES 1

/* acc[r] += the products of one input pair's interleaved weights (a: channels 0-3 | 8-11, b: 4-7 |
 * 12-15, each channel's two steps side by side) with row r's steps 2j and 2j + 1 of x, for `count`
 * rows: every sum's inner loop */
static inline __attribute__((always_inline)) void
pair_products(__m256i a, __m256i b, const int16_t *xq, int64_t stride, int j, __m256i acc[][2], const int count) {
    for (int r = 0; r < count; r++) {
        int32_t pair;
        memcpy(&pair, xq + r * stride + 2 * j, sizeof pair);
        __m256i x = _mm256_set1_epi32(pair);
        acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(a, x));
        acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(b, x));
    }
}

/* int4 pair j's 16 bytes (w: its block's), widened to 16 bits: the low nibbles are the pair's
 * first input's steps, the high ones its second's; interleaved, as int8_pair interleaves two
 * inputs' steps */
static inline __attribute__((always_inline)) void int4_pair(const uint8_t *w, int64_t j, __m256i *a, __m256i *b) {
    const __m256i nibble = _mm256_set1_epi16(0x0F);
    __m256i steps = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(w + j * CHANNELS)));
    __m256i w0 = _mm256_and_si256(steps, nibble), w1 = _mm256_srli_epi16(steps, 4);
    *a = _mm256_unpacklo_epi16(w0, w1);  /* c0-3 | c8-11 */
    *b = _mm256_unpackhi_epi16(w0, w1);  /* c4-7 | c12-15 */
}

/* int8 inputs 2j and 2j + 1 (16 bytes each), widened to 16 bits and interleaved */
static inline __attribute__((always_inline)) void int8_pair(const int8_t *w, int64_t j, __m256i *a, __m256i *b) {
    __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + 2 * j * CHANNELS)));
    __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + (2 * j + 1) * CHANNELS)));
    *a = _mm256_unpacklo_epi16(w0, w1);
    *b = _mm256_unpackhi_epi16(w0, w1);
}

static inline __attribute__((always_inline)) void store_sums(__m256i acc[][2], int32_t sums[][CHANNELS],
                                                             const int count) {
    for (int r = 0; r < count; r++) {  /* in the accumulators' order (SPLIT_LANES) */
        _mm256_storeu_si256((__m256i *)sums[r], acc[r][0]);
        _mm256_storeu_si256((__m256i *)(sums[r] + 8), acc[r][1]);
    }
}

/* int4: one block's integer sums q . qx for 16 channels and `count` rows. A row needs two
 * accumulators, not the four that held each lane's pair apart before, so three rows share a
 * tile without the stack: on a Zen 2 machine a layer's int4 products went 1.20x as fast at one
 * row, 1.36x at 16 and 1.40x at 512, the same integers. */
static inline __attribute__((always_inline)) void
int4_sums(const uint8_t *w, const int16_t *xq, int64_t stride, int32_t sums[][CHANNELS], const int count) {
    fetch_ahead(w, PAIRS * CHANNELS);
    __m256i acc[TILE][2], a, b;
    for (int r = 0; r < count; r++) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    #pragma GCC unroll 4
    for (int j = 0; j < PAIRS; j++) {
        int4_pair(w, j, &a, &b);
        pair_products(a, b, xq, stride, j, acc, count);
    }
    store_sums(acc, sums, count);
}

/* int8: one block's integer sums w . qx (its first n inputs) for 16 channels and `count` rows */
static inline __attribute__((always_inline)) void
int8_sums(const int8_t *w, const int16_t *xq, int64_t stride, int n, int32_t sums[][CHANNELS], const int count) {
    fetch_ahead(w, n * CHANNELS);
    __m256i acc[TILE][2], a, b;
    for (int r = 0; r < count; r++) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    int j = 0;
    /* unrolled four times (GCC left it rolled, its accumulators moved between registers each
     * pass): on a Zen 2 machine Gemma 3 270M's output layer at 16 rows took 45.4 ms, not 48.1,
     * and its engine's sixteen-stream decode went 1.07x as fast */
    #pragma GCC unroll 4
    for (; 2 * j + 1 < n; j++) {
        int8_pair(w, j, &a, &b);
        pair_products(a, b, xq, stride, j, acc, count);
    }
    store_sums(acc, sums, count);
    for (int r = 0; r < count; r++)
        for (int i = 2 * j; i < n; i++)  /* an odd block's last input */
            for (int c = 0; c < CHANNELS; c++)
                sums[r][(c & 3) | (c & 4) << 1 | (c & 8) >> 1] += (int32_t)w[i * CHANNELS + c] * xq[r * stride + i];
}

/* Where many rows share a weight (a prompt's chunk, many streams), each tile of three rows
 * unpacked and widened the group's weights again. Widened once per group into a buffer the
 * caches hold (32 bytes an input: pair j's a and b at ab[2j] and ab[2j + 1]), the tiles only load
 * them; the same integers, so the same bits. A 1.17B Llama-shaped model's layer of Q4_K and Q6_K
 * products at 512 rows went 1.08x as fast on a Zen 2 machine (quant_matmul.c's WIDEN_FROM says
 * from how many rows). */
#define WIDENS 1

static void widen_group(const Weight *w, int64_t group, __m256i *ab) {
    const int64_t pairs = w->width / 2;
    if (w->kind == WEIGHT_INT4 || w->kind == WEIGHT_INT4_F32 || w->kind == WEIGHT_INT4_K) {
        const uint8_t *steps = (const uint8_t *)w->packed + group * w->width * CHANNELS / 2;
        for (int64_t j = 0; j < pairs; j++) {
            if (j % 4 == 0) __builtin_prefetch(steps + AHEAD + j * CHANNELS);
            int4_pair(steps, j, ab + 2 * j, ab + 2 * j + 1);
        }
    } else {
        const int8_t *steps = (const int8_t *)w->packed + group * w->width * CHANNELS;
        for (int64_t j = 0; j < pairs; j++) {
            if (j % 2 == 0) __builtin_prefetch(steps + AHEAD + 2 * j * CHANNELS);
            int8_pair(steps, j, ab + 2 * j, ab + 2 * j + 1);
        }
    }
}

/* `pairs` input pairs' integer sums from widened weights (ab: the first pair's), as int4_sums and
 * int8_sums give them */
static inline __attribute__((always_inline)) void
wide_sums(const __m256i *ab, const int16_t *xq, int64_t stride, const int pairs, int32_t sums[][CHANNELS],
          const int count) {
    __m256i acc[TILE][2];
    for (int r = 0; r < count; r++) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    #pragma GCC unroll 4
    for (int j = 0; j < pairs; j++)
        pair_products(_mm256_load_si256(ab + 2 * j), _mm256_load_si256(ab + 2 * j + 1), xq, stride, j, acc, count);
    store_sums(acc, sums, count);
}

#endif
