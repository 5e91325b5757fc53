/* A GGUF's quantized blocks written straight into quant_matmul.c's layouts, one pass over the file's
 * bytes, at load (gguf_native.py): Q4_K and Q6_K (a K-quant file's), and the blocks of 32 that a
 * file's other tensors hold (Q4_0, Q4_1, Q5_0, Q8_0: Gemma 3 270M's Q4_K_M is mostly Q5_0 and
 * Q8_0, its widths not multiples of 256).
 *
 * Python's way (gguf_types.split, then Int4Linear and Int8Linear) unpacks every step to a byte in
 * numpy, then permutes and packs them again in PyTorch: several passes over a byte a weight. A
 * 1.17B Q4_K_M model's load took 3.4 s that way, 1.0 s this way, and an 8B's 24 s, 4.3 s (alone,
 * 2 threads). Here each row is read once and written once, the rows split across the threads.
 * The values are the same integers and the same fp32 products (an fp16 d as fp32 times a 6-bit
 * or 8-bit integer, exact either way): tests/unit/test_gguf_repack.py compares every buffer with
 * Python's way, bit for bit, on every kernel path. */
#include <string.h>

#include "arith.h"
#include "kernels.h"

#define ROWS_PER_GROUP 16
#define Q4_K_BYTES 144
#define Q6_K_BYTES 210
#define SUPER 256
#define Q4_0_BYTES 18
#define Q4_1_BYTES 20
#define Q5_0_BYTES 22
#define Q8_0_BYTES 34
#define BLOCK 32  /* weights in a block of the legacy types */

static inline uint16_t read_u16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* ggml's get_scale_min_k4: sub-block j's 6-bit scale and min of a Q4_K block's 12 bytes */
static inline void scale_min(const uint8_t *q, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* the buffers a row is written into, and how: one function a type */
typedef struct {
    void *steps, *scale, *low;
} Out;
typedef void (*Row)(const uint8_t *src, int64_t g, int o, int64_t width, const Out *out);

/* every row of the tensor (blocks of `block` weights, `block_bytes` each) through `row`, rows in
 * static chunks across the threads (each writes its own bytes of each group) */
static int each_row(const uint8_t *blocks, const int64_t *order, int64_t rows, int64_t width, int64_t block,
                    int64_t block_bytes, Row row, const Out *out, int threads) {
    if (rows % ROWS_PER_GROUP || width % block) return -1;
    const int64_t row_bytes = width / block * block_bytes;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < rows; r++)
        row(blocks + (order ? order[r] : r) * row_bytes, r / ROWS_PER_GROUP, (int)(r % ROWS_PER_GROUP), width, out);
    return 0;
}

/* Q4_K's steps: packed [groups][width / 32][16 pairs][16 rows] */
static void q4_k_steps(const uint8_t *src, int64_t g, int o, int64_t width, const Out *out) {
    const int64_t subs = width / 32;
    for (int64_t b = 0; b < subs; b++) {
        const uint8_t *qs = src + (b / 8) * Q4_K_BYTES + 16 + ((b % 8) / 2) * 32;
        const int shift = 4 * (int)(b & 1);
        uint8_t *packed = (uint8_t *)out->steps + ((g * subs + b) * 16) * ROWS_PER_GROUP + o;
        for (int p = 0; p < 16; p++) {
            const uint8_t even = (qs[2 * p] >> shift) & 0xF, odd = (qs[2 * p + 1] >> shift) & 0xF;
            packed[p * ROWS_PER_GROUP] = (uint8_t)(even | (odd << 4));
        }
    }
}

/* Q4_K: its steps (q4_k_steps), scale and low fp32 [groups][width / 32][16 rows] */
static void q4_k_row(const uint8_t *src, int64_t g, int o, int64_t width, const Out *out) {
    const int64_t subs = width / 32;
    for (int64_t b = 0; b < subs; b++) {
        const uint8_t *block = src + (b / 8) * Q4_K_BYTES;
        int sc, m;
        scale_min(block + 4, (int)(b % 8), &sc, &m);
        const int64_t at = (g * subs + b) * ROWS_PER_GROUP + o;
        ((float *)out->scale)[at] = half_to_float(read_u16(block)) * (float)sc;
        ((float *)out->low)[at] = -(half_to_float(read_u16(block + 2)) * (float)m);
    }
    q4_k_steps(src, g, o, width, out);
}

/* Q4_K, its scales as the file holds them (int4k_matmul's layout): packed as q4_k_row's; `scale`
 * fp16 [groups][width / 256][d, -dmin][16 rows], `low` u8 [groups][width / 32][sc, m][16 rows] */
static void q4_k_own_row(const uint8_t *src, int64_t g, int o, int64_t width, const Out *out) {
    const int64_t subs = width / 32, supers = width / SUPER;
    uint16_t *super = out->scale;
    uint8_t *sub = out->low;
    for (int64_t s = 0; s < supers; s++) {
        const uint8_t *block = src + s * Q4_K_BYTES;
        super[((g * supers + s) * 2) * ROWS_PER_GROUP + o] = read_u16(block);
        super[((g * supers + s) * 2 + 1) * ROWS_PER_GROUP + o] = read_u16(block + 2) ^ 0x8000;  /* -dmin: the sign bit */
    }
    for (int64_t b = 0; b < subs; b++) {
        int sc, m;
        scale_min(src + (b / 8) * Q4_K_BYTES + 4, (int)(b % 8), &sc, &m);
        sub[((g * subs + b) * 2) * ROWS_PER_GROUP + o] = (uint8_t)sc;
        sub[((g * subs + b) * 2 + 1) * ROWS_PER_GROUP + o] = (uint8_t)m;
    }
    const Out steps = {out->steps, NULL, NULL};
    q4_k_steps(src, g, o, width, &steps);
}

/* Q6_K: steps [groups][width][16 rows], scale [groups][width / 16][16 rows]; ggml's
 * dequantize_row_q6_K: two halves of 128 weights, each 64 bytes of low nibbles and 32 of high bit
 * pairs, weight 32 * quarter + l of a half */
static void q6_k_steps(const uint8_t *src, int64_t g, int o, int64_t width, int8_t *steps) {
    for (int64_t s = 0; s < width / SUPER; s++) {
        const uint8_t *block = src + s * Q6_K_BYTES, *ql = block, *qh = block + 128;
        for (int half = 0; half < 2; half++)
            for (int quarter = 0; quarter < 4; quarter++)
                for (int l = 0; l < 32; l++) {
                    const uint8_t lo = ql[half * 64 + (quarter & 1) * 32 + l] >> (4 * (quarter >> 1)) & 0xF;
                    const uint8_t hi = (qh[half * 32 + l] >> (2 * quarter)) & 3;
                    const int64_t input = s * SUPER + half * 128 + quarter * 32 + l;
                    steps[(g * width + input) * ROWS_PER_GROUP + o] = (int8_t)((lo | (hi << 4)) - 32);
                }
    }
}

/* Q6_K: its steps (q6_k_steps), scale fp32 [groups][width / 16][16 rows] */
static void q6_k_row(const uint8_t *src, int64_t g, int o, int64_t width, const Out *out) {
    for (int64_t s = 0; s < width / SUPER; s++) {
        const uint8_t *block = src + s * Q6_K_BYTES;
        const int8_t *sc = (const int8_t *)(block + 192);
        const float d = half_to_float(read_u16(block + 208));
        for (int k = 0; k < 16; k++)
            ((float *)out->scale)[(g * (width / 16) + s * 16 + k) * ROWS_PER_GROUP + o] = d * (float)sc[k];
    }
    q6_k_steps(src, g, o, width, out->steps);
}

/* Q6_K, its scales as the file holds them (int8k_matmul's layout): steps as q6_k_row's; `scale`
 * fp16 [groups][width / 256][16 rows] (d), `low` int8 [groups][width / 16][16 rows] (sc) */
static void q6_k_own_row(const uint8_t *src, int64_t g, int o, int64_t width, const Out *out) {
    const int64_t supers = width / SUPER;
    for (int64_t s = 0; s < supers; s++) {
        const uint8_t *block = src + s * Q6_K_BYTES;
        ((uint16_t *)out->scale)[(g * supers + s) * ROWS_PER_GROUP + o] = read_u16(block + 208);
        for (int k = 0; k < 16; k++)
            ((int8_t *)out->low)[(g * (width / 16) + s * 16 + k) * ROWS_PER_GROUP + o] = (int8_t)block[192 + k];
    }
    q6_k_steps(src, g, o, width, out->steps);
}

/* Q4_0 and Q4_1: int4_matmul's packed steps as Q4_K's, fp16 scale and low [groups][width / 32][16
 * rows]. ggml's blocks: fp16 d (and m, Q4_1), then 16 bytes whose low nibbles are weights 0-15 and
 * high ones 16-31; Q4_0's d (q - 8) is d q + (-8 d), the low rounded to fp16 as numpy rounds it. */
static inline void legacy_int4(const uint8_t *src, int64_t g, int o, int64_t width, const Out *out, int bytes) {
    const int64_t blocks = width / BLOCK;
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *block = src + b * bytes, *qs = block + bytes - 16;
        const int64_t at = (g * blocks + b) * ROWS_PER_GROUP + o;
        const uint16_t d = read_u16(block);
        ((uint16_t *)out->scale)[at] = d;
        ((uint16_t *)out->low)[at] = bytes == Q4_1_BYTES ? read_u16(block + 2) : float_to_half(half_to_float(d) * -8.0f);
        uint8_t *packed = (uint8_t *)out->steps + (at - o) * 16 + o;
        for (int p = 0; p < 16; p++) {  /* the pair of inputs 2p, 2p + 1 */
            const int shift = p < 8 ? 0 : 4, j = 2 * p % 16;
            const uint8_t even = (qs[j] >> shift) & 0xF, odd = (qs[j + 1] >> shift) & 0xF;
            packed[p * ROWS_PER_GROUP] = (uint8_t)(even | (odd << 4));
        }
    }
}

static void q4_0_row(const uint8_t *src, int64_t g, int o, int64_t width, const Out *out) {
    legacy_int4(src, g, o, width, out, Q4_0_BYTES);
}

static void q4_1_row(const uint8_t *src, int64_t g, int o, int64_t width, const Out *out) {
    legacy_int4(src, g, o, width, out, Q4_1_BYTES);
}

/* Q8_0: int8_matmul's steps [groups][width][16 rows] (the block's 32 bytes after its fp16 d) and
 * fp16 scale [groups][width / 32][16 rows] */
static void q8_0_row(const uint8_t *src, int64_t g, int o, int64_t width, const Out *out) {
    const int64_t blocks = width / BLOCK;
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *block = src + b * Q8_0_BYTES;
        ((uint16_t *)out->scale)[(g * blocks + b) * ROWS_PER_GROUP + o] = read_u16(block);
        int8_t *steps = (int8_t *)out->steps + (g * width + b * BLOCK) * ROWS_PER_GROUP + o;
        for (int i = 0; i < BLOCK; i++) steps[i * ROWS_PER_GROUP] = (int8_t)block[2 + i];
    }
}

/* Q5_0 as Q8_0's layout, steps q - 16: fp16 d, a 32-bit word whose bit i is weight i's fifth bit,
 * then 16 bytes of nibbles as Q4_0's */
static void q5_0_row(const uint8_t *src, int64_t g, int o, int64_t width, const Out *out) {
    const int64_t blocks = width / BLOCK;
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *block = src + b * Q5_0_BYTES, *qs = block + 6;
        uint32_t fifth;
        memcpy(&fifth, block + 2, sizeof fifth);
        ((uint16_t *)out->scale)[(g * blocks + b) * ROWS_PER_GROUP + o] = read_u16(block);
        int8_t *steps = (int8_t *)out->steps + (g * width + b * BLOCK) * ROWS_PER_GROUP + o;
        for (int i = 0; i < BLOCK; i++) {
            const int nibble = i < 16 ? qs[i] & 0xF : qs[i - 16] >> 4;
            steps[i * ROWS_PER_GROUP] = (int8_t)((nibble | (int)((fifth >> i) & 1) << 4) - 16);
        }
    }
}

int repack_q4_0(const uint8_t *blocks, const int64_t *order, int64_t rows, int64_t width, uint8_t *packed,
                uint16_t *scale, uint16_t *low, int threads) {
    const Out out = {packed, scale, low};
    return each_row(blocks, order, rows, width, BLOCK, Q4_0_BYTES, q4_0_row, &out, threads);
}

int repack_q4_1(const uint8_t *blocks, const int64_t *order, int64_t rows, int64_t width, uint8_t *packed,
                uint16_t *scale, uint16_t *low, int threads) {
    const Out out = {packed, scale, low};
    return each_row(blocks, order, rows, width, BLOCK, Q4_1_BYTES, q4_1_row, &out, threads);
}

int repack_q8_0(const uint8_t *blocks, const int64_t *order, int64_t rows, int64_t width, int8_t *steps,
                uint16_t *scale, int threads) {
    const Out out = {steps, scale, NULL};
    return each_row(blocks, order, rows, width, BLOCK, Q8_0_BYTES, q8_0_row, &out, threads);
}

int repack_q5_0(const uint8_t *blocks, const int64_t *order, int64_t rows, int64_t width, int8_t *steps,
                uint16_t *scale, int threads) {
    const Out out = {steps, scale, NULL};
    return each_row(blocks, order, rows, width, BLOCK, Q5_0_BYTES, q5_0_row, &out, threads);
}

int repack_q4_k(const uint8_t *blocks, const int64_t *order, int64_t rows, int64_t width, uint8_t *packed,
                float *scale, float *low, int threads) {
    const Out out = {packed, scale, low};
    return each_row(blocks, order, rows, width, SUPER, Q4_K_BYTES, q4_k_row, &out, threads);
}

int repack_q4_k_own(const uint8_t *blocks, const int64_t *order, int64_t rows, int64_t width, uint8_t *packed,
                    uint16_t *super, uint8_t *sub, int threads) {
    const Out out = {packed, super, sub};
    return each_row(blocks, order, rows, width, SUPER, Q4_K_BYTES, q4_k_own_row, &out, threads);
}

int repack_q6_k(const uint8_t *blocks, const int64_t *order, int64_t rows, int64_t width, int8_t *steps,
                float *scale, int threads) {
    const Out out = {steps, scale, NULL};
    return each_row(blocks, order, rows, width, SUPER, Q6_K_BYTES, q6_k_row, &out, threads);
}

int repack_q6_k_own(const uint8_t *blocks, const int64_t *order, int64_t rows, int64_t width, int8_t *steps,
                    uint16_t *super, int8_t *sub, int threads) {
    const Out out = {steps, super, sub};
    return each_row(blocks, order, rows, width, SUPER, Q6_K_BYTES, q6_k_own_row, &out, threads);
}
