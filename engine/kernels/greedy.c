/* The plain greedy rows of a step (sampling.py's greedy_choices): each row's likeliest token,
 * the first of equal maxima as torch.argmax picks it, and its log probability -log(sum(e^(x -
 * max))). PyTorch's argmax and logsumexp over the default model's 49,152 logits took 2.4 ms for
 * 16 rows on this project's 2-core machine (their decode step's layers: 32 ms); this, 0.3 ms.
 *
 * Each row is computed by one thread with the same instructions whatever the other rows, so a
 * row's token and log probability do not depend on the batch. Needs AVX2 and FMA; elsewhere
 * `greedy_ready` says 0 and sampling.py keeps PyTorch's ops.
 */
#include <math.h>
#include <stdint.h>

#include "kernels.h"

#if defined(__AVX2__) && defined(__FMA__)
#include "vector_exp.h"

#define ACCUMULATORS 4  /* vectors summed side by side, then added in a fixed order */

int greedy_ready(void) { return 1; }

/* One row: its token and log probability; -1 where it holds a NaN or its largest logit is
 * infinite (the caller then keeps PyTorch's ops, which give those their own answers). */
static int64_t row(const float *x, int64_t vocab, float *logprob) {
    int64_t whole = vocab / 8 * 8;
    __m256 top = _mm256_set1_ps(-INFINITY), nan = _mm256_setzero_ps();
    for (int64_t i = 0; i < whole; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        top = _mm256_max_ps(top, v);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    float lanes[8], most = -INFINITY;
    _mm256_storeu_ps(lanes, top);
    for (int i = 0; i < 8; i++) most = lanes[i] > most ? lanes[i] : most;
    if (_mm256_movemask_ps(nan)) return -1;
    for (int64_t i = whole; i < vocab; i++) {
        if (x[i] != x[i]) return -1;
        most = x[i] > most ? x[i] : most;
    }
    if (isinf(most)) return -1;  /* every logit forbidden, or an infinite one */
    int64_t token = 0;
    while (x[token] != most) token++;
    __m256 sum[ACCUMULATORS], shift = _mm256_set1_ps(most);
    for (int a = 0; a < ACCUMULATORS; a++) sum[a] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 * ACCUMULATORS <= vocab; i += 8 * ACCUMULATORS)
        for (int a = 0; a < ACCUMULATORS; a++)
            sum[a] = _mm256_add_ps(sum[a], exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i + 8 * a), shift)));
    float rest[8 * ACCUMULATORS];
    for (int64_t j = 0; j < 8 * ACCUMULATORS; j++) rest[j] = i + j < vocab ? x[i + j] : -INFINITY;
    for (int a = 0; a < ACCUMULATORS; a++)  /* the tail, padded with logits of weight 0 */
        sum[a] = _mm256_add_ps(sum[a], exp8(_mm256_sub_ps(_mm256_loadu_ps(rest + 8 * a), shift)));
    __m256 total = _mm256_add_ps(_mm256_add_ps(sum[0], sum[1]), _mm256_add_ps(sum[2], sum[3]));
    _mm256_storeu_ps(lanes, total);
    float s = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
    *logprob = -logf(s);
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

#else
int greedy_ready(void) { return 0; }

int greedy_rows(const float *logits, int64_t rows, int64_t vocab, int64_t *tokens, float *logprobs, int threads) {
    (void)logits, (void)rows, (void)vocab, (void)tokens, (void)logprobs, (void)threads;
    return -1;
}
#endif
