/* The kernels' one arithmetic: what every C path (the portable one, AVX2, AVX-512) computes, bit
 * for bit, so that a token and its log probabilities are the same on every CPU.
 *
 * - Floating point is IEEE single, each operation rounded on its own: build.py compiles with
 *   -ffp-contract=off, and no kernel on this path uses a fused multiply-add, so a * b + c rounds
 *   twice on every CPU (a machine without FMA computes it as fast as one with).
 * - Order is fixed by the code, not the vector width: float vectors here are 8 lanes (`f8`, GCC's
 *   generic vectors: one AVX register, two SSE ones, or scalars), and a sum across lanes is the
 *   same tree everywhere (`lane_sum`).
 * - One exponential, one logarithm and one tanh (`exp8`, `log_positive`, `tanh8`), plain polynomials:
 *   libm's differ between its FMA and non-FMA builds.
 * - Products of quantized weights and activations are integer sums (exact, in any order):
 *   activations are rounded to int16 per block of 32 (`quantize_block`), 15 bits of each where
 *   bf16 keeps 8 and int8 7.
 * - fp16 values (scales, the KV cache) are widened exactly and rounded to nearest even, by F16C
 *   where the CPU has it and by the same rule in integers where not.
 */
#ifndef ENGINE_KERNELS_ARITH_H
#define ENGINE_KERNELS_ARITH_H
#include <stdint.h>
#include <string.h>

#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

typedef float f8 __attribute__((vector_size(32)));  /* loaded and stored with memcpy: unaligned */
typedef int32_t i8 __attribute__((vector_size(32)));

#define QBLOCK 32       /* activations per int16 block */
#define QMAX 32767.0f  /* an int16 block's largest step */

static inline f8 load8(const float *p) {
    f8 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void store8(float *p, f8 v) { memcpy(p, &v, sizeof v); }

static inline f8 splat8(float x) { return (f8){x, x, x, x, x, x, x, x}; }

static inline f8 as_f8(i8 bits) {
    f8 v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

static inline i8 as_i8(f8 v) {
    i8 bits;
    memcpy(&bits, &v, sizeof bits);
    return bits;
}

/* take ? a : b, lane by lane (take: all ones or zero per lane) */
static inline f8 select8(i8 take, f8 a, f8 b) { return as_f8((as_i8(a) & take) | (as_i8(b) & ~take)); }

static inline f8 max8(f8 a, f8 b) { return select8(a > b, a, b); }

static inline float lane_max(f8 v) {
    float m = v[0];
    for (int i = 1; i < 8; i++) m = v[i] > m ? v[i] : m;
    return m;
}

static inline float lane_sum(f8 v) {  /* ((0+4)+(2+6)) + ((1+5)+(3+7)): one tree everywhere */
    return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}

/* e^x, Cephes' expf without fused multiply-adds: n = x / ln 2 rounded to nearest even, r = x - n
 * ln 2 (ln 2 in two parts), e^r by a degree-6 polynomial, times 2^n. Below -87.33 (e^x under
 * float's smallest normal) it is 0; above 88.376 it stays e^88.376 (n = 127 at most). Relative
 * error under 3e-7. */
static inline f8 exp8(f8 x) {
    i8 tiny = x < -87.33f;
    x = select8(x < 88.3762626647949f, x, splat8(88.3762626647949f));
    x = select8(tiny, splat8(0.0f), x);
    f8 n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  /* round to nearest even */
    f8 r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
    f8 p = 1.9875691500e-4f * r + 1.3981999507e-3f;
    p = p * r + 8.3333519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = (p * (r * r) + r) + 1.0f;
    i8 bits = (__builtin_convertvector(n, i8) + 127) << 23;
    return as_f8(as_i8(p * as_f8(bits)) & ~tiny);
}

/* tanh x, Cephes' tanhf without fused multiply-adds: x + x^3 P(x^2) by a degree-4 polynomial
 * where |x| < 0.625, 1 - 2 / (e^2|x| + 1) with x's sign elsewhere. Relative error under 3e-7. */
static inline f8 tanh8(f8 x) {
    f8 a = select8(x < 0.0f, -x, x), s = x * x;
    f8 p = -5.70498872745e-3f * s + 2.06390887954e-2f;
    p = p * s - 5.37397155531e-2f;
    p = p * s + 1.33314422036e-1f;
    p = p * s - 3.33332819422e-1f;
    f8 small = (p * s) * x + x;
    f8 large = 1.0f - 2.0f / (exp8(a + a) + 1.0f);
    large = select8(x < 0.0f, -large, large);
    return select8(a < 0.625f, small, large);
}

/* ln x for a positive normal x, Cephes' logf without fused multiply-adds: x = m 2^e with m in
 * [sqrt(1/2), sqrt(2)), ln m by a degree-9 polynomial in m - 1, then e ln 2 in two parts.
 * Relative error under 3e-7. */
static inline float log_positive(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    int e = (int)((bits >> 23) & 0xFF) - 126;
    bits = (bits & 0x807FFFFFu) | 0x3F000000u;  /* m in [0.5, 1) */
    float m;
    memcpy(&m, &bits, sizeof m);
    if (m < 0.707106781186547524f) {
        e -= 1;
        m = (m + m) - 1.0f;
    } else {
        m = m - 1.0f;
    }
    float z = m * m;
    float y = 7.0376836292e-2f;
    y = y * m + -1.1514610310e-1f;
    y = y * m + 1.1676998740e-1f;
    y = y * m + -1.2420140846e-1f;
    y = y * m + 1.4249322787e-1f;
    y = y * m + -1.6668057665e-1f;
    y = y * m + 2.0000714765e-1f;
    y = y * m + -2.4999993993e-1f;
    y = y * m + 3.3333331174e-1f;
    y = (y * m) * z;
    y = y + (float)e * -2.12194440e-4f;
    y = y - 0.5f * z;
    return (m + y) + (float)e * 0.693359375f;
}

/* fp16 bits -> fp32, exactly */
static inline float half_to_float(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF, bits;
    if (exponent == 0x1F) {
        bits = sign | 0x7F800000u | (mantissa << 13) | (mantissa ? 0x400000u : 0);  /* inf, quiet NaN */
    } else if (exponent) {
        bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
    } else if (mantissa) {  /* subnormal: normalize */
        int shift = 0;
        while (!(mantissa & 0x400)) mantissa <<= 1, shift++;
        bits = sign | ((uint32_t)(113 - shift) << 23) | ((mantissa & 0x3FF) << 13);
    } else {
        bits = sign;
    }
    float x;
    memcpy(&x, &bits, sizeof x);
    return x;
#endif
}

/* fp32 -> fp16 bits, rounded to nearest even (overflow to infinity), as F16C and PyTorch do */
static inline uint16_t float_to_half(float x) {
#if defined(__F16C__)
    return _cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT);
#else
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    uint16_t sign = (uint16_t)((bits >> 16) & 0x8000);
    uint32_t magnitude = bits & 0x7FFFFFFFu;
    if (magnitude >= 0x7F800000u)  /* inf, NaN (kept quiet) */
        return sign | 0x7C00 | (magnitude > 0x7F800000u ? 0x200 | ((magnitude >> 13) & 0x3FF) : 0);
    if (magnitude >= 0x477FF000u) return sign | 0x7C00;  /* rounds to 65520 or more: infinity */
    if (magnitude < 0x38800000u) {  /* under 2^-14: a subnormal or zero, steps of 2^-24 */
        if (magnitude < 0x33000000u) return sign;  /* at most 2^-25: rounds to zero */
        uint32_t mantissa = (magnitude & 0x7FFFFF) | 0x800000;
        int shift = 126 - (int)(magnitude >> 23);  /* 14 to 24 */
        uint32_t kept = mantissa >> shift, rest = mantissa & ((1u << shift) - 1), half = 1u << (shift - 1);
        kept += rest > half || (rest == half && (kept & 1));
        return sign | (uint16_t)kept;
    }
    uint32_t kept = (magnitude - 0x38000000u) >> 13, rest = magnitude & 0x1FFF;
    kept += rest > 0x1000 || (rest == 0x1000 && (kept & 1));
    return sign | (uint16_t)kept;
#endif
}

/* 8 fp16 values widened to fp32 */
static inline f8 half8(const uint16_t *h) {
#if defined(__F16C__)
    return (f8)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
#else
    f8 v;
    for (int i = 0; i < 8; i++) v[i] = half_to_float(h[i]);
    return v;
#endif
}

/* One block of QBLOCK activations (n of them, the rest taken as 0) as int16 steps: its scale is
 * its largest magnitude / 32767, and each step x * (32767 / largest) rounded to nearest even.
 * Returns the scale (0 for a block of zeros, whose steps are all 0); *sum gets the steps' sum. */
static inline float quantize_block(const float *x, int n, int16_t *steps, int32_t *sum) {
    float top = 0.0f;
    for (int i = 0; i < n; i++) {
        float a = x[i] < 0.0f ? -x[i] : x[i];
        top = a > top ? a : top;
    }
    int32_t total = 0;
    if (!(top > 0.0f) || top > 3.0e38f) {  /* zeros (or a NaN or an infinity: steps 0) */
        memset(steps, 0, QBLOCK * sizeof *steps);
        *sum = 0;
        return top > 0.0f ? top : 0.0f;
    }
    float inverse = QMAX / top;
    for (int i = 0; i < QBLOCK; i++) {
        float v = i < n ? x[i] * inverse : 0.0f;
        v = (v + 12582912.0f) - 12582912.0f;  /* to nearest even: |v| <= 32767.01 < 2^22 */
        int32_t q = (int32_t)v;
        q = q > 32767 ? 32767 : q < -32767 ? -32767 : q;
        steps[i] = (int16_t)q;
        total += q;
    }
    *sum = total;
    return top / QMAX;
}

#endif
