/* Paged attention (paged_attention.py): each sequence's queries attend causally over that
 * sequence's own keys, read through its block table from the KV pool (kv_pool.py). A block's keys
 * are stored transposed, [kv_heads, dim, block], so LANES keys' scores are one vector's lanes;
 * its values as rows, [block, kv_heads, dim].
 *
 * A step packs every sequence's new tokens into one row of queries: a decode step's one token,
 * a prefill chunk's tokens, after whatever keys the sequence already holds (its own, or a cached
 * prefix's blocks). Query i of a sequence of `q_len` new tokens and `ctx` keys sits at position
 * p = ctx - q_len + i and attends keys [lo, p], lo = 0 (or p - window + 1 with a sliding window).
 *
 * Every (sequence, kv head, 16 queries) is computed by one thread, whatever else the step holds
 * and however many threads run: a query comes out bit for bit the same alone, batched, in a whole
 * prefill or in a chunk after cached keys. Each score is one chain of products and sums over the
 * head dim, each weight sum and weighted value one chain over the keys in order, whichever
 * function computes it (one query, or several at once through a block's keys), in arith.h's
 * arithmetic: 8 lanes (the scores and weighted values 16 where the CPU has AVX-512: the same
 * chains, side by side), each operation rounded on its own (no fused multiply-adds), one
 * exponential, so every CPU computes the same bits.
 * It runs in the OpenMP runtime that torch already loaded (its libgomp), so it shares torch's
 * threads.
 *
 * The pool holds fp32 here, or fp16 where paged_attention_f16.c includes this file with KV_HALF
 * (EngineConfig.kv_cache_dtype): each key and value is widened to fp32 exactly as it is loaded,
 * and everything after is the fp32 computation above, so fp16 keys give the numbers that fp32
 * keys of those same values give.
 *
 * Built at start-up by build.py with the machine's compiler.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "arith.h"
#include "kernels.h"

#define LANES 8  /* arith.h's vectors: the same sums on every CPU, whatever its vector width */
typedef f8 vec;
typedef i8 ivec;
#define QUERIES 16    /* queries per task */

#ifndef KV_HALF
typedef float kv_t;
#define ATTEND paged_attention

static inline vec load_kv(const float *p) { return load8(p); }
#else
typedef uint16_t kv_t;  /* IEEE fp16 bits */
#define ATTEND paged_attention_f16

static inline vec load_kv(const uint16_t *p) { return half8(p); }  /* widened to fp32, exactly */
#endif

/* A function's vectors, (type, load), for C vectors of LANES keys or dims; its count of them and
 * their lanes follow from the type's size (COUNT, WIDTH). Where the CPU has AVX-512 and C is even,
 * two vectors' lanes side by side in one register (`wide_vec`): a block's 16 keys, or 16 dims of a
 * value. Each lane's chain of products and sums is the one it has in two `vec`s, so the same
 * numbers, in half the instructions: on this project's Zen 5 machine a 1,286-token prompt's
 * attention 1.39x as fast, a decode step's 1.24x to 1.39x. Elsewhere `vec`s: GCC takes a 16-lane
 * vector without AVX-512 through memory, 0.1x as fast on AVX2. */
#if defined(__AVX512F__)
typedef float wide_vec __attribute__((vector_size(2 * sizeof(vec))));

static inline wide_vec load_kv_wide(const kv_t *p) {
#if !defined(KV_HALF)
    wide_vec v;
    memcpy(&v, p, sizeof v);
    return v;
#else
    return (wide_vec)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));  /* exact, as half8 */
#endif
}
#define EVEN_VECTORS wide_vec, load_kv_wide
#else
#define EVEN_VECTORS vec, load_kv
#endif
#define VECTORS_1 vec, load_kv
#define VECTORS_2 EVEN_VECTORS
#define VECTORS_4 EVEN_VECTORS
#define VECTORS_8 EVEN_VECTORS
#define VECTORS_16 EVEN_VECTORS
#define WIDTH(T) ((int)(sizeof(T) / sizeof(float)))  /* lanes of a vector of type T */
#define COUNT(C, T) ((C) * LANES / WIDTH(T))         /* vectors of type T in C of LANES */
#define EXPAND(MACRO, ...) MACRO(__VA_ARGS__)

/* Where one sequence's values of one kv head lie: value j at
 * pool + (table[j / block] * block + j % block) * token. */
typedef struct {
    const kv_t *pool;      /* the layer's pool, offset to this kv head */
    const int32_t *table;  /* the sequence's block table */
    int64_t block, token;  /* tokens per block; values per token slot (kv_heads x dim) */
} pages;

/* Each score is q . k summed over the head dim in order, a product and a sum per element,
 * in a lane of its own; each output element sums its keys' weighted values in key order. So a
 * query's numbers depend on its own keys only: not on the other queries of its task, nor on
 * where its keys' blocks lie, nor on how many queries the step holds. */

/* Q queries' scores against one block's keys (stored transposed: row d at kt + d * block), for
 * the G query heads of each that share the kv head (q_head floats apart; queries q_tok apart),
 * into scores rows `stride` apart (query i's head g in row i * G + g), C vectors of LANES keys
 * each. The Q x G x C sums run side by side, independent chains of products and sums in
 * registers (fixed sizes: a macro makes one function per shape). Every variant computes each
 * score with the same chain, so how many queries share a call changes no number. */
#define BLOCK_SCORES(Q, G, C) EXPAND(BLOCK_SCORES_OF, Q, G, C, VECTORS_##C)
#define BLOCK_SCORES_OF(Q, G, C, T, LOAD)                                                                   \
    static void block_scores_##Q##_##G##_##C(const float *q, int64_t q_tok, int64_t q_head, const kv_t *kt,  \
                                              int64_t block, int64_t dim, float scale, float *scores,        \
                                              int64_t stride) {                                              \
        enum { N = COUNT(C, T), W = WIDTH(T) };  /* its vectors, and their lanes */                       \
        T acc[Q][G][N];                                                                                     \
        memset(acc, 0, sizeof acc);                                                                         \
        for (int64_t d = 0; d < dim; d++) {                                                                 \
            T kd[N];                                                                                        \
            for (int c = 0; c < N; c++) kd[c] = LOAD(kt + d * block + c * W);                               \
            for (int i = 0; i < Q; i++)                                                                     \
                for (int g = 0; g < G; g++) {                                                               \
                    float qd = q[i * q_tok + g * q_head + d];                                               \
                    for (int c = 0; c < N; c++) acc[i][g][c] += qd * kd[c];                                 \
                }                                                                                           \
        }                                                                                                   \
        for (int i = 0; i < Q; i++)                                                                         \
            for (int g = 0; g < G; g++)                                                                     \
                for (int c = 0; c < N; c++) {                                                               \
                    T out = acc[i][g][c] * scale;                                                           \
                    memcpy(scores + (i * G + g) * stride + c * W, &out, sizeof out);                        \
                }                                                                                           \
    }

/* The shapes with functions of their own: (queries, heads per kv head, vectors of keys per
 * block), one query at a time and the most queries at once that keep the sums in registers.
 * Groups of 5 to 8 heads (Qwen 2.5 1.5B's 6, 7B's 7, 3B's 8) have theirs too: another group
 * went one head and one vector of keys at a time, each key loaded once per head, and its
 * attention took a fifth of a 1,600-token prompt's prefill at 1.5B. The same sums either way. */
#define ONE_QUERY(X) X(1, 1, 1) X(1, 1, 2) X(1, 2, 1) X(1, 2, 2) X(1, 3, 1) X(1, 3, 2) X(1, 4, 1) X(1, 4, 2) \
    X(1, 5, 1) X(1, 5, 2) X(1, 6, 1) X(1, 6, 2) X(1, 7, 1) X(1, 7, 2) X(1, 8, 1) X(1, 8, 2)
#define WIDE(X) X(6, 1, 1) X(3, 1, 2) X(6, 2, 1) X(3, 2, 2) X(4, 3, 1) X(2, 3, 2) X(3, 4, 1) X(2, 4, 2) \
    X(2, 5, 1) X(2, 5, 2) X(2, 6, 1) X(2, 6, 2) X(2, 7, 1) X(2, 8, 1)
ONE_QUERY(BLOCK_SCORES)
WIDE(BLOCK_SCORES)

/* How many queries the wide variant of a shape takes at once (0: none). */
static int wide_queries(int64_t group, int64_t chunks) {
    switch (group * 8 + (chunks < 3 ? chunks : 3) * 2) {  /* 3: no shape above */
#define QUERIES_OF(Q, G, C) case G * 8 + C * 2: return Q;
        WIDE(QUERIES_OF)
#undef QUERIES_OF
    }
    return 0;
}

/* `count` queries (1, or the shape's wide_queries) against one block: rows as BLOCK_SCORES. */
static void scores_of(const float *q, int64_t q_tok, int64_t q_head, const kv_t *kt, int64_t block, int64_t group,
                      int64_t dim, float scale, float *scores, int64_t stride, int count) {
    int64_t chunks = block / LANES;
    switch (group * 8 + (chunks < 3 ? chunks : 3) * 2 + (count > 1)) {  /* the shapes above (3: none) */
#define CALL(Q, G, C) case G * 8 + C * 2 + (Q > 1): \
    block_scores_##Q##_##G##_##C(q, q_tok, q_head, kt, block, dim, scale, scores, stride); return;
        ONE_QUERY(CALL)
        WIDE(CALL)
#undef CALL
    }
    for (int i = 0; i < count; i++)  /* any other: one head and one vector of keys at a time, the same sums */
        for (int64_t g = 0; g < group; g++)
            for (int64_t c = 0; c < chunks; c++)
                block_scores_1_1_1(q + i * q_tok + g * q_head, q_tok, q_head, kt + c * LANES, block, dim, scale,
                                   scores + (i * group + g) * stride + c * LANES, stride);
}

/* Softmax over one row of scores[lo..hi] (in place, weights after), the scores first capped
 * to cap * tanh(score / cap) where cap > 0; returns the weights' sum. */
static inline float softmax_row(float *scores, int64_t lo, int64_t hi, float cap) {
    int64_t from = lo / LANES * LANES, to = hi / LANES * LANES + LANES;  /* whole vectors */
    for (int64_t j = from; cap > 0.0f && j < to; j += LANES) {
        vec s;
        memcpy(&s, scores + j, sizeof s);
        s = cap * tanh8(s / cap);
        memcpy(scores + j, &s, sizeof s);
    }
    for (int64_t j = from; j < lo; j++) scores[j] = -3.4e38f;  /* lanes outside [lo, hi]: weight 0 */
    for (int64_t j = hi + 1; j < to; j++) scores[j] = -3.4e38f;
    vec most = {0}, sum = {0};
    most -= 3.4e38f;
    for (int64_t j = from; j < to; j += LANES) {
        vec s;
        memcpy(&s, scores + j, sizeof s);
        most = max8(s, most);
    }
    float top = lane_max(most);
    for (int64_t j = from; j < to; j += LANES) {  /* each lane sums its keys in order, then the lanes in order */
        vec s;
        memcpy(&s, scores + j, sizeof s);
        s = exp8(s - top);
        sum += s;
        memcpy(scores + j, &s, sizeof s);
    }
    return lane_sum(sum);
}

/* Heads [0, G) of one query, the dims [c0, c0 + CH LANES) of each (v.pool and out start at c0):
 * each output element is its weights (scores, softmaxed) times its keys' values, summed over the
 * keys in order, then divided by its head's total. The heads share each value's load. G and CH
 * are literal sizes (a macro makes one function per shape), so the sums stay in registers; the
 * chain of each element is the same in every shape, so how heads and dims are sliced changes no
 * number. */
#define WEIGH_SLICE(G, CH) EXPAND(WEIGH_SLICE_OF, G, CH, VECTORS_##CH)
#define WEIGH_SLICE_OF(G, CH, T, LOAD)                                                                       \
    static void weigh_##G##_##CH(const float *scores, int64_t stride, int64_t lo, int64_t hi,                \
                                 const float *total, pages v, int64_t dim, float *out) {                     \
        enum { N = COUNT(CH, T), W = WIDTH(T) };  /* its vectors, and their lanes */                      \
        T acc[G][N];                                                                                        \
        _Pragma("GCC unroll 16") for (int g = 0; g < G; g++)                                                \
            _Pragma("GCC unroll 16") for (int c = 0; c < N; c++) acc[g][c] = (T){0};                       \
        for (int64_t j = lo; j <= hi;) {  /* block by block: one table read per block */                   \
            int64_t b = j / v.block, stop = (b + 1) * v.block <= hi ? (b + 1) * v.block : hi + 1;           \
            const kv_t *base = v.pool + ((int64_t)v.table[b] * v.block - b * v.block) * v.token;            \
            for (; j < stop; j++) {                                                                         \
                float w[G];                                                                                 \
                _Pragma("GCC unroll 16") for (int g = 0; g < G; g++) w[g] = scores[g * stride + j];        \
                _Pragma("GCC unroll 16") for (int c = 0; c < N; c++) {                                     \
                    T x = LOAD(base + j * v.token + c * W);                                                 \
                    _Pragma("GCC unroll 16") for (int g = 0; g < G; g++) acc[g][c] += w[g] * x;            \
                }                                                                                           \
            }                                                                                               \
        }                                                                                                   \
        _Pragma("GCC unroll 16") for (int g = 0; g < G; g++)                                                \
            _Pragma("GCC unroll 16") for (int c = 0; c < N; c++) {                                         \
                T o = acc[g][c] / total[g];                                                                 \
                memcpy(out + g * dim + c * W, &o, sizeof o);                                                \
            }                                                                                               \
    }
/* (heads, vectors): up to 32 sums in flight, AVX-512's registers (AVX2's 16 spill a few, and
 * measured no slower than slices of 16 sums). With AVX-512's wide vectors a slice holds twice the
 * dims in as many registers: up to 24 sums, a head of 128 dims goes in one pass for groups of up to
 * 3 heads and in two for groups of 5 and 6, where each pass reads every value again. */
#if defined(__AVX512F__)
#define WIDER_SLICES(X) X(2, 16) X(3, 16) X(5, 8) X(6, 8)
#define SLICE_WIDTH(heads) ((heads) <= 3 ? 16 : (heads) <= 6 ? 8 : 4)
#else
#define WIDER_SLICES(X)
#define SLICE_WIDTH(heads) ((heads) == 1 ? 16 : (heads) <= 4 ? 8 : 4)
#endif
#define SLICES(X) X(1, 1) X(1, 2) X(1, 4) X(1, 8) X(1, 16) X(2, 1) X(2, 2) X(2, 4) X(2, 8) \
    X(3, 1) X(3, 2) X(3, 4) X(3, 8) X(4, 1) X(4, 2) X(4, 4) X(4, 8) X(5, 1) X(5, 2) X(5, 4) X(6, 1) X(6, 2) \
    X(6, 4) X(7, 1) X(7, 2) X(7, 4) X(8, 1) X(8, 2) X(8, 4) WIDER_SLICES(X)
SLICES(WEIGH_SLICE)

/* One query's `group` heads: softmax of each head's scores row (rows `stride` apart) over [lo, hi],
 * then each head's output (dim floats, the heads' outputs adjacent): up to 8 heads at a time
 * (a group of 6 read each value twice as 4 and 2 heads: its prompts' attention 0.89x as fast),
 * each through its dims in the widest slices that fit the registers. */
static void weigh(float *scores, int64_t stride, int64_t lo, int64_t hi, float cap, pages v, int64_t group,
                  int64_t dim, float *out) {
    float total[group];
    for (int64_t g = 0; g < group; g++) total[g] = softmax_row(scores + g * stride, lo, hi, cap);
    for (int64_t g0 = 0; g0 < group; g0 += 8) {
        int64_t heads = group - g0 < 8 ? group - g0 : 8, vectors = dim / LANES;
        for (int64_t c0 = 0; c0 < vectors;) {
            int64_t width = SLICE_WIDTH(heads);  /* the most vectors of these heads' slices */
            while (width > vectors - c0) width /= 2;
            pages slice = {v.pool + c0 * LANES, v.table, v.block, v.token};
            const float *rows = scores + g0 * stride;
            float *at = out + g0 * dim + c0 * LANES;
            switch (heads * 32 + width) {
#define CALL(G, CH) case G * 32 + CH: weigh_##G##_##CH(rows, stride, lo, hi, total + g0, slice, dim, at); break;
                SLICES(CALL)
#undef CALL
            }
            c0 += width;
        }
    }
}

/* Queries [first, last) of one sequence (ctx keys, q_len new tokens) for one kv head and the
 * `group` query heads that share it (q_head floats apart; their outputs adjacent). scores:
 * (last - first) x group rows of `stride` floats. keys: the layer's key pool, offset to this kv
 * head. Queries go through a block's keys `wide` at a time where they can: a query's row then
 * also holds scores of keys after its own position, which it never reads. */
static void task(const float *q, int64_t q_tok, int64_t q_head, const kv_t *keys, pages v, float *out,
                 int64_t out_tok, int64_t first, int64_t last, int64_t q_len, int64_t ctx, int64_t window,
                 int64_t group, int64_t dim, float scale, float cap, float *scores, int64_t stride) {
    int64_t base = ctx - q_len;  /* query i sits at position base + i */
    int64_t lo_first = window > 0 && base + first - window + 1 > 0 ? base + first - window + 1 : 0;
    int64_t block = v.block, key_block = (v.token / dim) * dim * block;  /* values per block of keys */
    int wide = wide_queries(group, block / LANES);
    for (int64_t b = lo_first / block * block; b <= base + last - 1; b += block) {
        const kv_t *kt = keys + (int64_t)v.table[b / block] * key_block;  /* this head's keys of the block */
        int64_t i = first;
        for (; wide && i + wide <= last; i += wide) {
            int64_t p = base + i + wide - 1, lo = window > 0 && base + i - window + 1 > 0 ? base + i - window + 1 : 0;
            if (b > p || b + block <= lo) continue;  /* a block none of these queries sees */
            scores_of(q + i * q_tok, q_tok, q_head, kt, block, group, dim, scale,
                      scores + (i - first) * group * stride + b, stride, wide);
        }
        for (; i < last; i++) {
            int64_t p = base + i, lo = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
            if (b > p || b + block <= lo) continue;  /* a block this query does not see */
            scores_of(q + i * q_tok, q_tok, q_head, kt, block, group, dim, scale,
                      scores + (i - first) * group * stride + b, stride, 1);
        }
    }
    for (int64_t i = first; i < last; i++) {
        int64_t p = base + i, lo = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
        weigh(scores + (i - first) * group * stride, stride, lo, p, cap, v, group, dim, out + i * out_tok);
    }
}

/* q: the step's queries, token t's head h at q + t * q_tok + h * q_head (dim contiguous);
 * out [tokens, heads, dim] contiguous. k_pool [blocks, kv_heads, dim, block] and v_pool [blocks,
 * block, kv_heads, dim], contiguous; block a multiple of LANES.
 * Sequence s owns queries [q_starts[s], q_starts[s] + q_lens[s]) and ctx_lens[s] keys (its new
 * tokens' included, already written), through tables[s * table_width ...]. window: a sliding
 * window in keys (0: none). softcap: Gemma 2's cap on the scores (0: none). threads: torch's
 * count. Returns 0, -1 for a shape it does not take, -2 when out of memory. */
int ATTEND(const float *q, int64_t q_tok, int64_t q_head, const kv_t *k_pool, const kv_t *v_pool, float *out,
           const int64_t *q_starts, const int64_t *q_lens, const int64_t *ctx_lens, const int32_t *tables,
           int64_t table_width, int64_t sequences, int64_t heads, int64_t kv_heads, int64_t dim, int64_t block,
           int64_t window, float scale, float softcap, int threads) {
    if (kv_heads < 1 || heads % kv_heads || dim % LANES || dim > 256
        || block < 1 || block % LANES || sequences < 1)
        return -1;
    int64_t widest = 0, work = 0;
    int64_t *first_task = malloc((sequences + 1) * sizeof(int64_t));
    if (!first_task) return -2;
    first_task[0] = 0;
    for (int64_t s = 0; s < sequences; s++) {
        if (q_lens[s] < 1 || ctx_lens[s] < q_lens[s] || ctx_lens[s] > table_width * block) {
            free(first_task);
            return -1;
        }
        widest = ctx_lens[s] > widest ? ctx_lens[s] : widest;
        work += q_lens[s] * ctx_lens[s];
        first_task[s + 1] = first_task[s] + (q_lens[s] + QUERIES - 1) / QUERIES * kv_heads;
    }
    int64_t group = heads / kv_heads, stride = (widest + block - 1) / block * block + LANES;
    int64_t tasks = first_task[sequences], token = kv_heads * dim;
    int failed = 0;
    #pragma omp parallel num_threads(threads) if (threads > 1 && work * heads * dim > (1 << 16))
    {
        float *scores = malloc(QUERIES * group * stride * sizeof(float));
        if (!scores) failed = -2;
        int64_t s = 0;
        #pragma omp for schedule(dynamic, 1)  /* tasks differ in cost (causal); each is one thread's */
        for (int64_t t = 0; t < tasks; t++) {
            while (first_task[s + 1] <= t) s++;  /* tasks come in order within a thread */
            while (first_task[s] > t) s--;
            int64_t u = t - first_task[s], h = u % kv_heads, b = u / kv_heads;
            int64_t first = b * QUERIES, last = (b + 1) * QUERIES < q_lens[s] ? (b + 1) * QUERIES : q_lens[s];
            if (!scores) continue;
            pages v = {v_pool + h * dim, tables + s * table_width, block, token};
            task(q + q_starts[s] * q_tok + h * group * q_head, q_tok, q_head, k_pool + h * dim * block, v,
                 out + (q_starts[s] * heads + h * group) * dim, heads * dim, first, last, q_lens[s], ctx_lens[s],
                 window, group, dim, scale, softcap, scores, stride);
        }
        free(scores);
    }
    free(first_task);
    return failed;
}
