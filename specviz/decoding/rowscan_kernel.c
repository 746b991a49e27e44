/*
 * specviz row-scan kernel: the softmax normaliser of one logits row, sum(exp(x[i] - m)), in one
 * vectorised pass (specviz/decoding/rowscan_kernel.py loads it; rowscan.py falls back to numpy).
 *
 * Why C: numpy needs a float32 exponential pass and a sum pass over the row (262 144 values for the
 * embedded model's vocabulary), the largest part of the greedy acceptor's time; one fused pass here
 * costs well under half.
 *
 * exp is computed for x - m <= 0 only (m is the row's maximum): x = n ln2 + r with |r| <= ln2 / 2,
 * e^r by its Taylor polynomial to degree 7 (relative error below 1e-7), 2^n by building the float's
 * exponent bits. Values below -87, -inf and NaN are clamped to -87: each adds at most e^-87 < 1.7e-38
 * (a whole row of them less than 5e-33, next to the maximum's 1), so NaN counts as -inf, as in the
 * row scan. Sixteen float lanes each add 16 terms per block of 256 values and every
 * block is added in double: the loop vectorises without -ffast-math and the sum keeps ~1e-8 relative
 * accuracy. GCC builds AVX-512, AVX2 and baseline versions and picks one at load time
 * (target_clones); other compilers build the baseline.
 *
 * Written for specviz (MIT).
 */
#include <stdint.h>
#include <string.h>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define SPECVIZ_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define SPECVIZ_CLONES
#endif

#define SPECVIZ_LANES 16
#define SPECVIZ_BLOCK 256

static inline float specviz_exp_nonpositive(float x) {
    const float xc = x > -87.0f ? x : -87.0f; /* NaN compares false: clamped too */
    const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round(x / ln2) */
    float r = xc - n * 0.693145751953125f;  /* ln2, high part (exact in float) */
    r = r - n * 1.428606765330187045e-06f;  /* ln2, low part */
    float p = 1.98412698412698413e-04f;     /* 1/7! */
    p = p * r + 1.38888888888888889e-03f;   /* 1/6! */
    p = p * r + 8.33333333333333333e-03f;   /* 1/5! */
    p = p * r + 4.16666666666666667e-02f;   /* 1/4! */
    p = p * r + 1.66666666666666667e-01f;   /* 1/3! */
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const int32_t bits = ((int32_t) n + 127) << 23; /* 2^n, n in [-126, 0] */
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

SPECVIZ_CLONES
double specviz_expsum(const float * x, int64_t n, float m) {
    double s = 0.0;
    int64_t i = 0;
    for (; i + SPECVIZ_BLOCK <= n; i += SPECVIZ_BLOCK) {
        float acc[SPECVIZ_LANES] = {0};
        for (int b = 0; b < SPECVIZ_BLOCK; b += SPECVIZ_LANES) {
            for (int j = 0; j < SPECVIZ_LANES; ++j) {
                acc[j] += specviz_exp_nonpositive(x[i + b + j] - m);
            }
        }
        float t = 0.0f;
        for (int j = 0; j < SPECVIZ_LANES; ++j) {
            t += acc[j];
        }
        s += (double) t;
    }
    for (; i < n; ++i) {
        s += (double) specviz_exp_nonpositive(x[i] - m);
    }
    return s;
}
