/* paged_attention.c over a pool of fp16 keys and values (EngineConfig.kv_cache_dtype "fp16"):
 * the same functions, each key and value widened to fp32 exactly as it is loaded (arith.h's
 * `half8`: F16C where the CPU has it, integer steps where not, the same values). */
#include <stdint.h>

#include "kernels.h"

int paged_attention_f16_ready(void) { return 1; }

#define KV_HALF
#include "paged_attention.c"
