/* paged_attention.c over a pool of fp16 keys and values (EngineConfig.kv_cache_dtype "fp16"):
 * the same functions, each key and value widened to fp32 by F16C as it is loaded. Where the CPU
 * has no F16C, it takes no call (-1), and PyTorch's attention runs. */
#include <stdint.h>

#include "kernels.h"

#if defined(__F16C__)
int paged_attention_f16_ready(void) { return 1; }

#define KV_HALF
#include "paged_attention.c"
#else
int paged_attention_f16_ready(void) { return 0; }

int paged_attention_f16(const float *q, int64_t q_tok, int64_t q_head, const uint16_t *k_pool,
                        const uint16_t *v_pool, float *out, const int64_t *q_starts, const int64_t *q_lens,
                        const int64_t *ctx_lens, const int32_t *tables, int64_t table_width, int64_t sequences,
                        int64_t heads, int64_t kv_heads, int64_t dim, int64_t block, int64_t window, float scale,
                        int threads) {
    return -1;
}
#endif
