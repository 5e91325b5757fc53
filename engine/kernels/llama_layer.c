/* One decoder layer of Llama's shape in one call, for c_stack.py: the engine's step on CPU,
 * with the weights of a GGUF's blocks (or int4.py's), whatever kind each projection has.
 *
 * A decode step of a small model is mostly the small operations between the matmuls: with
 * PyTorch each RMSNorm, rotary embedding, activation and residual sum is several calls of tens
 * of microseconds (on this project's 2-core machine a token's step spent 9 ms of 25 there, as
 * long as its int4 matmuls). Here they are loops over each token's own values, between the
 * products (quant_matmul.c, the product each projection's kind needs) and the paged attention
 * (paged_attention.c) that PyTorch's path calls too:
 *
 *   y = rms_norm(x) ; q, k, v = y Wqkv ; rotate q and k ; write k, v to the pool ;
 *   a = attention(q) ; h = x + a Wo ; z = rms_norm(h) ; g, u = z Wgu ; out = h + (act(g) u) Wd
 *
 * and, where the layer has them, its kin's features: a bias after the q, k, v product (Qwen2),
 * each head's RMSNorm of q and k before the rotation (Qwen3, Gemma 3), a sliding window
 * (Mistral, Gemma's and Qwen's sliding layers); and Gemma's: each sublayer's output normed
 * before its sum, GELU's tanh approximation for the activation, capped attention scores (Gemma
 * 2), and a rotary table of the layer's own (Gemma 3's local and global bases). Gemma's norms
 * scale by 1 + w: the caller passes that sum as the weight.
 *
 * Every token's numbers come from its own values with the same instructions whatever the other
 * tokens are (the matmuls and attention promise the same), so a row is bit for bit the same
 * alone, batched, chunked or after cached keys. They are also PyTorch's numbers for the same
 * layer, bit for bit, given the same norms and activations: the rotary embedding and the sums are
 * single IEEE operations in PyTorch's order (no fused multiply-adds), and the norms and
 * activations, whose sums and exponentials PyTorch rounds its own way, are `rms_norm_rows`,
 * `silu_rows` and `gelu_tanh_rows` here, which testing/native_reference.py puts in transformers'
 * layers for the tests' reference.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "arith.h"
#include "kernels.h"

/* LlamaRMSNorm: y = weight (x / sqrt(mean(x^2) + eps)), each row on its own. One function for
 * the layer and the modules, so both round alike. Each row's sum of squares is one chain in
 * input order; SIDE rows' chains run side by side, which hides an addition's latency and changes
 * no number. */
#define SIDE 4
__attribute__((noinline)) void rms_norm_rows(const float *x, const float *weight, float *y, int64_t rows,
                                             int64_t n, float eps) {
    for (int64_t r0 = 0; r0 < rows; r0 += SIDE, x += SIDE * n, y += SIDE * n) {
        const int64_t count = rows - r0 < SIDE ? rows - r0 : SIDE;
        float sum[SIDE] = {0.0f};
        if (count == SIDE)
            for (int64_t i = 0; i < n; i++)
                for (int k = 0; k < SIDE; k++) sum[k] += x[k * n + i] * x[k * n + i];
        else
            for (int64_t k = 0; k < count; k++)
                for (int64_t i = 0; i < n; i++) sum[k] += x[k * n + i] * x[k * n + i];
        for (int64_t k = 0; k < count; k++) {
            float scale = 1.0f / sqrtf(sum[k] / (float)n + eps);
            for (int64_t i = 0; i < n; i++) y[k * n + i] = weight[i] * (x[k * n + i] * scale);
        }
    }
}

/* SiLU of 8 values, x / (1 + e^-x), in arith.h's exponential: relative error under 5e-7 against
 * float64. */
static inline f8 silu8(f8 x) { return x / (1.0f + exp8(-x)); }

/* f of n values: whole vectors, then the rest through one padded vector, so every value gets the
 * same operations wherever it sits */
static inline void map_span(f8 (*f)(f8), const float *x, float *y, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) store8(y + i, f(load8(x + i)));
    if (i < n) {
        float pad[8] = {0};
        for (int64_t j = i; j < n; j++) pad[j - i] = x[j];
        store8(pad, f(load8(pad)));
        for (int64_t j = i; j < n; j++) y[j] = pad[j - i];
    }
}

static inline void silu_span(const float *x, float *y, int64_t n) { map_span(silu8, x, y, n); }

/* SiLU, x / (1 + exp(-x)), of n values per row; rows of x are x_stride apart, y's n. */
__attribute__((noinline)) void silu_rows(const float *x, float *y, int64_t rows, int64_t n, int64_t x_stride) {
    for (int64_t r = 0; r < rows; r++, x += x_stride, y += n) silu_span(x, y, n);
}

/* GELU's tanh approximation of 8 values, PyTorch's formula (gelu(approximate="tanh")):
 * 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), in arith.h's tanh, each operation rounded
 * on its own */
static inline f8 gelu_tanh8(f8 x) {
    const float beta = 0.7978845608028654f, kappa = 0.044715f;  /* sqrt(2 / pi) */
    f8 cube = x * x * x;
    f8 inner = beta * (x + kappa * cube);
    return 0.5f * x * (1.0f + tanh8(inner));
}

/* Gemma's activation over n values */
__attribute__((noinline)) void gelu_tanh_rows(const float *x, float *y, int64_t n) { map_span(gelu_tanh8, x, y, n); }

/* transformers' apply_rotary_pos_emb on one head: v cos + rotate_half(v) sin, where rotate_half
 * turns halves (a, b) into (-b, a); each product and sum rounded on its own, as PyTorch does. */
static void rotate(float *v, const float *cos, const float *sin,
                                                               int64_t dim) {
    int64_t half = dim / 2;
    for (int64_t i = 0; i < half; i++) {
        float a = v[i], b = v[i + half];
        float a_cos = a * cos[i], minus_b_sin = -b * sin[i], b_cos = b * cos[i + half], a_sin = a * sin[i + half];
        v[i] = a_cos + minus_b_sin;
        v[i + half] = b_cos + a_sin;
    }
}

/* n values rounded to fp16 bits, as the KV cache keeps them */
void fp16_rows(const float *x, uint16_t *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = float_to_half(x[i]);
}

/* keys [blocks, kv_heads, dim, block] (transposed), values [blocks, block, kv_heads, dim]: fp32,
 * or fp16 where `half` */
static void write_kv(const float *k, const float *v, int64_t slot, void *k_pool, void *v_pool, int half,
                     int64_t kv_heads, int64_t dim, int64_t block) {
    int64_t b = slot / block, offset = slot % block;
    for (int64_t h = 0; h < kv_heads; h++)
        for (int64_t d = 0; d < dim; d++) {
            int64_t key = ((b * kv_heads + h) * dim + d) * block + offset;
            int64_t value = ((b * block + offset) * kv_heads + h) * dim + d;
            if (half) {
                ((uint16_t *)k_pool)[key] = float_to_half(k[h * dim + d]);
                ((uint16_t *)v_pool)[value] = float_to_half(v[h * dim + d]);
            } else {
                ((float *)k_pool)[key] = k[h * dim + d];
                ((float *)v_pool)[value] = v[h * dim + d];
            }
        }
}

#define PARALLEL_TOKENS 64  /* from here a loop between the matmuls is worth waking the threads */

/* rms_norm_rows of n token rows (in place where x is y), SIDE at a time, in parallel where `wide` */
static void norm_tokens(const float *x, const float *weight, float *y, int64_t n, int64_t hidden, float eps,
                        int wide, int threads) {
    #pragma omp parallel for schedule(static) num_threads(threads) if (wide)
    for (int64_t t = 0; t < n; t += SIDE)
        rms_norm_rows(x + t * hidden, weight, y + t * hidden, n - t < SIDE ? n - t : SIDE, hidden, eps);
}

/* the outputs of `count` parts end to end (an empty part: none); each output group is computed
 * alone by every product, so one part or several give the same bits */
static int64_t outputs_of(const Weight *parts, int count) {
    int64_t total = 0;
    for (int i = 0; i < count; i++) total += parts[i].outputs;
    return total;
}

/* y [rows, outputs_of(parts)] = x times the parts end to end, each part's product writing its
 * own columns (a model whose q, k and v share a kind is joined into one part) */
static int products(const Weight *parts, int count, const float *x, float *y, int64_t rows, int threads) {
    const int64_t total = outputs_of(parts, count);
    int64_t start = 0;
    int status = 0;
    for (int i = 0; i < count && !status; i++) {
        if (parts[i].outputs) status = weight_matmul(x, parts + i, y + start, total, rows, threads);
        start += parts[i].outputs;
    }
    return status;
}

/* the activation between gate and up, of n values */
static void activate(int64_t act, const float *x, float *y, int64_t n) {
    if (act == ACT_GELU_TANH) gelu_tanh_rows(x, y, n);
    else silu_span(x, y, n);
}

/* the floats a layer's step needs between its products (layer_in's `buffer`) */
static int64_t scratch_of(const LlamaLayer *layer, int64_t tokens) {
    const int64_t qkv_width = outputs_of(layer->qkv, 3), q_width = layer->heads * layer->dim;
    return tokens * (2 * layer->hidden + qkv_width + q_width + 3 * layer->inter);
}

/* One layer of a step: in, out [tokens, hidden]; cos, sin [tables][tokens, dim] (the layer's `rope`
 * picks one); its work in `buffer`, scratch_of(layer, tokens) floats, which every layer of a step
 * shares (llama_layers). A prompt's chunk of 512 tokens takes 69 MB at 1B, which malloc maps anew
 * above its threshold: a buffer per layer made its pages fault in and be zeroed 16 times a chunk.
 * Returns 0, or -1 for shapes the kernels do not take (before anything is written but this step's
 * keys and values, which a retry rewrites). */
static int layer_in(const LlamaLayer *layer, const LlamaStep *step, const float *cos, const float *sin,
                    int64_t tables, const float *in, float *out, void *k_pool, void *v_pool, int kv_half,
                    int threads, float *buffer) {
    const int64_t n = step->tokens, hidden = layer->hidden, dim = layer->dim, heads = layer->heads;
    const int64_t qkv_width = outputs_of(layer->qkv, 3), inter = layer->inter, q_width = heads * dim;
    const int64_t kv_width = layer->kv_heads * dim;
    const int windowed = layer->window && step->window_tables;  /* its keys in the window pool */
    const int64_t *slots = windowed ? step->window_slots : step->slots;
    const int32_t *blocks = windowed ? step->window_tables : step->tables;
    const int64_t width = windowed ? step->window_table_width : step->table_width;
    if (n < 1 || dim % 2 || layer->rope < 0 || layer->rope >= tables || qkv_width != q_width + 2 * kv_width
        || outputs_of(layer->gate_up, 2) != 2 * inter || layer->o.outputs != hidden || layer->down.outputs != hidden)
        return -1;
    float *normed = buffer, *qkv = normed + n * hidden, *attended = qkv + n * qkv_width;
    float *gate_up = attended + n * q_width, *act = gate_up + n * 2 * inter, *sum = act + n * inter;
    cos += layer->rope * n * dim, sin += layer->rope * n * dim;
    int status = 0;
    const int wide = n >= PARALLEL_TOKENS;  /* a prompt's chunk: the loops between the matmuls in parallel too */
    norm_tokens(in, layer->norm_in, normed, n, hidden, layer->eps_in, wide, threads);
    if ((status = products(layer->qkv, 3, normed, qkv, n, threads))) return status;
    #pragma omp parallel for schedule(static) num_threads(threads) if (wide)
    for (int64_t t = 0; t < n; t++) {
        float *row = qkv + t * qkv_width;
        if (layer->qkv_bias)
            for (int64_t i = 0; i < qkv_width; i++) row[i] += layer->qkv_bias[i];
        if (layer->q_norm) rms_norm_rows(row, layer->q_norm, row, heads, dim, layer->eps_qk);  /* in place */
        if (layer->k_norm)
            rms_norm_rows(row + q_width, layer->k_norm, row + q_width, layer->kv_heads, dim, layer->eps_qk);
        for (int64_t h = 0; h < heads + layer->kv_heads; h++) rotate(row + h * dim, cos + t * dim, sin + t * dim, dim);
        write_kv(row + q_width, row + q_width + kv_width, slots[t], k_pool, v_pool, kv_half,
                 layer->kv_heads, dim, step->block);
    }
    status = kv_half ? paged_attention_f16(qkv, qkv_width, dim, k_pool, v_pool, attended, step->q_starts,
                                           step->q_lens, step->ctx_lens, blocks, width, step->sequences, heads,
                                           layer->kv_heads, dim, step->block, layer->window, layer->scale,
                                           layer->softcap, threads)
                     : paged_attention(qkv, qkv_width, dim, k_pool, v_pool, attended, step->q_starts, step->q_lens,
                                       step->ctx_lens, blocks, width, step->sequences, heads, layer->kv_heads, dim,
                                       step->block, layer->window, layer->scale, layer->softcap, threads);
    if (status || (status = weight_matmul(attended, &layer->o, sum, hidden, n, threads))) return status;
    if (layer->norm_attn_out) norm_tokens(sum, layer->norm_attn_out, sum, n, hidden, layer->eps_out, wide, threads);
    #pragma omp parallel for schedule(static) num_threads(threads) if (wide)
    for (int64_t i = 0; i < n * hidden; i++) sum[i] += in[i];  /* x + y rounds as y + x */
    norm_tokens(sum, layer->norm_post, normed, n, hidden, layer->eps_post, wide, threads);
    if ((status = products(layer->gate_up, 2, normed, gate_up, n, threads))) return status;
    #pragma omp parallel for schedule(static) num_threads(threads) if (n * inter >= 16384)
    for (int64_t t = 0; t < n; t++) {  /* act_fn(gate) * up */
        float *a = act + t * inter;
        const float *up = gate_up + t * 2 * inter + inter;
        activate(layer->act, gate_up + t * 2 * inter, a, inter);
        for (int64_t i = 0; i < inter; i++) a[i] *= up[i];
    }
    if ((status = weight_matmul(act, &layer->down, out, hidden, n, threads))) return status;
    if (layer->norm_mlp_out) norm_tokens(out, layer->norm_mlp_out, out, n, hidden, layer->eps_out, wide, threads);
    #pragma omp parallel for schedule(static) num_threads(threads) if (wide)
    for (int64_t i = 0; i < n * hidden; i++) out[i] += sum[i];
    return 0;
}

/* Every layer of a step, one after another: layer i reads layer i - 1's output and its own
 * keys and values, k_pools[i] and v_pools[i] (a model with sliding-window layers keeps theirs in a
 * pool of their own). One call per step instead of one per layer: with one stream, Python's share
 * of a step (calls, checks, views of the pool) was a sixth of it. The same numbers as layer_in
 * layer by layer. Returns 0, -1 for shapes the kernels do not take (as layer_in), -2 when out of
 * memory. */
int llama_layers(const LlamaLayer *layers, int64_t count, const LlamaStep *step, const float *cos, const float *sin,
                 int64_t tables, const float *in, float *out, void *const *k_pools, void *const *v_pools,
                 int kv_half, int threads) {
    if (count < 1 || step->tokens < 1) return -1;
    const int64_t size = step->tokens * layers[0].hidden;
    int64_t scratch = 0;
    for (int64_t i = 0; i < count; i++) {
        const int64_t need = scratch_of(layers + i, step->tokens);
        scratch = need > scratch ? need : scratch;
    }
    float *between = malloc((size + scratch) * sizeof(float));
    if (!between) return -2;
    int status = 0;
    for (int64_t i = 0; i < count && !status; i++) {  /* the last layer writes `out`; the others alternate */
        float *target = (count - 1 - i) % 2 == 0 ? out : between;
        const float *source = i == 0 ? in : (target == out ? between : out);
        if (layers[i].hidden != layers[0].hidden) status = -1;
        else status = layer_in(layers + i, step, cos, sin, tables, source, target, k_pools[i], v_pools[i], kv_half,
                               threads, between + size);
    }
    free(between);
    return status;
}
