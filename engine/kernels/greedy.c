/* The plain greedy rows of a step (sampling.py's greedy_choices), and log-softmax rows for the
 * log probabilities clients ask for (logprobs.py), in arith.h's arithmetic: the same bits on
 * every CPU, where PyTorch's reductions sum in an order that depends on the vector width it was
 * built for.
 *
 * A row's log-softmax is (x - max) - ln(sum(e^(x - max))): the sum in 8 lanes and 4 vectors side
 * by side, then one fixed tree; ln by arith.h's `log_positive`. Its greedy token is the first of
 * equal maxima, as torch.argmax picks it, whose log probability is then -ln(sum), the same
 * number log_softmax_rows gives it. PyTorch's argmax and logsumexp over the default model's
 * 49,152 logits took 2.4 ms for 16 rows on this project's 2-core machine (their decode step's
 * layers: 32 ms); this, 0.3 ms.
 *
 * Each row is computed by one thread with the same operations whatever the other rows, so a
 * row's token and log probabilities do not depend on the batch.
 */
#include <math.h>
#include <stdint.h>

#include "arith.h"
#include "kernels.h"

#define ACCUMULATORS 4  /* vectors summed side by side, then added in a fixed order */

int greedy_ready(void) { return 1; }

/* A row's largest logit, and in *first where it first occurs (torch.argmax's pick among equal
 * maxima: each lane keeps its first, then the smallest of the lanes that hold the largest);
 * NaN where the row holds a NaN. Found in the same pass: with a scan for the place afterwards,
 * sixteen rows of Gemma 3 270M's 262,144 logits took 3.29 ms on a 2-core Zen 2 machine, 2.79
 * without (one row: 0.43 and 0.30 ms; benchmarks/kernels/kernel_ab.py), the same tokens and log
 * probabilities. */
static float row_max(const float *x, int64_t vocab, int64_t *first) {
    int64_t whole = vocab / 8 * 8;
    f8 top = splat8(-INFINITY);
    i8 nan = {0}, at = {0}, here = {0, 1, 2, 3, 4, 5, 6, 7};
    for (int64_t i = 0; i < whole; i += 8, here += 8) {
        f8 v = load8(x + i);
        i8 above = v > top;
        top = select8(above, v, top);
        at = (here & above) | (at & ~above);
        nan |= v != v;
    }
    float most = lane_max(top);
    for (int i = 0; i < 8; i++)
        if (nan[i]) return NAN;
    int64_t place = -1;
    for (int i = 0; i < 8; i++)  /* the first of the places of the lanes that hold the largest */
        if (whole && top[i] == most && (place < 0 || at[i] < place)) place = at[i];
    for (int64_t i = whole; i < vocab; i++) {
        if (x[i] != x[i]) return NAN;
        if (place < 0 || x[i] > most) most = x[i], place = i;
    }
    *first = place;
    return most;
}

/* ln(sum(e^(x - most))) over a row */
static float log_sum(const float *x, int64_t vocab, float most) {
    f8 sum[ACCUMULATORS];
    for (int a = 0; a < ACCUMULATORS; a++) sum[a] = splat8(0.0f);
    int64_t i = 0;
    for (; i + 8 * ACCUMULATORS <= vocab; i += 8 * ACCUMULATORS)
        for (int a = 0; a < ACCUMULATORS; a++) sum[a] += exp8(load8(x + i + 8 * a) - most);
    float rest[8 * ACCUMULATORS];
    for (int64_t j = 0; j < 8 * ACCUMULATORS; j++) rest[j] = i + j < vocab ? x[i + j] : -INFINITY;
    for (int a = 0; a < ACCUMULATORS; a++)  /* the tail, padded with logits of weight 0 */
        sum[a] += exp8(load8(rest + 8 * a) - most);
    return log_positive(lane_sum((sum[0] + sum[1]) + (sum[2] + sum[3])));
}

/* One row: its token and log probability; -1 where it holds a NaN or its largest logit is
 * infinite (the caller then keeps PyTorch's ops, which give those their own answers). */
static int64_t row(const float *x, int64_t vocab, float *logprob) {
    int64_t token;
    float most = row_max(x, vocab, &token);
    if (isnan(most) || isinf(most)) return -1;  /* every logit forbidden, or an infinite one */
    *logprob = -log_sum(x, vocab, most);
    return token;
}

/* logits [rows, vocab] contiguous fp32. Returns 0, or -1 when a row is one `row` leaves to
 * PyTorch or the shape is empty (nothing then counts). */
int greedy_rows(const float *logits, int64_t rows, int64_t vocab, int64_t *tokens, float *logprobs, int threads) {
    if (rows < 1 || vocab < 1) return -1;
    int failed = 0;
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && rows >= 4) \
        reduction(|| : failed)
    for (int64_t r = 0; r < rows; r++) {
        tokens[r] = row(logits + r * vocab, vocab, logprobs + r);
        failed = failed || tokens[r] < 0;
    }
    return failed ? -1 : 0;
}

/* out[r] = log_softmax(logits[r]); -inf logits stay -inf. Returns -1 (nothing counts) where a
 * row holds a NaN or an infinite largest logit. */
int log_softmax_rows(const float *logits, int64_t rows, int64_t vocab, float *out, int threads) {
    if (rows < 1 || vocab < 1) return -1;
    int failed = 0;
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && rows >= 4) \
        reduction(|| : failed)
    for (int64_t r = 0; r < rows; r++) {
        const float *x = logits + r * vocab;
        int64_t first;
        float most = row_max(x, vocab, &first);
        if (isnan(most) || isinf(most)) {
            failed = 1;
            continue;
        }
        float total = log_sum(x, vocab, most);
        for (int64_t i = 0; i < vocab; i++) out[r * vocab + i] = (x[i] - most) - total;
    }
    return failed ? -1 : 0;
}
