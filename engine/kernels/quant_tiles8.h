/* quant_matmul.c's tiles on AVX2 and in plain C: each block's integer sums (quant_tiles256.h's
 * `pmaddwd` where the CPU has AVX2, else the plain C loops below), then its scales applied eight
 * outputs a vector (f8), each output's fp32 operations the ones quant_tiles512.h applies sixteen at
 * a time: the same integers and the same operations, so the same bits on every path. */
#ifndef ENGINE_KERNELS_QUANT_TILES8_H
#define ENGINE_KERNELS_QUANT_TILES8_H

#if defined(__AVX2__)
#include "quant_tiles256.h"
#else
#define PATH 1
#define TWO_GROUPS 0
#define WIDENS 0
#define SPLIT_LANES 0  /* int8 sums in channel order */
#define TILE 4
#define WIDE_TILE TILE

static inline void int4_sums(const uint8_t *w, const int16_t *xq, int64_t stride, int32_t sums[][CHANNELS],
                             const int count) {
    for (int r = 0; r < count; r++) {
        int32_t acc[CHANNELS] = {0};
        for (int j = 0; j < PAIRS; j++) {
            int32_t a = xq[r * stride + 2 * j], b = xq[r * stride + 2 * j + 1];
            for (int c = 0; c < CHANNELS; c++) acc[c] += (w[j * CHANNELS + c] & 15) * a + (w[j * CHANNELS + c] >> 4) * b;
        }
        memcpy(sums[r], acc, sizeof acc);
    }
}

static inline void int8_sums(const int8_t *w, const int16_t *xq, int64_t stride, int n, int32_t sums[][CHANNELS],
                             const int count) {
    for (int r = 0; r < count; r++) {
        int32_t acc[CHANNELS] = {0};
        for (int i = 0; i < n; i++)
            for (int c = 0; c < CHANNELS; c++) acc[c] += (int32_t)w[i * CHANNELS + c] * xq[r * stride + i];
        memcpy(sums[r], acc, sizeof acc);
    }
}
#endif

/* A block's scales as fp32: fp16 bits (Q4_0, Q4_1, Q8_0: the file's own) or fp32 (Q4_K's d sc and
 * dmin m, exact products of an fp16 and a 6-bit integer, which fp16 cannot hold). */
static inline __attribute__((always_inline)) f8 scales8(const void *p, int64_t at, const int wide) {
    return wide ? load8((const float *)p + at) : half8((const uint16_t *)p + at);
}

/* 8 bytes as fp32: unsigned, and signed */
typedef uint8_t u8x8 __attribute__((vector_size(8)));
typedef int8_t s8x8 __attribute__((vector_size(8)));
static inline f8 bytes8(const uint8_t *p) {
    u8x8 b;
    memcpy(&b, p, sizeof b);
    return __builtin_convertvector(b, f8);
}

static inline f8 signed8(const int8_t *p) {
    s8x8 b;
    memcpy(&b, p, sizeof b);
    return __builtin_convertvector(b, f8);
}

/* 16 channels' values as two f8 (a: channels 0-7, b: 8-15) brought to the int8 sums' order, or
 * (the same shuffle) from that order back: where SPLIT_LANES, (0-3, 8-11) and (4-7, 12-15) */
static inline void split_lanes(f8 *a, f8 *b) {
#if SPLIT_LANES
    f8 first = __builtin_shufflevector(*a, *b, 0, 1, 2, 3, 8, 9, 10, 11);
    *b = __builtin_shufflevector(*a, *b, 4, 5, 6, 7, 12, 13, 14, 15);
    *a = first;
#else
    (void)a, (void)b;
#endif
}

/* a tile's totals, from the sums' order, into y */
static inline __attribute__((always_inline)) void
store_tile(float *y, int64_t y_stride, int64_t group, int64_t r0, f8 total[][2], const int count) {
    for (int r = 0; r < count; r++) {
        split_lanes(&total[r][0], &total[r][1]);
        for (int h = 0; h < 2; h++) store8(y + (r0 + r) * y_stride + group * CHANNELS + 8 * h, total[r][h]);
    }
}

/* Outputs [group * 16, +16) for rows [r0, r0 + count); `widened`: the group's weights as
 * quant_tiles256.h widens them, or NULL (the tiles unpack the packed ones). */
static inline __attribute__((always_inline)) void
int4_tile(const Rows *x, const uint8_t *packed, const void *scale, const void *low, const int wide, float *y,
          int64_t y_stride, int64_t group, int64_t r0, const void *widened, const int count) {
    const int64_t blocks = x->blocks, stride = blocks * QBLOCK;
    f8 total[TILE][2];
    int32_t sums[TILE][CHANNELS];
    for (int r = 0; r < count; r++) total[r][0] = total[r][1] = splat8(0.0f);
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t at = (group * blocks + b) * CHANNELS;
#if WIDENS
        if (widened)
            wide_sums((const __m256i *)widened + b * QBLOCK, x->steps + r0 * stride + b * QBLOCK, stride, PAIRS, sums,
                      count);
        else
#endif
            int4_sums(packed + at * PAIRS, x->steps + r0 * stride + b * QBLOCK, stride, sums, count);
        f8 d[2], m[2];
        if (wide == OWN_SCALES) {  /* Q4_K's: d sc and -dmin m, exact in fp32 */
            const uint16_t *dd = (const uint16_t *)scale + (group * (blocks / K_BLOCKS) + b / K_BLOCKS) * 2 * CHANNELS;
            const uint8_t *sm = (const uint8_t *)low + (group * blocks + b) * 2 * CHANNELS;
            for (int h = 0; h < 2; h++) {
                d[h] = half8(dd + 8 * h) * bytes8(sm + 8 * h);
                m[h] = half8(dd + CHANNELS + 8 * h) * bytes8(sm + CHANNELS + 8 * h);
            }
        } else {
            d[0] = scales8(scale, at, wide), d[1] = scales8(scale, at + 8, wide);
            m[0] = scales8(low, at, wide), m[1] = scales8(low, at + 8, wide);
        }
        split_lanes(&d[0], &d[1]);
        split_lanes(&m[0], &m[1]);
        for (int h = 0; h < 2; h++)
            for (int r = 0; r < count; r++) {
                i8 n;
                memcpy(&n, sums[r] + 8 * h, sizeof n);
                const int64_t xb = (r0 + r) * blocks + b;
                f8 dot = __builtin_convertvector(n, f8) * x->dx[xb];
                total[r][h] = (total[r][h] + dot * d[h]) + x->dsum[xb] * m[h];
            }
    }
    store_tile(y, y_stride, group, r0, total, count);
}

/* one block b of an int8 tile: n of its inputs (QBLOCK, but fewer in a partial last block) */
static inline __attribute__((always_inline)) void
int8_block(const Rows *x, const int8_t *packed, const uint16_t *scale, int64_t group, int64_t r0, int64_t b,
           const int n, const void *widened, f8 total[][2], const int count) {
    const int64_t blocks = x->blocks, stride = blocks * QBLOCK;
    int32_t sums[WIDE_TILE][CHANNELS];
#if WIDENS
    if (widened)  /* a whole block's (int8_tile passes NULL with a partial last one) */
        wide_sums((const __m256i *)widened + b * QBLOCK, x->steps + r0 * stride + b * QBLOCK, stride, PAIRS, sums,
                  count);
    else
#endif
        int8_sums(packed + (group * x->width + b * QBLOCK) * CHANNELS, x->steps + r0 * stride + b * QBLOCK, stride, n,
                  sums, count);
    f8 d[2] = {half8(scale + (group * blocks + b) * CHANNELS), half8(scale + (group * blocks + b) * CHANNELS + 8)};
    split_lanes(&d[0], &d[1]);
    for (int h = 0; h < 2; h++)
        for (int r = 0; r < count; r++) {
            i8 s;
            memcpy(&s, sums[r] + 8 * h, sizeof s);
            total[r][h] = total[r][h] + (__builtin_convertvector(s, f8) * x->dx[(r0 + r) * blocks + b]) * d[h];
        }
}

/* The whole blocks first, their count of inputs a constant, then a partial last block if there is
 * one. With the count known, the compiler leaves out the sums' code for an odd last input, which
 * it had interleaved with every block's: on a Zen 2 machine Gemma 3 270M's output layer at 16 rows
 * went 1.27x as fast, its gate and up (Q5_0's form) 1.26x at 16 rows and 1.29x at 512. */
static inline __attribute__((always_inline)) void
int8_tile(const Rows *x, const int8_t *packed, const uint16_t *scale, float *y, int64_t y_stride, int64_t group,
          int64_t r0, const void *widened, const int count) {
    const int64_t whole = x->width / QBLOCK;
    f8 total[WIDE_TILE][2];
    for (int r = 0; r < count; r++) total[r][0] = total[r][1] = splat8(0.0f);
    for (int64_t b = 0; b < whole; b++) int8_block(x, packed, scale, group, r0, b, QBLOCK, widened, total, count);
    if (whole < x->blocks) int8_block(x, packed, scale, group, r0, whole, (int)(x->width % QBLOCK), NULL, total, count);
    store_tile(y, y_stride, group, r0, total, count);
}

/* int8s: steps times an fp32 scale per sub-block of SUB inputs, plus an fp32 low (or none) per
 * sub-block: total = (total + (w . qx) dx d) + (dx sum(qx)) m, sub-block after sub-block. */
static inline __attribute__((always_inline)) void
int8s_tile(const Rows *x, const int8_t *packed, const void *scale, const void *low, const int own, float *y,
           int64_t y_stride, int64_t group, int64_t r0, const void *widened, const int count) {
    const int64_t blocks = x->blocks, stride = blocks * QBLOCK, subs = 2 * blocks;
    f8 total[TILE][2];
    int32_t sums[TILE][CHANNELS];
    for (int r = 0; r < count; r++) total[r][0] = total[r][1] = splat8(0.0f);
    for (int64_t s = 0; s < subs; s++) {
#if WIDENS
        if (widened)
            wide_sums((const __m256i *)widened + s * SUB, x->steps + r0 * stride + s * SUB, stride, SUB / 2, sums,
                      count);
        else
#endif
            int8_sums(packed + (group * x->width + s * SUB) * CHANNELS, x->steps + r0 * stride + s * SUB, stride, SUB,
                      sums, count);
        const int64_t at = (group * subs + s) * CHANNELS;
        f8 d[2], m[2] = {splat8(0.0f), splat8(0.0f)};
        if (own) {  /* Q6_K's: d sc, exact in fp32; no low */
            const uint16_t *dd = (const uint16_t *)scale + (group * (subs / K_SUBS) + s / K_SUBS) * CHANNELS;
            for (int h = 0; h < 2; h++) d[h] = half8(dd + 8 * h) * signed8((const int8_t *)low + at + 8 * h);
        } else {
            d[0] = load8((const float *)scale + at), d[1] = load8((const float *)scale + at + 8);
            if (low) m[0] = load8((const float *)low + at), m[1] = load8((const float *)low + at + 8);
        }
        split_lanes(&d[0], &d[1]);
        split_lanes(&m[0], &m[1]);
        for (int h = 0; h < 2; h++)
            for (int r = 0; r < count; r++) {
                i8 n;
                memcpy(&n, sums[r] + 8 * h, sizeof n);
                total[r][h] = total[r][h] + (__builtin_convertvector(n, f8) * x->dx[(r0 + r) * blocks + s / 2]) * d[h];
                if (low && !own) total[r][h] = total[r][h] + x->dsum16[(r0 + r) * subs + s] * m[h];
            }
    }
    store_tile(y, y_stride, group, r0, total, count);
}

#endif
