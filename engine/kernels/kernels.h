/* The engine's C kernels: every function that Python calls, and the structures it passes, declared
 * once. build.py compiles the sources with this header and binds each function from it (the
 * ctypes signatures and structures are read from here), and table.py decides which kernel runs
 * for an operation, a weight type and the CPU.
 *
 * Conventions: each function returns 0 when it ran, -1 when the tensors do not fit it (the caller
 * runs PyTorch's op instead) and -2 when it ran out of memory. `*_ready` says what the CPU that
 * compiled it offers (0: not built for it). `threads` is torch's thread count: the kernels run in
 * the OpenMP runtime torch already loaded. */
#ifndef ENGINE_KERNELS_H
#define ENGINE_KERNELS_H
#include <stdint.h>

/* one projection's weights as quant_matmul.c multiplies them, the GGUF's blocks kept exactly
 * (gguf_types.py's layouts): `kind` says which product reads them; a part of 0 outputs is absent */
#define WEIGHT_INT4 0      /* int4_matmul: 4-bit steps, fp16 scale and low per 32 (Q4_0, Q4_1) */
#define WEIGHT_INT4_F32 1  /* int4f_matmul: 4-bit steps, fp32 scale and low per 32 (Q4_K) */
#define WEIGHT_INT8 2      /* int8_matmul: int8 steps, fp16 scale per 32 (Q8_0, Q5_0) */
#define WEIGHT_INT8_SUB 3  /* int8s_matmul: int8 steps, fp32 scale and low (or none) per 16 (Q5_1, Q5_K, Q6_K) */
#define WEIGHT_INT4_K 4    /* int4k_matmul: 4-bit steps, Q4_K's own scales: 6-bit sc and m per 32, fp16 d and -dmin per 256 */
#define WEIGHT_INT8_SUB_K 5  /* int8k_matmul: int8 steps, Q6_K's own scales: int8 sc per 16, fp16 d per 256 */
typedef struct {
    const void *packed, *scale, *low;
    int64_t width, outputs, kind;
} Weight;

/* the activation between gate and up */
#define ACT_SILU 0       /* Llama's */
#define ACT_GELU_TANH 1  /* Gemma's GeGLU: GELU's tanh approximation */

/* one decoder layer of Llama's shape, built once (c_stack.py), with the features of its kin and
 * of Gemma, each off where its pointer is NULL (or its number 0) */
typedef struct {
    Weight qkv[3], o, gate_up[2], down;  /* q, k, v end to end in one part or three; gate, up in one or two */
    const float *norm_in, *norm_post;  /* [hidden]: before attention, before the MLP */
    float eps_in, eps_post, scale;
    int64_t hidden, heads, kv_heads, dim, inter;
    const float *qkv_bias;  /* [q, k, v outputs]: added after the product (Qwen2) */
    const float *q_norm, *k_norm;  /* [dim]: each head's RMSNorm, before the rotation (Qwen3, Gemma 3) */
    float eps_qk;
    int64_t window;  /* a sliding window, in keys (Mistral, Gemma's and Qwen's sliding layers) */
    const float *norm_attn_out, *norm_mlp_out;  /* [hidden]: each sublayer's output normed before its sum (Gemma) */
    float eps_out;
    int64_t act;  /* ACT_* */
    int64_t rope;  /* which of the step's rotary tables turns this layer's q and k (Gemma 3's local, global) */
    float softcap;  /* attention scores become softcap * tanh(score / softcap) (Gemma 2; 0: none) */
} LlamaLayer;

/* one step, built once for all layers (paged_attention.py's PagedStep) */
typedef struct {
    const int64_t *slots;  /* [tokens]: block * block_size + offset of each new token */
    const int64_t *q_starts, *q_lens, *ctx_lens;  /* per sequence */
    const int32_t *tables;  /* [sequences, table_width] */
    int64_t tokens, sequences, table_width, block;
    /* the same in the window pool, for the layers with a sliding window (NULL: they have none) */
    const int64_t *window_slots;
    const int32_t *window_tables;  /* [sequences, window_table_width] */
    int64_t window_table_width;
} LlamaStep;

/* paged_attention.c: each sequence's queries over its own keys, through its block table; the
 * pool's keys and values in fp32, or in fp16 (their bits) for paged_attention_f16 (ready: 1);
 * softcap: scores become softcap * tanh(score / softcap) (Gemma 2's; 0: none) */
int paged_attention(const float *q, int64_t q_tok, int64_t q_head, const float *k_pool, const float *v_pool,
                    float *out, const int64_t *q_starts, const int64_t *q_lens, const int64_t *ctx_lens,
                    const int32_t *tables, int64_t table_width, int64_t sequences, int64_t heads,
                    int64_t kv_heads, int64_t dim, int64_t block, int64_t window, float scale, float softcap,
                    int threads);
int paged_attention_f16_ready(void);
int paged_attention_f16(const float *q, int64_t q_tok, int64_t q_head, const uint16_t *k_pool,
                        const uint16_t *v_pool, float *out, const int64_t *q_starts, const int64_t *q_lens,
                        const int64_t *ctx_lens, const int32_t *tables, int64_t table_width, int64_t sequences,
                        int64_t heads, int64_t kv_heads, int64_t dim, int64_t block, int64_t window, float scale,
                        float softcap, int threads);

/* quant_matmul.c: y = x W^T for int4 weights (int4.py's Q4_1 blocks) and for int8 weights packed
 * [outputs / 16][width][16] with an fp16 scale per block of 32 inputs, [outputs / 16][blocks][16]
 * (Q8_0: the output layer), on x rounded to int16
 * per block of 32: arith.h's arithmetic, the same bits on every path; ready: 2 (AVX2 integer
 * products), 1 (plain C) */
int int4_matmul_ready(void);
int int4_matmul(const float *x, const uint8_t *packed, const uint16_t *scale, const uint16_t *low, float *y,
                int64_t rows, int64_t width, int64_t outputs, int threads);
int int8_matmul_ready(void);
int int8_matmul(const float *x, const int8_t *packed, const uint16_t *scale, float *y, int64_t rows, int64_t width,
                int64_t outputs, int threads);
/* the same products for the GGUF types whose scales fp16 cannot hold: int4 steps with fp32 scale and
 * low per block of 32 (Q4_K), and int8 steps with fp32 scale and low (low may be NULL) per 16
 * inputs (Q5_1, Q5_K, Q6_K); both run where int4_matmul does */
int int4f_matmul(const float *x, const uint8_t *packed, const float *scale, const float *low, float *y,
                 int64_t rows, int64_t width, int64_t outputs, int threads);
int int8s_matmul(const float *x, const int8_t *packed, const float *scale, const float *low, float *y, int64_t rows,
                 int64_t width, int64_t outputs, int threads);
/* int4f_matmul's products with Q4_K's scales as the file holds them, 0.58 bytes a weight where
 * int4f_matmul reads 0.75: `super` fp16 [outputs / 16][width / 256][2][16] (d, then -dmin, per
 * block of 256 inputs), `sub` u8 [outputs / 16][width / 32][2][16] (sc, then m, per 32). Each
 * scale d sc and low -dmin m is computed in fp32, where it is exact (an 11-bit by a 6-bit integer
 * product): the very values int4f_matmul reads, so the same bits. width: a multiple of 256. */
int int4k_matmul(const float *x, const uint8_t *packed, const uint16_t *super, const uint8_t *sub, float *y,
                 int64_t rows, int64_t width, int64_t outputs, int threads);
/* int8s_matmul's products without lows, with Q6_K's scales as the file holds them, 1.07 bytes a
 * weight where int8s_matmul reads 1.25: `super` fp16 [outputs / 16][width / 256][16] (d), `sub`
 * int8 [outputs / 16][width / 16][16] (sc). d sc is exact in fp32 (11 by 8 bits): the same bits.
 * width: a multiple of 256. */
int int8k_matmul(const float *x, const int8_t *packed, const uint16_t *super, const int8_t *sub, float *y,
                 int64_t rows, int64_t width, int64_t outputs, int threads);
/* any of the six, as a Weight's kind says (the whole layers' products); y's rows y_stride apart */
int weight_matmul(const float *x, const Weight *w, float *y, int64_t y_stride, int64_t rows, int threads);

/* gguf_repack.c: a GGUF tensor's blocks [rows][width / its block] written into the layouts above,
 * as gguf_types.py splits them and int4.py packs them, in one pass; the file's row `order[r]` (NULL:
 * r) becomes row r. Q4_K: int4f_matmul's packed steps, fp32 scale and low; Q6_K: int8s_matmul's
 * steps and fp32 scales (no low). rows: a multiple of 16; width: of 256 (K-quants). */
int repack_q4_k(const uint8_t *blocks, const int64_t *order, int64_t rows, int64_t width, uint8_t *packed,
                float *scale, float *low, int threads);
/* Q4_K into int4k_matmul's layout: its packed steps, `super` and `sub` */
int repack_q4_k_own(const uint8_t *blocks, const int64_t *order, int64_t rows, int64_t width, uint8_t *packed,
                    uint16_t *super, uint8_t *sub, int threads);
int repack_q6_k(const uint8_t *blocks, const int64_t *order, int64_t rows, int64_t width, int8_t *steps,
                float *scale, int threads);
/* Q6_K into int8k_matmul's layout: its steps, `super` and `sub` */
int repack_q6_k_own(const uint8_t *blocks, const int64_t *order, int64_t rows, int64_t width, int8_t *steps,
                    uint16_t *super, int8_t *sub, int threads);
/* the types of blocks of 32 (width: a multiple of 32): Q4_0 and Q4_1 into int4_matmul's packed steps
 * and fp16 scale and low; Q8_0 and Q5_0 into int8_matmul's steps and fp16 scale */
int repack_q4_0(const uint8_t *blocks, const int64_t *order, int64_t rows, int64_t width, uint8_t *packed,
                uint16_t *scale, uint16_t *low, int threads);
int repack_q4_1(const uint8_t *blocks, const int64_t *order, int64_t rows, int64_t width, uint8_t *packed,
                uint16_t *scale, uint16_t *low, int threads);
int repack_q8_0(const uint8_t *blocks, const int64_t *order, int64_t rows, int64_t width, int8_t *steps,
                uint16_t *scale, int threads);
int repack_q5_0(const uint8_t *blocks, const int64_t *order, int64_t rows, int64_t width, int8_t *steps,
                uint16_t *scale, int threads);

/* dense_matmul.c: y = x W^T for fp32 weights packed [outputs / 16][width][16] (fp32 Linear layers;
 * as bf16 where they are bf16 values); ready: 1 (AVX2 + FMA) */
int dense_matmul_ready(void);
int fp32_matmul(const float *x, const float *packed, float *y, int64_t rows, int64_t width, int64_t outputs,
                int threads);
int bf16_matmul(const float *x, const uint16_t *packed, float *y, int64_t rows, int64_t width, int64_t outputs,
                int threads);  /* fp32 weights that are bf16 values, kept as bf16 */

/* llama_layer.c: whole decoder layers, and the norms and activations the model's modules share with
 * them; the pool's keys and values in fp32 (kv_half 0) or fp16 (1), one pool per layer for
 * llama_layers; cos and sin [tables][tokens][dim], a layer's `rope` picking its table */
int llama_layers(const LlamaLayer *layers, int64_t count, const LlamaStep *step, const float *cos, const float *sin,
                 int64_t tables, const float *in, float *out, void *const *k_pools, void *const *v_pools,
                 int kv_half, int threads);
void rms_norm_rows(const float *x, const float *weight, float *y, int64_t rows, int64_t n, float eps);
void silu_rows(const float *x, float *y, int64_t rows, int64_t n, int64_t x_stride);
void gelu_tanh_rows(const float *x, float *y, int64_t n);
void fp16_rows(const float *x, uint16_t *out, int64_t n);  /* rounded as the fp16 KV cache keeps them */

/* greedy.c: the plain greedy rows' argmax and its log probability, and log-softmax rows, in arith.h's
 * arithmetic; ready: 1 */
int greedy_ready(void);
int greedy_rows(const float *logits, int64_t rows, int64_t vocab, int64_t *tokens, float *logprobs, int threads);
int log_softmax_rows(const float *logits, int64_t rows, int64_t vocab, float *out, int threads);

#endif
