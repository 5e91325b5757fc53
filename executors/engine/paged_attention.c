/* Paged attention (paged_attention.py): each sequence's queries attend causally over that
 * sequence's own keys, read through its block table from the KV pool (kv_pool.py).
 *
 * A step packs every sequence's new tokens into one row of queries: a decode step's one token,
 * a prefill chunk's tokens, after whatever keys the sequence already holds (its own, or a cached
 * prefix's blocks). Query i of a sequence of `q_len` new tokens and `ctx` keys sits at position
 * p = ctx - q_len + i and attends keys [lo, p], lo = 0 (or p - window + 1 with a sliding window).
 *
 * Every (sequence, kv head, 16 queries) is computed by one thread, with the same code, in key
 * order, whatever else the step holds and however many threads run: a query comes out bit for
 * bit the same alone, batched, in a whole prefill or in a chunk after cached keys. It runs in the
 * OpenMP runtime that torch already loaded (its libgomp), so it shares torch's threads.
 *
 * Built at start-up by native.py with the machine's compiler (-O3 -march=native).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef float vec __attribute__((vector_size(64), aligned(4)));  /* 16 floats, unaligned loads */
typedef int32_t ivec __attribute__((vector_size(64), aligned(4)));
typedef float vec8 __attribute__((vector_size(32)));
typedef float vec4 __attribute__((vector_size(16)));
#define LANES 16
#define MAX_GROUP 16  /* query heads per kv head */
#define QUERIES 16    /* queries per task */

static inline vec select_not(ivec drop, vec x) {
    ivec bits;
    memcpy(&bits, &x, sizeof x);
    bits &= ~drop;
    memcpy(&x, &bits, sizeof x);
    return x;
}

/* e^x for x <= 0: 2^n e^r with |r| <= ln2/2 and a degree-6 Taylor polynomial (under 2 ulp);
 * 0 below -87, where e^x is under float's smallest normal. */
static inline vec exp_le0(vec x) {
    ivec tiny = x < -87.0f;
    x = select_not(tiny, x);
    vec n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  /* round to nearest */
    vec r = x - n * 0.693359375f + n * 2.12194440e-4f;  /* x - n ln2, ln2 in two parts */
    vec p = 1.0f + r * (1.0f + r * (0.5f + r * (1.6666667e-1f + r * (4.1666668e-2f
            + r * (8.3333338e-3f + r * 1.3888889e-3f)))));
    ivec bits = (__builtin_convertvector(n, ivec) + 127) << 23;
    vec two_n;
    memcpy(&two_n, &bits, sizeof two_n);
    return select_not(tiny, p * two_n);
}

static inline float hsum(vec v) {
    vec8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7)
             + __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
    vec4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
    return (b[0] + b[2]) + (b[1] + b[3]);
}

/* Where one sequence's keys (or values) of one kv head lie: key j at
 * pool + (table[j / block] * block + j % block) * token. */
typedef struct {
    const float *pool;     /* the layer's pool, offset to this kv head */
    const int32_t *table;  /* the sequence's block table */
    int64_t block, token;  /* tokens per block; floats per token slot (kv_heads x dim) */
} pages;

/* One query over keys [lo, lo + span) of one kv head, for the `group` query heads that share
 * it (q_head floats apart; their outputs adjacent); chunks = head dim / 16. */
static inline __attribute__((always_inline)) void
kv_head(const float *q, int64_t q_head, pages k, pages v, float *out, int64_t lo, int64_t span,
        const int64_t chunks, int64_t group, float scale, float *scores) {
    vec qv[MAX_GROUP][chunks], acc[MAX_GROUP][chunks];
    float top[MAX_GROUP], total[MAX_GROUP];
    int64_t padded = (span + LANES - 1) / LANES * LANES, end = lo + span;
    for (int64_t g = 0; g < group; g++) {
        memcpy(qv[g], q + g * q_head, sizeof qv[g]);
        memset(acc[g], 0, sizeof acc[g]);
        top[g] = -3.4e38f;
        total[g] = 0.0f;
        memset(scores + g * padded + span, 0, (padded - span) * sizeof(float));
    }
    for (int64_t j = lo; j < end;) {  /* scores = q . k, and their maximum, block by block */
        int64_t b = j / k.block, stop = (b + 1) * k.block < end ? (b + 1) * k.block : end;
        const float *base = k.pool + (int64_t)k.table[b] * k.block * k.token;
        for (; j < stop; j++) {
            const float *key = base + (j - b * k.block) * k.token;
            for (int64_t g = 0; g < group; g++) {
                vec sum = {0}, part;
                for (int64_t c = 0; c < chunks; c++) {
                    memcpy(&part, key + c * LANES, sizeof part);
                    sum += qv[g][c] * part;
                }
                float s = hsum(sum) * scale;
                scores[g * padded + j - lo] = s;
                top[g] = s > top[g] ? s : top[g];
            }
        }
    }
    for (int64_t g = 0; g < group; g++) {  /* softmax weights, summed in key order */
        float *row = scores + g * padded;
        for (int64_t j = 0; j < padded; j += LANES) {
            vec s;
            memcpy(&s, row + j, sizeof s);
            s = exp_le0(s - top[g]);
            memcpy(row + j, &s, sizeof s);
        }
        for (int64_t j = 0; j < span; j++) total[g] += row[j];
    }
    for (int64_t j = lo; j < end;) {  /* weighted values, in key order */
        int64_t b = j / v.block, stop = (b + 1) * v.block < end ? (b + 1) * v.block : end;
        const float *base = v.pool + (int64_t)v.table[b] * v.block * v.token;
        for (; j < stop; j++) {
            vec part[chunks];
            memcpy(part, base + (j - b * v.block) * v.token, sizeof part);
            for (int64_t g = 0; g < group; g++)
                for (int64_t c = 0; c < chunks; c++) acc[g][c] += scores[g * padded + j - lo] * part[c];
        }
    }
    for (int64_t g = 0; g < group; g++)
        for (int64_t c = 0; c < chunks; c++) {
            vec o = acc[g][c] / total[g];
            memcpy(out + (g * chunks + c) * LANES, &o, sizeof o);
        }
}

/* Queries [first, last) of one sequence (ctx keys, q_len new tokens) for one kv head. */
static void task(const float *q, int64_t q_tok, int64_t q_head, pages k, pages v, float *out, int64_t out_tok,
                 int64_t first, int64_t last, int64_t q_len, int64_t ctx, int64_t window, int64_t group,
                 int64_t dim, float scale, float *scores) {
    for (int64_t i = first; i < last; i++) {
        int64_t p = ctx - q_len + i, lo = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
        const float *qi = q + i * q_tok;
        float *oi = out + i * out_tok;
        switch (dim / LANES) {  /* a constant chunk count per case, for the compiler */
            case 4: kv_head(qi, q_head, k, v, oi, lo, p - lo + 1, 4, group, scale, scores); break;
            case 8: kv_head(qi, q_head, k, v, oi, lo, p - lo + 1, 8, group, scale, scores); break;
            default: kv_head(qi, q_head, k, v, oi, lo, p - lo + 1, dim / LANES, group, scale, scores);
        }
    }
}

/* q: the step's queries, token t's head h at q + t * q_tok + h * q_head (dim contiguous);
 * out [tokens, heads, dim] contiguous. k_pool, v_pool: [blocks, block, kv_heads, dim] contiguous.
 * Sequence s owns queries [q_starts[s], q_starts[s] + q_lens[s]) and ctx_lens[s] keys (its new
 * tokens' included, already written), through tables[s * table_width ...]. window: a sliding
 * window in keys (0: none). threads: torch's count. Returns 0, -1 for a shape it does not take,
 * -2 when out of memory. */
int paged_attention(const float *q, int64_t q_tok, int64_t q_head, const float *k_pool, const float *v_pool,
                    float *out, const int64_t *q_starts, const int64_t *q_lens, const int64_t *ctx_lens,
                    const int32_t *tables, int64_t table_width, int64_t sequences, int64_t heads,
                    int64_t kv_heads, int64_t dim, int64_t block, int64_t window, float scale, int threads) {
    if (kv_heads < 1 || heads % kv_heads || heads / kv_heads > MAX_GROUP || dim % LANES || dim > 16 * LANES
        || block < 1 || sequences < 1)
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
    int64_t group = heads / kv_heads, padded = (widest + LANES - 1) / LANES * LANES, tasks = first_task[sequences];
    int64_t token = kv_heads * dim;
    int failed = 0;
    #pragma omp parallel num_threads(threads) if (threads > 1 && work * heads * dim > (1 << 16))
    {
        float *scores = malloc(group * padded * sizeof(float));
        if (!scores) failed = -2;
        int64_t s = 0;
        #pragma omp for schedule(static)
        for (int64_t t = 0; t < tasks; t++) {
            while (first_task[s + 1] <= t) s++;  /* tasks come in order within a thread */
            while (first_task[s] > t) s--;
            int64_t u = t - first_task[s], h = u % kv_heads, b = u / kv_heads;
            int64_t first = b * QUERIES, last = (b + 1) * QUERIES < q_lens[s] ? (b + 1) * QUERIES : q_lens[s];
            if (!scores) continue;
            pages k = {k_pool + h * dim, tables + s * table_width, block, token};
            pages v = {v_pool + h * dim, tables + s * table_width, block, token};
            task(q + q_starts[s] * q_tok + h * group * q_head, q_tok, q_head, k, v,
                 out + (q_starts[s] * heads + h * group) * dim, heads * dim, first, last, q_lens[s], ctx_lens[s],
                 window, group, dim, scale, scores);
        }
        free(scores);
    }
    free(first_task);
    return failed;
}
