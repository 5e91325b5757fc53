/* y = x W^T for quantized weights (int4.py's layers), on activations rounded to int16 per block
 * of 32 (arith.h's `quantize_block`): the one arithmetic, the same bits on every CPU.
 *
 * - int4: Q4_1 blocks of 32 inputs, w = d q + m with q in 0..15 and d, m in fp16 as a GGUF holds
 *   them (Q4_0's d (q - 8) is the same form), packed [outputs / 16][blocks][16 input pairs][16
 *   outputs] bytes, low nibble the pair's first input. Per block, x . w = d dx (q . qx) + m dx
 *   sum(qx), where q . qx is an integer sum (at most 15 * 32767 * 32 < 2^24, so exact in fp32 too).
 * - int4f: the same with d and m in fp32 (Q4_K's per-32 d sc and dmin m).
 * - int4k: the same d and m, computed per block from Q4_K's own scales (u8 sc and m per 32, fp16 d
 *   and -dmin per 256): the products are exact in fp32, so the values are int4f's.
 * - int8k: int8s without lows, its d computed per sub-block from Q6_K's own scales (int8 sc per 16,
 *   fp16 d per 256): exact in fp32 too, so int8s's values.
 * - int8 (the output layer): llama.cpp's Q8_0, packed [outputs / 16][width][16] with an fp16 scale
 *   d per block of 32 inputs ([outputs / 16][blocks][16]); per block x . w = d dx (w . qx). Q5_0's
 *   d (q - 16) is the same form.
 * - int8s: int8 steps packed as int8's, with an fp32 scale d and low m (or none) per sub-block of 16
 *   inputs ([outputs / 16][width / 16][16]): Q5_1, Q5_K and Q6_K, whose steps fit int8 and whose
 *   scales are per 16 (Q6_K) or per 32 inputs.
 *
 * Each output sums its blocks in input order, in fp32, each operation rounded on its own:
 * total = (total + (q . qx) dx d) + (dx sum(qx)) m (int8: total + (w . qx) dx d). The integer
 * sums run in AVX-512's `vpdpwssd` or `vpmaddwd` (32 products an instruction, quant_tiles512.h)
 * where the CPU has AVX512BW, in AVX2's `pmaddwd` (16, quant_tiles256.h) where it has AVX2, else
 * in plain C (both with quant_tiles8.h's tiles); each gives the same integers, and every path
 * applies the scales with the same fp32 operations per output, so every path gives the same bits.
 * `int4_matmul_ready` and `int8_matmul_ready` say which: 3 (AVX-512), 2 (AVX2), 1 (plain C).
 *
 * Against float64 on the same inputs, x's rounding errs by at most 2^-16 of its block's largest
 * magnitude (bf16 rounding: 2^-9 of each value; int8: 2^-8 of the largest). Each output is
 * computed by one thread, with the same instructions for a row whatever the other rows are, so
 * a row comes out bit for bit as it does alone. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "arith.h"
#include "kernels.h"

#define CHANNELS 16  /* outputs per group */
#define PAIRS (QBLOCK / 2)
#define K_BLOCKS 8  /* blocks of 32 in a K-quant's block of 256 (int4k's d and -dmin) */
#define OWN_SCALES 2  /* int4_tile's `wide` for int4k: Q4_K's own scales */
#define K_SUBS 16  /* sub-blocks of 16 in a K-quant's block of 256 (int8k's d) */

/* x [rows, width] as int16 steps [rows][blocks * 32], each block's scale dx and dx sum(steps), and
 * where int8s weights with lows need it (else NULL), dx sum(steps) per half block (SUB inputs). */
typedef struct {
    int16_t *steps;
    float *dx, *dsum, *dsum16;
    uint8_t *planes;  /* the steps as byte planes (quant_tiles512.h's BYTE_PLANES), or NULL */
    int64_t blocks, width;
} Rows;

#define SUB 16  /* inputs per sub-block of int8s weights */

static int rows_alloc(Rows *q, int64_t rows, int64_t width, int halves) {
    q->width = width;
    q->blocks = (width + QBLOCK - 1) / QBLOCK;
    q->steps = malloc(rows * q->blocks * QBLOCK * sizeof(int16_t));
    q->dx = malloc(rows * q->blocks * sizeof(float));
    q->dsum = malloc(rows * q->blocks * sizeof(float));
    q->dsum16 = halves ? malloc(rows * q->blocks * 2 * sizeof(float)) : NULL;
    q->planes = NULL;
    return q->steps && q->dx && q->dsum && (q->dsum16 || !halves) ? 0 : -2;
}

static void rows_free(Rows *q) {
    free(q->steps);
    free(q->dx);
    free(q->dsum);
    free(q->dsum16);
    free(q->planes);
}

static void quantize_row(const float *x, const Rows *q, int64_t r) {
    for (int64_t b = 0; b < q->blocks; b++) {
        int64_t at = r * q->blocks + b, n = q->width - b * QBLOCK < QBLOCK ? q->width - b * QBLOCK : QBLOCK;
        int32_t sum;
        float dx = quantize_block(x + r * q->width + b * QBLOCK, (int)n, q->steps + at * QBLOCK, &sum);
        q->dx[at] = dx;
        q->dsum[at] = dx * (float)sum;
        for (int h = 0; h < 2 && q->dsum16; h++) {
            int32_t half = 0;
            for (int i = 0; i < SUB; i++) half += q->steps[at * QBLOCK + h * SUB + i];
            q->dsum16[2 * at + h] = dx * (float)half;
        }
    }
}

/* Each weight is read from memory once a step, and the CPU's own prefetcher leaves the products
 * waiting for it: eight rows of Q8_0 products on one Zen 4 core ran at 63 billion a second from
 * memory, 90 from cache. Asking for the bytes AHEAD past a block while its products run brought
 * them to 90 from memory too; the products are the same. One row (a stream's decode) reads
 * faster from further ahead: on this project's 2-core Zen 5 machine, 16,384 bytes ahead instead of
 * 4,096 took a Q8_0 output layer at one row 1.31x (`kernel-ab`), and one 8192 x 16384 Q4_K weight
 * from 99.9 to 111.3 billion products a second where the machine read fast (a scratch driver);
 * 16 and 64 rows the same as before. */
#ifndef AHEAD
#define AHEAD 16384
#endif
static inline __attribute__((always_inline)) void fetch_ahead(const void *w, int64_t bytes) {
    for (int64_t at = 0; at < bytes; at += 64) __builtin_prefetch((const char *)w + AHEAD + at);
}

#if defined(__AVX512BW__)
#include "quant_tiles512.h"
#else
#include "quant_tiles8.h"
#endif
#ifndef BYTE_PLANES
#define BYTE_PLANES 0
#endif

int int4_matmul_ready(void) { return PATH; }

int int8_matmul_ready(void) { return PATH; }

#if TILE == 8
#define TILE_OVER_3(CALL) case 8: CALL(8); break; case 7: CALL(7); break; case 6: CALL(6); break; \
    case 5: CALL(5); break; case 4: CALL(4); break;
#elif TILE == 4
#define TILE_OVER_3(CALL) case 4: CALL(4); break;
#else
#define TILE_OVER_3(CALL)
#endif
#define EACH_TILE(CALL) \
    switch (n) {  /* a constant count per case, for the compiler */ \
        TILE_OVER_3(CALL)                                         \
        case 3: CALL(3); break;                                   \
        case 2: CALL(2); break;                                   \
        default: CALL(1);                                         \
    }
#if WIDE_TILE > TILE
#define EACH_WIDE_TILE(CALL) if (n == WIDE_TILE) { CALL(WIDE_TILE); } else { EACH_TILE(CALL) }
#else
#define EACH_WIDE_TILE(CALL) EACH_TILE(CALL)
#endif

/* int8 weights this large (an output layer's) stream from memory every step: where the CPU has
 * the registers, 16 rows share each pass over them (WIDE_TILE). Gemma 3 270M's output layer at
 * 16 rows took 14.2 ms instead of 15.2 on this project's 2-core AVX-512 machine; the 8-row tiles
 * stay with weights the caches hold (its gate and up at 512 rows: 0.93x with 16). */
#define STREAMED (8 << 20)

/* rows from which a group's weights are widened once for all its tiles (WIDENS), not per tile.
 * The widened group is read from the caches, not unpacked in registers: below about eight tiles,
 * that costs more than the unpacking it saves (a 1.17B model's layer on a Zen 2 machine: 0.84x as
 * fast at 6 rows, 0.99x at 16, 1.01x at 24, 1.07x at 64, 1.08x at 512). */
#define WIDEN_FROM (8 * TILE)

/* rows from which int4 weights take two groups a tile where the path has int4_tile_two (TWO_GROUPS):
 * each group's weights then serve four tiles or more from the caches */
#define TWO_GROUPS_FROM (4 * TILE)

/* the rows of a weight's next tile, `left` rows from the end: `most` (WIDE_TILE or TILE)
 * while that many are left, then TILE where `most` is wider, then what is left */
static inline int64_t tile_rows(int64_t left, int64_t most) {
    return left >= most ? most : left >= TILE ? TILE : left;
}

#if TWO_GROUPS
/* groups `group` and `group + 1` of an int4 weight, every row, a tile at a time */
static inline void int4_two_groups(const Rows *q, const Weight *w, float *y, int64_t y_stride, int64_t group,
                                   int64_t rows) {
    for (int64_t r0 = 0, n = tile_rows(rows, TILE); r0 < rows; r0 += n, n = tile_rows(rows - r0, TILE)) {
#define INT4_TWO(N) int4_tile_two(q, w->packed, w->scale, w->low, 0, y, y_stride, group, r0, N)
#define INT4F_TWO(N) int4_tile_two(q, w->packed, w->scale, w->low, 1, y, y_stride, group, r0, N)
#define INT4K_TWO(N) int4_tile_two(q, w->packed, w->scale, w->low, OWN_SCALES, y, y_stride, group, r0, N)
        switch (w->kind) {
            case WEIGHT_INT4: EACH_TILE(INT4_TWO) break;
            case WEIGHT_INT4_F32: EACH_TILE(INT4F_TWO) break;
            default: EACH_TILE(INT4K_TWO) break;
        }
#undef INT4_TWO
#undef INT4F_TWO
#undef INT4K_TWO
    }
}
#endif

/* x [rows, width], contiguous fp32, and y [rows, outputs], its rows y_stride apart: x's rows
 * quantized, then each group of outputs by one thread. Returns 0, or -2 when out of memory. */
static int product(const float *x, const Weight *w, float *y, int64_t y_stride, int64_t rows, int threads) {
    const int64_t width = w->width, outputs = w->outputs;
    const int int8 = w->kind == WEIGHT_INT8 || w->kind == WEIGHT_INT8_SUB || w->kind == WEIGHT_INT8_SUB_K;
    const int64_t parallel_from = int8 ? 1 << 16 : 1 << 18;
    const uint8_t *packed = w->packed;
    const int8_t *packed8 = w->packed;
    Rows q;
    const int int4 = w->kind == WEIGHT_INT4 || w->kind == WEIGHT_INT4_F32 || w->kind == WEIGHT_INT4_K;
    int short_of_memory = rows_alloc(&q, rows, width, w->kind == WEIGHT_INT8_SUB && w->low);
#if BYTE_PLANES
    if (int4 && rows < TWO_GROUPS_FROM && !short_of_memory) short_of_memory = !(q.planes = malloc(rows * width * 2));
#endif
    if (short_of_memory) {
        rows_free(&q);
        return -2;
    }
    const int64_t most = w->kind == WEIGHT_INT8 && width * outputs >= STREAMED ? WIDE_TILE : TILE;  /* a tile's rows */
    int parallel = threads > 1 && rows * width * outputs > parallel_from;  /* below, starting threads costs more */
    const int widen = WIDENS && rows >= WIDEN_FROM && (w->kind != WEIGHT_INT8 || width % QBLOCK == 0);
    const int two = TWO_GROUPS && rows >= TWO_GROUPS_FROM && int4;
    const int64_t groups = outputs / CHANNELS, units = two ? (groups + 1) / 2 : groups;  /* a thread's unit of work */
    #pragma omp parallel num_threads(threads) if (parallel)
    {
        /* a thread's widened group: 32 bytes an input (without it, where memory is short, the
         * tiles unpack as they go: the same bits) */
        void *widened = widen ? aligned_alloc(64, (width * 32 + 63) / 64 * 64) : NULL;
        #pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            quantize_row(x, &q, r);
#if BYTE_PLANES
            if (q.planes) byte_planes(q.steps + r * q.blocks * QBLOCK, q.planes + r * q.blocks * 2 * QBLOCK, q.blocks);
#endif
        }
        /* guided: each thread first takes a long run of groups (its prefetches stay its own, and
         * threads seldom meet at the shared counter), then shorter ones, so they end together.
         * Against (dynamic, 4), Gemma 3 270M's engine made 1.2x the tokens with one stream. */
        #pragma omp for schedule(guided)
        for (int64_t unit = 0; unit < units; unit++) {
            const int64_t group = two ? 2 * unit : unit;
#if TWO_GROUPS
            if (two && group + 1 < groups) {
                int4_two_groups(&q, w, y, y_stride, group, rows);
                continue;
            }
#endif
#if WIDENS
            if (widened) widen_group(w, group, widened);
#endif
            for (int64_t r0 = 0, n = tile_rows(rows, most); r0 < rows; r0 += n, n = tile_rows(rows - r0, most)) {
#define INT4_TILE(N) int4_tile(&q, packed, w->scale, w->low, 0, y, y_stride, group, r0, widened, N)
#define INT4F_TILE(N) int4_tile(&q, packed, w->scale, w->low, 1, y, y_stride, group, r0, widened, N)
#define INT4K_TILE(N) int4_tile(&q, packed, w->scale, w->low, OWN_SCALES, y, y_stride, group, r0, widened, N)
#define INT8_TILE(N) int8_tile(&q, packed8, w->scale, y, y_stride, group, r0, widened, N)
#define INT8S_TILE(N) int8s_tile(&q, packed8, w->scale, w->low, 0, y, y_stride, group, r0, widened, N)
#define INT8SK_TILE(N) int8s_tile(&q, packed8, w->scale, w->low, 1, y, y_stride, group, r0, widened, N)
                switch (w->kind) {
                    case WEIGHT_INT4: EACH_TILE(INT4_TILE) break;
                    case WEIGHT_INT4_F32: EACH_TILE(INT4F_TILE) break;
                    case WEIGHT_INT4_K: EACH_TILE(INT4K_TILE) break;
                    case WEIGHT_INT8: EACH_WIDE_TILE(INT8_TILE) break;
                    case WEIGHT_INT8_SUB: EACH_TILE(INT8S_TILE) break;
                    case WEIGHT_INT8_SUB_K: EACH_TILE(INT8SK_TILE) break;
                }
#undef INT4_TILE
#undef INT4F_TILE
#undef INT4K_TILE
#undef INT8_TILE
#undef INT8S_TILE
#undef INT8SK_TILE
            }
        }
        free(widened);
    }
    rows_free(&q);
    return 0;
}

/* y = x W^T for one projection's weights of any kind (llama_layer.c's products, and the four below) */
int weight_matmul(const float *x, const Weight *w, float *y, int64_t y_stride, int64_t rows, int threads) {
    const int whole_blocks = w->kind != WEIGHT_INT8;  /* Q8_0's last block may be partial */
    if (rows < 1 || w->width < 1 || (whole_blocks && w->width % QBLOCK) || w->outputs % CHANNELS
        || y_stride < w->outputs || w->kind < WEIGHT_INT4 || w->kind > WEIGHT_INT8_SUB_K
        || ((w->kind == WEIGHT_INT4_K || w->kind == WEIGHT_INT8_SUB_K) && w->width % (K_BLOCKS * QBLOCK)))
        return -1;
    return product(x, w, y, y_stride, rows, threads);
}

int int4_matmul(const float *x, const uint8_t *packed, const uint16_t *scale, const uint16_t *low, float *y,
                int64_t rows, int64_t width, int64_t outputs, int threads) {
    const Weight w = {packed, scale, low, width, outputs, WEIGHT_INT4};
    return weight_matmul(x, &w, y, outputs, rows, threads);
}

int int4f_matmul(const float *x, const uint8_t *packed, const float *scale, const float *low, float *y,
                 int64_t rows, int64_t width, int64_t outputs, int threads) {
    const Weight w = {packed, scale, low, width, outputs, WEIGHT_INT4_F32};
    return weight_matmul(x, &w, y, outputs, rows, threads);
}

int int4k_matmul(const float *x, const uint8_t *packed, const uint16_t *super, const uint8_t *sub, float *y,
                 int64_t rows, int64_t width, int64_t outputs, int threads) {
    const Weight w = {packed, super, sub, width, outputs, WEIGHT_INT4_K};
    return weight_matmul(x, &w, y, outputs, rows, threads);
}

int int8_matmul(const float *x, const int8_t *packed, const uint16_t *scale, float *y, int64_t rows, int64_t width,
                int64_t outputs, int threads) {
    const Weight w = {packed, scale, NULL, width, outputs, WEIGHT_INT8};
    return weight_matmul(x, &w, y, outputs, rows, threads);
}

int int8s_matmul(const float *x, const int8_t *packed, const float *scale, const float *low, float *y, int64_t rows,
                 int64_t width, int64_t outputs, int threads) {
    const Weight w = {packed, scale, low, width, outputs, WEIGHT_INT8_SUB};
    return weight_matmul(x, &w, y, outputs, rows, threads);
}

int int8k_matmul(const float *x, const int8_t *packed, const uint16_t *super, const int8_t *sub, float *y,
                 int64_t rows, int64_t width, int64_t outputs, int threads) {
    const Weight w = {packed, super, sub, width, outputs, WEIGHT_INT8_SUB_K};
    return weight_matmul(x, &w, y, outputs, rows, threads);
}
