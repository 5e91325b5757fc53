/* Row-wise attention (attention.py): each row's queries attend over that row's own keys only,
 * causally: query i of q_len attends keys [start, width - (q_len - 1 - i)). A decode step has one
 * query per row; a prefill has the prompt's, after its left padding (q_start).
 *
 * Every (row, kv head, 16 queries) is computed by one thread, with the same code, in key order,
 * whatever the batch holds and however many threads run: a row comes out bit for bit as it does
 * alone. That is what one SDPA call per row gave, at about 20 us of overhead per call; this is one
 * call per layer. It runs in the OpenMP runtime that torch already loaded (its libgomp), so it
 * shares torch's threads instead of starting its own.
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

/* One query of one row's kv head, for the `group` query heads that share it (q_head floats
 * apart; their outputs adjacent); chunks = head dim / 16. */
static inline __attribute__((always_inline)) void
kv_head(const float *q, int64_t q_head, const float *k, const float *v, float *out, int64_t span,
        const int64_t chunks, int64_t group, int64_t k_key, int64_t v_key, float scale, float *scores) {
    vec qv[MAX_GROUP][chunks], acc[MAX_GROUP][chunks];
    float top[MAX_GROUP], total[MAX_GROUP];
    int64_t padded = (span + LANES - 1) / LANES * LANES;
    for (int64_t g = 0; g < group; g++) {
        memcpy(qv[g], q + g * q_head, sizeof qv[g]);
        memset(acc[g], 0, sizeof acc[g]);
        top[g] = -3.4e38f;
        total[g] = 0.0f;
        memset(scores + g * padded + span, 0, (padded - span) * sizeof(float));
    }
    for (int64_t j = 0; j < span; j++) {  /* scores = q . k, and their maximum */
        for (int64_t g = 0; g < group; g++) {
            vec sum = {0}, part;
            for (int64_t c = 0; c < chunks; c++) {
                memcpy(&part, k + j * k_key + c * LANES, sizeof part);
                sum += qv[g][c] * part;
            }
            float s = hsum(sum) * scale;
            scores[g * padded + j] = s;
            top[g] = s > top[g] ? s : top[g];
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
    for (int64_t j = 0; j < span; j++) {  /* weighted values, in key order */
        vec part[chunks];
        memcpy(part, v + j * v_key, sizeof part);
        for (int64_t g = 0; g < group; g++)
            for (int64_t c = 0; c < chunks; c++) acc[g][c] += scores[g * padded + j] * part[c];
    }
    for (int64_t g = 0; g < group; g++)
        for (int64_t c = 0; c < chunks; c++) {
            vec o = acc[g][c] / total[g];
            memcpy(out + (g * chunks + c) * LANES, &o, sizeof o);
        }
}

static void task(const float *q, const float *k, const float *v, float *out, int64_t start, int64_t first,
                 int64_t last, int64_t heads, int64_t group, int64_t q_len, int64_t width, int64_t dim,
                 int64_t k_key, int64_t v_key, float scale, float *scores) {
    for (int64_t i = first; i < last; i++) {
        const float *qi = q + i * dim;
        float *oi = out + i * heads * dim;
        int64_t span = width - (q_len - 1 - i) - start;
        switch (dim / LANES) {  /* a constant chunk count per case, for the compiler */
            case 4: kv_head(qi, q_len * dim, k, v, oi, span, 4, group, k_key, v_key, scale, scores); break;
            case 8: kv_head(qi, q_len * dim, k, v, oi, span, 8, group, k_key, v_key, scale, scores); break;
            default: kv_head(qi, q_len * dim, k, v, oi, span, dim / LANES, group, k_key, v_key, scale, scores);
        }
    }
}

/* q [rows, heads, q_len, dim] and out [rows, q_len, heads, dim], contiguous; k, v: [rows,
 * kv_heads, width, dim] with these strides (in floats) and a contiguous dim. Row r's queries from
 * q_starts[r] on attend its keys from starts[r] on; out keeps what it holds for the others.
 * threads: torch's count. Returns 0, -1 for a shape or start it does not take, -2 when out of
 * memory. */
int row_attention(const float *q, const float *k, const float *v, float *out, const int64_t *starts,
                  const int64_t *q_starts, int64_t rows, int64_t heads, int64_t kv_heads, int64_t q_len,
                  int64_t width, int64_t dim, int64_t k_row, int64_t k_head, int64_t k_key, int64_t v_row,
                  int64_t v_head, int64_t v_key, float scale, int threads) {
    if (kv_heads < 1 || heads % kv_heads || heads / kv_heads > MAX_GROUP || dim % LANES || dim > 16 * LANES
        || q_len < 1 || q_len > width)
        return -1;
    for (int64_t r = 0; r < rows; r++)  /* each query has a key: the last query's span is width - start */
        if (starts[r] < 0 || starts[r] >= width || q_starts[r] < 0 || q_starts[r] >= q_len
            || width - (q_len - 1 - q_starts[r]) - starts[r] < 1)
            return -1;
    int64_t group = heads / kv_heads, padded = (width + LANES - 1) / LANES * LANES;
    int64_t blocks = (q_len + QUERIES - 1) / QUERIES, tasks = rows * kv_heads * blocks;
    int failed = 0;
    #pragma omp parallel num_threads(threads) if (threads > 1 && rows * kv_heads * q_len * width * dim > (1 << 16))
    {
        float *scores = malloc(group * padded * sizeof(float));
        if (!scores) failed = -2;
        #pragma omp for schedule(static)
        for (int64_t t = 0; t < tasks; t++) {
            int64_t r = t / (kv_heads * blocks), h = t / blocks % kv_heads, b = t % blocks;
            int64_t first = b * QUERIES > q_starts[r] ? b * QUERIES : q_starts[r];
            int64_t last = (b + 1) * QUERIES < q_len ? (b + 1) * QUERIES : q_len;
            if (!scores || first >= last) continue;
            task(q + (r * heads + h * group) * q_len * dim, k + r * k_row + h * k_head + starts[r] * k_key,
                 v + r * v_row + h * v_head + starts[r] * v_key, out + (r * q_len * heads + h * group) * dim,
                 starts[r], first, last, heads, group, q_len, width, dim, k_key, v_key, scale, scores);
        }
        free(scores);
    }
    return failed;
}
