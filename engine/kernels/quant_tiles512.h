/* quant_matmul.c's tiles on AVX-512 (AVX512BW; AVX512-VNNI's `vpdpwssd` where the CPU has it):
 * the same integers and the same fp32 operations per output as the AVX2 and plain C tiles, so
 * the same bits, with a group's 16 outputs in one register.
 *
 * Why a version of its own: a register holds a pair of inputs for all 16 outputs as 32 int16
 * weights, so one `vpdpwssd` (or `vpmaddwd` and an add) takes a row's 32 products, with x's pair
 * broadcast from memory. A block's integer sums stay in registers, and its scales are applied
 * there, 16 lanes an instruction: the AVX2 tiles store the sums and reload them as two halves.
 * Eight rows share each unpacking of the weights (32 registers; AVX2 has 16), sixteen where an
 * int8 weight is large enough to stream from memory (quant_matmul.c's STREAMED). A decode's few rows,
 * where little shares the unpacking, take int4 weights in byte products (`vpdpbusd`) where the CPU
 * has AVX512-VBMI and VNNI: the same integers (int4_sums_bytes).
 *
 * Every sum is exact (|w| <= 128, |x| <= 32767, 32 products: under 2^31), and each lane's fp32
 * sequence is the one of quant_tiles8.h's f8 tiles: convert, times dx, times d, plus the total
 * (int4: then plus dx sum(x) times m), each operation rounded on its own (-ffp-contract=off). */
#ifndef ENGINE_KERNELS_QUANT_TILES512_H
#define ENGINE_KERNELS_QUANT_TILES512_H
#include <immintrin.h>

#define PATH 3
#define WIDENS 0  /* the tiles widen each pair in one instruction (quant_tiles256.h's reason is AVX2's) */
#define TILE 8  /* rows that share one unpacking of a block's weights */
#define WIDE_TILE 16  /* rows a large int8 weight's tiles take (quant_matmul.c's STREAMED) */
#define TWO_GROUPS 1  /* int4_tile_two */

/* acc + (w . x) per 32-bit lane: two int16 products, for a pair of inputs `x` broadcast. VNNI's
 * in assembly, with x broadcast by the instruction's own load: GCC 12 copies the accumulator
 * around the builtin twice and broadcasts x in an instruction of its own. */
static inline __attribute__((always_inline)) __m512i dot_pairs(__m512i acc, __m512i w, const int16_t *x) {
#if defined(__AVX512VNNI__)
    __asm__("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t *)(const void *)x));
    return acc;
#else
    int32_t pair;
    memcpy(&pair, x, sizeof pair);
    return _mm512_add_epi32(acc, _mm512_madd_epi16(w, _mm512_set1_epi32(pair)));
#endif
}

/* dot_pairs with x's pair already broadcast in a register (two groups share it) */
static inline __attribute__((always_inline)) __m512i dot_pairs_broadcast(__m512i acc, __m512i w, __m512i x) {
#if defined(__AVX512VNNI__)
    __asm__("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(w), "v"(x));
    return acc;
#else
    return _mm512_add_epi32(acc, _mm512_madd_epi16(w, x));
#endif
}

/* int4: a pair of inputs' steps for 16 outputs, from its 16 bytes (low nibble first): widened to
 * 32 bits, (b | b << 12) & 0x000F000F puts them in a lane's low and high int16. */
static inline __attribute__((always_inline)) __m512i int4_pair(const uint8_t *w) {
    const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)w));
    return _mm512_and_si512(_mm512_or_si512(bytes, _mm512_slli_epi32(bytes, 12)), _mm512_set1_epi32(0x000F000F));
}

/* rows below which a tile is a decode's (one or two streams): nothing shares its unpacking, and
 * int4_sums512 splits each row's chain of `vpdpwssd` in SPLITS, int4_tile converts Q4_K's d and
 * -dmin once a block of 256. A 2048 x 8192 Q4_K weight the caches hold, on this project's 2-core
 * Zen 5 machine (`kernel-ab`): 1.08x at one and two rows; from memory the same as before. */
#define FEW_ROWS 3
#define SPLITS 4

/* int4: one block's q . qx for 16 outputs and `count` rows, pair j's bytes at w + 16 j. Below
 * FEW_ROWS each row sums its pairs in SPLITS chains, added at the end: integers, so the same sums. */
static inline __attribute__((always_inline)) void
int4_sums512(const uint8_t *w, const int16_t *xq, int64_t stride, __m512i acc[], const int count) {
    fetch_ahead(w, PAIRS * CHANNELS);
    if (count < FEW_ROWS) {
        __m512i part[FEW_ROWS - 1][SPLITS];
        for (int r = 0; r < count; r++)
            for (int k = 0; k < SPLITS; k++) part[r][k] = _mm512_setzero_si512();
        for (int j = 0; j < PAIRS; j += SPLITS)
            for (int k = 0; k < SPLITS; k++) {
                const __m512i q = int4_pair(w + (j + k) * CHANNELS);
                for (int r = 0; r < count; r++) part[r][k] = dot_pairs(part[r][k], q, xq + r * stride + 2 * (j + k));
            }
        for (int r = 0; r < count; r++) {
            acc[r] = part[r][0];
            for (int k = 1; k < SPLITS; k++) acc[r] = _mm512_add_epi32(acc[r], part[r][k]);
        }
        return;
    }
    for (int r = 0; r < count; r++) acc[r] = _mm512_setzero_si512();
    for (int j = 0; j < PAIRS; j++) {
        const __m512i q = int4_pair(w + j * CHANNELS);
        for (int r = 0; r < count; r++) acc[r] = dot_pairs(acc[r], q, xq + r * stride + 2 * j);
    }
}

#if defined(__AVX512VBMI__) && defined(__AVX512VNNI__)
/* Below TWO_GROUPS_FROM rows (a decode's), int4 sums in byte products (`vpdpbusd`: four u8 by s8
 * products a lane) where the CPU has them, with `vpermb` to bring a lane its weights. The same
 * integers: with x = 256 hi + lo (hi = x >> 8, a signed byte; lo = x & 255, an unsigned one),
 * q . x = 256 (q . hi) + q . lo, and a step q (0 to 15) is a valid byte either way, so q . hi takes
 * q as the unsigned side and q . lo as the signed one. Each sum is exact (|q . hi| <= 15 * 128 *
 * 32), so int4_sums512's.
 *
 * Why: with few rows little shares the unpacking, and int4_sums512 spends four instructions (one a
 * shuffle) on each 16 bytes of weights before its `vpdpwssd`; here 64 bytes (four pairs of inputs,
 * 16 outputs) take a shuffle and three bit operations, then four `vpdpbusd` a row. On this
 * project's 2-core Zen 5 machine (`kernel-ab`), a 2048 x 8192 Q4_K weight the caches hold: 1.22x at
 * one row, 1.16x at two, 1.12x at four, 1.03x at eight, 1.02x at sixteen; SmolLM2-135M's layer
 * 1.13x at one. The 1.17B's 16 layers, which stream from memory where the machine reads at its
 * usual rate, as before (their time is the bytes); where it reads faster the products' speed
 * shows: the 1.17B's one-stream decode against llama.cpp's went from 0.90x and 0.99x to 1.15x and
 * 1.12x (`benchmarks sizes`, two ABBA runs each). The int8 weights' sums in bytes (hi + 128
 * against signed steps, 128 sum(w) given back) ran 1.03x at one row (their float work per 16
 * inputs dominates): not kept. */
#define BYTE_PLANES 1

/* x's block of 32 steps as four words per eight inputs (pairs 4k to 4k + 3): the even inputs'
 * high bytes, the odd inputs' high bytes, the even inputs' low bytes, the odd ones' low bytes */
static inline void byte_planes(const int16_t *steps, uint8_t *planes, int64_t blocks) {
    uint8_t order[64];
    for (int k = 0; k < 4; k++)
        for (int plane = 0; plane < 4; plane++)
            for (int s = 0; s < 4; s++)
                order[16 * k + 4 * plane + s] = (uint8_t)(2 * (8 * k + 2 * s + (plane & 1)) + (plane < 2));
    const __m512i index = _mm512_loadu_si512(order);
    for (int64_t b = 0; b < blocks; b++)
        _mm512_storeu_si512(planes + 64 * b, _mm512_permutexvar_epi8(index, _mm512_loadu_si512(steps + QBLOCK * b)));
}

/* acc + u . s per 32-bit lane (four byte products), `s`'s four bytes broadcast from memory */
static inline __attribute__((always_inline)) __m512i dot_bytes(__m512i acc, __m512i u, const uint8_t *s) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*(const int32_t *)(const void *)s));
    return acc;
}

/* acc + u . s per 32-bit lane, `u`'s four bytes broadcast (the instruction broadcasts its signed side only) */
static inline __attribute__((always_inline)) __m512i dot_bytes_unsigned(__m512i acc, const uint8_t *u, __m512i s) {
    int32_t four;
    memcpy(&four, u, sizeof four);
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(_mm512_set1_epi32(four)), "v"(s));
    return acc;
}

/* int4_sums512's sums from x's byte planes (`planes`, a row's `stride` bytes apart). A lane (an
 * output) takes bytes 16 s + o of pairs 4k to 4k + 3 (s: the pair, o: the output): one `vpermb`
 * of 64 bytes. Below FEW_ROWS each row sums in four chains, else in two (the registers). */
static inline __attribute__((always_inline)) void
int4_sums_bytes(const uint8_t *w, const uint8_t *planes, int64_t stride, __m512i acc[], const int count) {
    uint8_t order[64];
    for (int o = 0; o < CHANNELS; o++)
        for (int s = 0; s < 4; s++) order[4 * o + s] = (uint8_t)(CHANNELS * s + o);
    const __m512i index = _mm512_loadu_si512(order), nibble = _mm512_set1_epi8(0x0F);
    const int chains = count < FEW_ROWS ? 4 : 2;
    fetch_ahead(w, PAIRS * CHANNELS);
    __m512i part[TILE][4];
    for (int r = 0; r < count; r++)
        for (int i = 0; i < chains; i++) part[r][i] = _mm512_setzero_si512();
    for (int k = 0; k < 4; k++) {
        const __m512i q = _mm512_permutexvar_epi8(index, _mm512_loadu_si512(w + 64 * k));
        const __m512i even = _mm512_and_si512(q, nibble), odd = _mm512_and_si512(_mm512_srli_epi16(q, 4), nibble);
        for (int r = 0; r < count; r++) {
            const uint8_t *x = planes + r * stride + 16 * k;
            __m512i *hi = &part[r][0], *lo = &part[r][chains / 2];
            hi[0] = dot_bytes(hi[0], even, x);
            hi[chains / 2 - 1] = dot_bytes(hi[chains / 2 - 1], odd, x + 4);
            lo[0] = dot_bytes_unsigned(lo[0], x + 8, even);
            lo[chains / 2 - 1] = dot_bytes_unsigned(lo[chains / 2 - 1], x + 12, odd);
        }
    }
    for (int r = 0; r < count; r++) {
        __m512i hi = part[r][0], lo = part[r][chains / 2];
        if (chains == 4) hi = _mm512_add_epi32(hi, part[r][1]), lo = _mm512_add_epi32(lo, part[r][3]);
        acc[r] = _mm512_add_epi32(_mm512_slli_epi32(hi, 8), lo);
    }
}
#endif

/* int4_sums512 of two groups' blocks, w0 and w1, for the same rows: each pair of x is broadcast
 * once for both groups' products, and the 16 sums stay in registers. The same integers. */
static inline __attribute__((always_inline)) void
int4_sums512_two(const uint8_t *w0, const uint8_t *w1, const int16_t *xq, int64_t stride, __m512i acc[][2],
                 const int count) {
    fetch_ahead(w0, PAIRS * CHANNELS);
    fetch_ahead(w1, PAIRS * CHANNELS);
    for (int r = 0; r < count; r++) acc[r][0] = acc[r][1] = _mm512_setzero_si512();
    for (int j = 0; j < PAIRS; j++) {
        const __m512i q[2] = {int4_pair(w0 + j * CHANNELS), int4_pair(w1 + j * CHANNELS)};
        for (int r = 0; r < count; r++) {
            int32_t pair;
            memcpy(&pair, xq + r * stride + 2 * j, sizeof pair);
            const __m512i x = _mm512_set1_epi32(pair);
            for (int g = 0; g < 2; g++) acc[r][g] = dot_pairs_broadcast(acc[r][g], q[g], x);
        }
    }
}

/* int8: w . qx over n inputs ([n][16] int8 weights) for 16 outputs and `count` rows. Inputs 2j and
 * 2j + 1 are 32 bytes; widened to int16 and interleaved, each lane holds one output's two weights.
 * An odd last input pairs with a zero weight. */
static inline __attribute__((always_inline)) void
int8_sums512(const int8_t *w, const int16_t *xq, int64_t stride, int n, __m512i acc[], const int count) {
    const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                                23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    fetch_ahead(w, n * CHANNELS);
    for (int r = 0; r < count; r++) acc[r] = _mm512_setzero_si512();
    int j = 0;
    for (; 2 * j + 1 < n; j++) {
        __m512i pair = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(w + 2 * j * CHANNELS)));
        pair = _mm512_permutexvar_epi16(interleave, pair);
        for (int r = 0; r < count; r++) acc[r] = dot_pairs(acc[r], pair, xq + r * stride + 2 * j);
    }
    if (2 * j < n) {
        __m512i last = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(w + 2 * j * CHANNELS)));
        last = _mm512_and_si512(last, _mm512_set1_epi32(0xFFFF));
        for (int r = 0; r < count; r++) acc[r] = dot_pairs(acc[r], last, xq + r * stride + 2 * j);
    }
}

/* 16 fp16 scales, or fp32 where `wide` */
static inline __attribute__((always_inline)) __m512 scales16(const void *p, int64_t at, const int wide) {
    return wide ? _mm512_loadu_ps((const float *)p + at)
                : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + at)));
}

/* 16 bytes as fp32 */
static inline __attribute__((always_inline)) __m512 bytes16(const uint8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

/* (sum as fp32) dx d, rounded after each product */
static inline __attribute__((always_inline)) __m512 scaled(__m512i sum, float dx, __m512 d) {
    return _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(sum), _mm512_set1_ps(dx)), d);
}

static inline __attribute__((always_inline)) void
store_tile(const __m512 total[], float *y, int64_t y_stride, int64_t group, int64_t r0, const int count) {
    for (int r = 0; r < count; r++) _mm512_storeu_ps(y + (r0 + r) * y_stride + group * CHANNELS, total[r]);
}

/* Q4_K's d and -dmin of the block of 256 that holds block b of a group's 16 outputs */
static inline __attribute__((always_inline)) void
block256_scales(const void *scale, int64_t group, int64_t blocks, int64_t b, __m512 *d256, __m512 *m256) {
    const uint16_t *dd = (const uint16_t *)scale + (group * (blocks / K_BLOCKS) + b / K_BLOCKS) * 2 * CHANNELS;
    *d256 = scales16(dd, 0, 0), *m256 = scales16(dd, CHANNELS, 0);
}

/* Q4_K's d sc and -dmin m of block b of a group's 16 outputs (exact in fp32), given its block of
 * 256's d and -dmin */
static inline __attribute__((always_inline)) void
own_scales(__m512 d256, __m512 m256, const void *low, int64_t group, int64_t blocks, int64_t b, __m512 *d, __m512 *m) {
    const uint8_t *sm = (const uint8_t *)low + (group * blocks + b) * 2 * CHANNELS;
    *d = _mm512_mul_ps(d256, bytes16(sm));
    *m = _mm512_mul_ps(m256, bytes16(sm + CHANNELS));
}

/* block b's d and m of a group's 16 outputs: the layer's fp16 or fp32 ones, or Q4_K's own (d sc
 * and -dmin m, exact in fp32) */
static inline __attribute__((always_inline)) void
int4_scales(const void *scale, const void *low, const int wide, int64_t group, int64_t blocks, int64_t b, __m512 *d,
            __m512 *m) {
    if (wide == OWN_SCALES) {
        __m512 d256, m256;
        block256_scales(scale, group, blocks, b, &d256, &m256);
        own_scales(d256, m256, low, group, blocks, b, d, m);
    } else {
        const int64_t at = (group * blocks + b) * CHANNELS;
        *d = scales16(scale, at, wide), *m = scales16(low, at, wide);
    }
}

/* total + (sum dx) d + dsum m, each operation rounded on its own */
static inline __attribute__((always_inline)) __m512 int4_total(__m512 total, __m512i sum, float dx, float dsum,
                                                                __m512 d, __m512 m) {
    return _mm512_add_ps(_mm512_add_ps(total, scaled(sum, dx, d)), _mm512_mul_ps(_mm512_set1_ps(dsum), m));
}

/* Outputs [group * 16, +16) for rows [r0, r0 + count): quant_tiles8.h's int4_tile */
static inline __attribute__((always_inline)) void
int4_tile(const Rows *x, const uint8_t *packed, const void *scale, const void *low, const int wide, float *y,
          int64_t y_stride, int64_t group, int64_t r0, const void *widened, const int count) {
    (void)widened;  /* WIDENS is 0: one register widens a pair for all 16 outputs */
    const int64_t blocks = x->blocks, stride = blocks * QBLOCK;
    __m512 total[TILE];
    __m512i sums[TILE];
    __m512 d256 = _mm512_setzero_ps(), m256 = d256;  /* below FEW_ROWS: Q4_K's d and -dmin of the block of 256 */
    for (int r = 0; r < count; r++) total[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t at = (group * blocks + b) * CHANNELS;
#if BYTE_PLANES
        if (x->planes)
            int4_sums_bytes(packed + at * PAIRS, x->planes + (r0 * blocks + b) * 2 * QBLOCK, 2 * stride, sums, count);
        else
#endif
            int4_sums512(packed + at * PAIRS, x->steps + r0 * stride + b * QBLOCK, stride, sums, count);
        __m512 d, m;
        if (wide == OWN_SCALES && count < FEW_ROWS) {  /* int4_scales's, the block of 256's converted once */
            if (b % K_BLOCKS == 0) block256_scales(scale, group, blocks, b, &d256, &m256);
            own_scales(d256, m256, low, group, blocks, b, &d, &m);
        } else {
            int4_scales(scale, low, wide, group, blocks, b, &d, &m);
        }
        for (int r = 0; r < count; r++) {
            const int64_t xb = (r0 + r) * blocks + b;
            total[r] = int4_total(total[r], sums[r], x->dx[xb], x->dsum[xb], d, m);
        }
    }
    store_tile(total, y, y_stride, group, r0, count);
}

/* int4_tile of groups `group` and `group + 1` at once (quant_matmul.c's TWO_GROUPS_FROM): the
 * tile's 128 `vpdpwssd` a block share their 8 broadcasts of x's pairs (int4_tile: 8 for 64), and
 * each output's operations are int4_tile's, so its bits. Weights the caches hold (a prompt's
 * chunk): at 64 rows of a 2048 x 2048 Q4_K weight on one core, 171 billion products a second
 * against 162; with fewer rows, each weight streamed from memory, it was the slower. */
static inline __attribute__((always_inline)) void
int4_tile_two(const Rows *x, const uint8_t *packed, const void *scale, const void *low, const int wide, float *y,
              int64_t y_stride, int64_t group, int64_t r0, const int count) {
    const int64_t blocks = x->blocks, stride = blocks * QBLOCK;
    __m512 total[TILE][2];
    __m512i sums[TILE][2];
    for (int r = 0; r < count; r++) total[r][0] = total[r][1] = _mm512_setzero_ps();
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t at = (group * blocks + b) * CHANNELS;
        int4_sums512_two(packed + at * PAIRS, packed + (at + blocks * CHANNELS) * PAIRS,
                         x->steps + r0 * stride + b * QBLOCK, stride, sums, count);
        __m512 d[2], m[2];
        for (int g = 0; g < 2; g++) int4_scales(scale, low, wide, group + g, blocks, b, &d[g], &m[g]);
        for (int r = 0; r < count; r++) {
            const int64_t xb = (r0 + r) * blocks + b;
            for (int g = 0; g < 2; g++) total[r][g] = int4_total(total[r][g], sums[r][g], x->dx[xb], x->dsum[xb], d[g], m[g]);
        }
    }
    for (int g = 0; g < 2; g++)
        for (int r = 0; r < count; r++) _mm512_storeu_ps(y + (r0 + r) * y_stride + (group + g) * CHANNELS, total[r][g]);
}

/* quant_tiles8.h's int8_block: block b's first n inputs */
static inline __attribute__((always_inline)) void
int8_block(const Rows *x, const int8_t *packed, const uint16_t *scale, int64_t group, int64_t r0, int64_t b,
           const int n, __m512 total[], const int count) {
    const int64_t blocks = x->blocks, stride = blocks * QBLOCK;
    __m512i sums[WIDE_TILE];
    int8_sums512(packed + (group * x->width + b * QBLOCK) * CHANNELS, x->steps + r0 * stride + b * QBLOCK, stride, n,
                 sums, count);
    __m512 d = scales16(scale, (group * blocks + b) * CHANNELS, 0);
    for (int r = 0; r < count; r++) total[r] = _mm512_add_ps(total[r], scaled(sums[r], x->dx[(r0 + r) * blocks + b], d));
}

/* quant_tiles8.h's int8_tile: the whole blocks with a constant count of inputs, then a partial one */
static inline __attribute__((always_inline)) void
int8_tile(const Rows *x, const int8_t *packed, const uint16_t *scale, float *y, int64_t y_stride, int64_t group,
          int64_t r0, const void *widened, const int count) {
    (void)widened;
    const int64_t whole = x->width / QBLOCK;
    __m512 total[WIDE_TILE];
    for (int r = 0; r < count; r++) total[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < whole; b++) int8_block(x, packed, scale, group, r0, b, QBLOCK, total, count);
    if (whole < x->blocks) int8_block(x, packed, scale, group, r0, whole, (int)(x->width % QBLOCK), total, count);
    store_tile(total, y, y_stride, group, r0, count);
}

/* quant_tiles8.h's int8s_tile */
static inline __attribute__((always_inline)) void
int8s_tile(const Rows *x, const int8_t *packed, const void *scale, const void *low, const int own, float *y,
           int64_t y_stride, int64_t group, int64_t r0, const void *widened, const int count) {
    (void)widened;
    const int64_t blocks = x->blocks, stride = blocks * QBLOCK, subs = 2 * blocks;
    __m512 total[TILE];
    __m512i sums[TILE];
    for (int r = 0; r < count; r++) total[r] = _mm512_setzero_ps();
    for (int64_t s = 0; s < subs; s++) {
        int8_sums512(packed + (group * x->width + s * SUB) * CHANNELS, x->steps + r0 * stride + s * SUB, stride, SUB,
                     sums, count);
        const int64_t at = (group * subs + s) * CHANNELS;
        __m512 d, m = _mm512_setzero_ps();
        if (own) {  /* Q6_K's: d sc, exact in fp32; no low */
            const uint16_t *dd = (const uint16_t *)scale + (group * (subs / K_SUBS) + s / K_SUBS) * CHANNELS;
            d = _mm512_mul_ps(scales16(dd, 0, 0),
                              _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)((const int8_t *)low + at)))));
        } else {
            d = _mm512_loadu_ps((const float *)scale + at);
            if (low) m = _mm512_loadu_ps((const float *)low + at);
        }
        for (int r = 0; r < count; r++) {
            total[r] = _mm512_add_ps(total[r], scaled(sums[r], x->dx[(r0 + r) * blocks + s / 2], d));
            if (low && !own) total[r] = _mm512_add_ps(total[r], _mm512_mul_ps(_mm512_set1_ps(x->dsum16[(r0 + r) * subs + s]), m));
        }
    }
    store_tile(total, y, y_stride, group, r0, count);
}
#endif
