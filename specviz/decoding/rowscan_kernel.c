/*
 * specviz row-scan kernel: the passes over a logits row that decoding makes after each verify batch, each
 * one read of a float32 row of the vocabulary's width, without copying it. rowscan_kernel.py loads it
 * (built by cbuild.py with -O3 -fno-trapping-math, and -fopenmp where the compiler has it); without it
 * every caller computes the same in numpy.
 *
 * The passes (each described where it is defined):
 *   specviz_expsum        sum(exp(x[i] - m)) for a row whose maximum is m.
 *   specviz_scan          the greedy scan: first maximum (NaN read as -inf), its value and
 *                         sum(exp(x[i] - max)), in one pass; out[2] = {max, sum}, returns 1 for a NaN.
 *   specviz_topk          the k largest values' indices, largest first, ties to the lower index.
 *   specviz_rank          a token's rank, ties to the lower index.
 *   specviz_verify_greedy a greedy verification of k draft tokens over rows fetched by a callback; its
 *                         packed outputs ibuf / dbuf are laid out where it is defined.
 *   specviz_tempered, specviz_tempered_pick
 *                         the tempered softmax's maximum, sums (out[3] = {max, Z, Z without `skip`}) and
 *                         per-block sums (blocks[n / 256 rounded up]), and a draw that walks those blocks.
 *   specviz_residual, specviz_residual_pick
 *                         the same for a draft model's residual max(0, p - q).
 *   specviz_nucleus_mass  top-p's mass by distance below the maximum, in buckets.
 *   specviz_scan_threads, specviz_set_scan_threads, specviz_default_scan_threads
 *                         how many threads a long row is cut into; specviz_vector_paths: which
 *                         hand-written scans this CPU runs (bit 0 AVX2 with FMA, bit 1 AVX-512F).
 *
 * Builds. Every pass is plain C written so that GCC vectorises it without -ffast-math: branch-free
 * exponentials (below), sums kept in sixteen lanes, and counts (which vectorise) in place of searches
 * (which do not: a NaN-aware "x > m ? x : m" is no vector maximum for the compiler). GCC builds those for
 * x86-64-v4 (AVX-512), x86-64-v3 (AVX2 with FMA) and the baseline (before GCC 12: AVX-512F, AVX2 and the
 * baseline) and picks one at load time (target_clones); other compilers build the baseline.
 *
 * One pass also has hand-written vector builds: the greedy scan, in AVX-512 and in AVX2 with FMA, because
 * they measure faster than the compiler's build of the same pass (benchmarks/bench_row_kernel.py, a
 * 262 144-value row on one core of an AMD EPYC with AVX-512: 66 us against 98, and 98 against 128 for the
 * plain C built for AVX2). A hand-written build is kept only where it is more than 10% faster; every other
 * pass's plain C measured within 6% of the hand-written builds it replaced (or faster), so it has none.
 *
 * Threads. With OpenMP a row of at least SPECVIZ_SCAN_SPLIT values is cut into pieces of whole blocks,
 * one per thread, up to a cap (8 unless set, at most 16), for specviz_scan (so for specviz_verify_greedy)
 * and specviz_tempered; the pieces are joined so that the results are those of one pass. Every other pass
 * runs on the calling thread.
 *
 * Numbers. NaN counts as -inf everywhere (the scans report that there was one); float sums are added in
 * double per block of SPECVIZ_BLOCK values; results agree with float64 numpy to about 1e-7 relative (the
 * float exponential) or 1e-15 (the double one), and the indices exactly.
 *
 * Written for specviz (MIT).
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef SPECVIZ_CLONES
/* given on the command line: bench_row_kernel.py builds the plain C for one instruction set so */
#elif defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && __GNUC__ >= 12
#define SPECVIZ_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#elif defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) /* no x86-64-v* clones before GCC 12 */
#define SPECVIZ_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define SPECVIZ_CLONES
#endif

#define SPECVIZ_LANES 16
#define SPECVIZ_BLOCK 256

/* exp(x) in float for x <= 0 (x = value - maximum), once for the plain-C, AVX2 and AVX-512 builds: x
   clamped at -87, n = round(x / ln2), r = x - n ln2 with ln2 in two parts (the high part exact in float),
   e^r by Horner's rule on 1/k! for k = 7 ... 0 with the build's own multiply-add (relative error below
   1e-7), 2^n from the float's exponent bits. Values below -87, -inf and NaN are clamped to -87: each adds
   at most e^-87 < 1.7e-38 (a whole row of them less than 5e-33, next to the maximum's 1), so NaN counts as
   -inf. No branch and no libm call, so loops of it vectorise (libm's expf does not without -ffast-math). */
#define SPECVIZ_EXPF_FLOOR (-87.0f)
#define SPECVIZ_EXPF_LOG2E 1.44269504088896341f
#define SPECVIZ_EXPF_SHIFT 12582912.0f /* 1.5 * 2^23: adding it rounds to an integer in the low bits */
#define SPECVIZ_EXPF_SHIFT_BITS 0x4B400000 /* its bits */
#define SPECVIZ_EXPF_LN2_HI 0.693145751953125f
#define SPECVIZ_EXPF_LN2_LO 1.428606765330187045e-06f
#define SPECVIZ_EXPF_POLY(FMA, SET, r)                                                                          \
    FMA(FMA(FMA(FMA(FMA(FMA(FMA(SET(1.98412698412698413e-04f), r, SET(1.38888888888888889e-03f)), r,              \
                            SET(8.33333333333333333e-03f)),                                                      \
                        r, SET(4.16666666666666667e-02f)),                                                       \
                    r, SET(1.66666666666666667e-01f)),                                                           \
                r, SET(0.5f)),                                                                                   \
            r, SET(1.0f)),                                                                                       \
        r, SET(1.0f))
#define SPECVIZ_MULADD(a, b, c) ((a) * (b) + (c))
#define SPECVIZ_SCALAR(c) (c)

static inline float specviz_exp_nonpositive(float x) {
    const float xc = x > SPECVIZ_EXPF_FLOOR ? x : SPECVIZ_EXPF_FLOOR; /* NaN compares false: clamped too */
    const float n = (xc * SPECVIZ_EXPF_LOG2E + SPECVIZ_EXPF_SHIFT) - SPECVIZ_EXPF_SHIFT; /* round(x / ln2) */
    float r = xc - n * SPECVIZ_EXPF_LN2_HI;
    r = r - n * SPECVIZ_EXPF_LN2_LO;
    const float p = SPECVIZ_EXPF_POLY(SPECVIZ_MULADD, SPECVIZ_SCALAR, r);
    const int32_t bits = ((int32_t) n + 127) << 23; /* 2^n, n in [-126, 0] */
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* sum(exp(b[j] - m)) over one block (len <= SPECVIZ_BLOCK): sixteen float lanes, each adding its values in
   index order, then the lanes and the values after the last whole group of sixteen. */
static inline float specviz_block_expsum(const float * b, int64_t len, float m) {
    float acc[SPECVIZ_LANES] = {0};
    const int64_t full = len & ~(int64_t) (SPECVIZ_LANES - 1);
    for (int64_t j = 0; j < full; j += SPECVIZ_LANES) {
        for (int l = 0; l < SPECVIZ_LANES; ++l) {
            acc[l] += specviz_exp_nonpositive(b[j + l] - m);
        }
    }
    float t = 0.0f;
    for (int l = 0; l < SPECVIZ_LANES; ++l) {
        t += acc[l];
    }
    for (int64_t j = full; j < len; ++j) {
        t += specviz_exp_nonpositive(b[j] - m);
    }
    return t;
}

/* specviz_expsum: sum(exp(x[i] - m)) for a row whose maximum is m, block by block, the blocks added in
   double (about 1e-8 relative). */
SPECVIZ_CLONES
double specviz_expsum(const float * x, int64_t n, float m) {
    double s = 0.0;
    for (int64_t i = 0; i < n; i += SPECVIZ_BLOCK) {
        s += (double) specviz_block_expsum(x + i, n - i < SPECVIZ_BLOCK ? n - i : SPECVIZ_BLOCK, m);
    }
    return s;
}

/*
 * specviz_scan: the greedy row scan in one pass over the row, for the acceptor. It finds the first
 * maximum (NaN read as -inf), its value and sum(exp(x[i] - max)) together, so the row is read from
 * memory once instead of twice (an argmax pass, then the normaliser's pass): the row arrives from
 * llama.cpp's output layer out of this core's caches, and reading it is most of the scan's time.
 *
 * The row is taken in blocks of SPECVIZ_BLOCK values. Each block's maximum is found first (NaN skipped);
 * a block whose maximum exceeds the running one becomes the maximum's block and
 * the sum so far is rescaled by exp(old - new) (in double: a row can set a new maximum in many blocks).
 * The block, now in the first-level cache, is then summed against the running maximum as in
 * specviz_expsum. "First maximum wins": only a strictly greater block maximum moves the maximum's block,
 * and the index is the first value equal to the maximum in that block.
 *
 * out[0] = the maximum, out[1] = the sum; *best = its index (0 for a row of -inf and NaN only, as numpy's
 * argmax of the row with NaN read as -inf). The return value is 1 when the row holds a NaN (the caller
 * then takes its NaN-aware path), else 0. With a non-finite maximum out[1] is not meaningful.
 *
 * specviz_scan_generic is the plain-C build (cloned by the compiler), specviz_scan_avx512 and
 * specviz_scan_avx2 the hand-written ones; specviz_scan takes the widest this CPU runs. The plain-C and
 * AVX2 builds are exported so that the tests check each on every machine that runs it.
 */

/* exp(x) for x <= 0 in double (the scan's rescaling, and every term of the tempered, residual and nucleus
   passes below): n = round(x / ln2) (adding 1.5 * 2^52 rounds to nearest and leaves n in the low bits),
   r = x - n ln2 with ln2 in two parts (Cody and Waite), exp(r) by its Taylor polynomial to degree 12
   (|r| <= ln2 / 2: error below 2e-16), 2^n from the exponent bits. At or below -708 (and for -inf) the
   result is 0: e^-708 < 4e-308 is the edge of the normal doubles, and a row's probabilities never need the
   subnormal ones. No branch on x, so GCC vectorises loops of it. */
#define SPECVIZ_EXP_FLOOR (-708.0)
#define SPECVIZ_LN2_HI 0.693147180369123816490
#define SPECVIZ_LN2_LO 1.90821492927058770002e-10
#define SPECVIZ_LOG2E 1.4426950408889634074
#define SPECVIZ_ROUND_SHIFT 6755399441055744.0 /* 1.5 * 2^52 */
#define SPECVIZ_ROUND_SHIFT_BITS 0x4338000000000000LL /* its bits */

static inline double specviz_exp_nonpositive_d(double x) {
    const double xc = x > SPECVIZ_EXP_FLOOR ? x : SPECVIZ_EXP_FLOOR; /* -inf and NaN: the floor */
    const double shifted = xc * SPECVIZ_LOG2E + SPECVIZ_ROUND_SHIFT; /* n in the low bits */
    const double n = shifted - SPECVIZ_ROUND_SHIFT;
    double r = xc - n * SPECVIZ_LN2_HI;
    r = r - n * SPECVIZ_LN2_LO;
    double p = 1.0 / 479001600.0; /* 1/12! */
    p = p * r + 1.0 / 39916800.0;
    p = p * r + 1.0 / 3628800.0;
    p = p * r + 1.0 / 362880.0;
    p = p * r + 1.0 / 40320.0;
    p = p * r + 1.0 / 5040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    int64_t bits;
    memcpy(&bits, &shifted, sizeof bits);
    bits = (bits - SPECVIZ_ROUND_SHIFT_BITS + 1023) << 52; /* 2^n, n in [-1022, 0]; no float-to-int conversion */
    double scale;
    memcpy(&scale, &bits, sizeof scale);
    return x > SPECVIZ_EXP_FLOOR ? p * scale : 0.0;
}

/* The sum of a block's sixteen double lanes, in lane order. */
static inline double specviz_lanes_sum(const double * acc) {
    double t = 0.0;
    for (int l = 0; l < SPECVIZ_LANES; ++l) {
        t += acc[l];
    }
    return t;
}

/* Every scan build's two steps around a block (one rule for all): a block maximum `bm` above the
   running one moves the maximum's block to `i` and rescales the sum so far (in double: a row can set a new
   maximum in many blocks); the return value says whether the maximum is finite, so that the block's terms
   are summed. At the end, the first value equal to the maximum in its block is the first maximum of the
   row (only a strictly greater block maximum moves the block), 0 for a row of -inf and NaN only. */
static inline int specviz_scan_block_max(float bm, int64_t i, float * m, double * s, int64_t * block) {
    if (bm > *m) {
        *s *= specviz_exp_nonpositive_d((double) *m - (double) bm); /* 0 while m was -inf */
        *m = bm;
        *block = i;
    }
    return *m > -__builtin_inff() && *m < __builtin_inff();
}

static inline void specviz_scan_finish(const float * x, float m, double s, int64_t block, int64_t * best,
                                       double * out) {
    int64_t at = 0;
    if (block >= 0) {
        at = block;
        while (!(x[at] == m)) {
            ++at;
        }
    }
    *best = at;
    out[0] = m;
    out[1] = s;
}

/* The larger of m and the maximum of b[0 .. len) (NaN skipped); *nan set when the block holds a NaN. Most
   blocks of a row hold nothing above the running maximum: two counts over the block, which vectorise, say
   so, and only a block with a larger value is walked one value at a time. */
static inline float specviz_max_above(const float * b, int64_t len, float m, int * nan) {
    int32_t above = 0, nans = 0;
    for (int64_t j = 0; j < len; ++j) {
        above += b[j] > m;
        nans += b[j] != b[j];
    }
    *nan |= nans != 0;
    for (int64_t j = 0; above != 0 && j < len; ++j) {
        m = b[j] > m ? b[j] : m;
    }
    return m;
}

SPECVIZ_CLONES
int specviz_scan_generic(const float * x, int64_t n, int64_t * best, double * out) {
    int nan = 0;
    float m = -__builtin_inff();
    double s = 0.0;
    int64_t block = -1;
    for (int64_t i = 0; i < n; i += SPECVIZ_BLOCK) {
        const int64_t len = n - i < SPECVIZ_BLOCK ? n - i : SPECVIZ_BLOCK;
        const float bm = specviz_max_above(x + i, len, m, &nan);
        if (!specviz_scan_block_max(bm, i, &m, &s, &block)) {
            continue; /* nothing finite yet, or +inf: the caller's non-finite path */
        }
        s += (double) specviz_block_expsum(x + i, len, m);
    }
    specviz_scan_finish(x, m, s, block, best, out);
    return nan;
}

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>

__attribute__((target("avx512f"))) static inline __m512 specviz_exp_nonpositive16(__m512 x) {
    const __m512 xc = _mm512_max_ps(x, _mm512_set1_ps(SPECVIZ_EXPF_FLOOR)); /* NaN: the second operand */
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xc, _mm512_set1_ps(SPECVIZ_EXPF_LOG2E)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(SPECVIZ_EXPF_LN2_HI), xc);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(SPECVIZ_EXPF_LN2_LO), r);
    const __m512 p = SPECVIZ_EXPF_POLY(_mm512_fmadd_ps, _mm512_set1_ps, r);
    return _mm512_scalef_ps(p, n); /* p * 2^n */
}

__attribute__((target("avx512f"))) static int specviz_scan_avx512(const float * x, int64_t n, int64_t * best,
                                                                  double * out) {
    const __m512 ninf = _mm512_set1_ps(-__builtin_inff());
    __mmask16 nan = 0;
    float m = -__builtin_inff();
    double s = 0.0;
    int64_t block = -1;
    for (int64_t i = 0; i < n; i += SPECVIZ_BLOCK) {
        const int64_t len = n - i < SPECVIZ_BLOCK ? n - i : SPECVIZ_BLOCK;
        const int64_t full = len & ~(int64_t) (SPECVIZ_LANES - 1);
        const __mmask16 tail = (__mmask16) ((1u << (len - full)) - 1u);
        __m512 vmax = ninf;
        for (int64_t j = 0; j < full; j += SPECVIZ_LANES) {
            const __m512 v = _mm512_loadu_ps(x + i + j);
            nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
            vmax = _mm512_max_ps(v, vmax); /* NaN in v: vmax kept */
        }
        if (tail) {
            const __m512 v = _mm512_mask_loadu_ps(ninf, tail, x + i + full);
            nan |= _mm512_mask_cmp_ps_mask(tail, v, v, _CMP_UNORD_Q);
            vmax = _mm512_max_ps(v, vmax);
        }
        const float bm = _mm512_reduce_max_ps(vmax);
        if (!specviz_scan_block_max(bm, i, &m, &s, &block)) {
            continue; /* nothing finite yet, or +inf: the caller's non-finite path */
        }
        const __m512 vm = _mm512_set1_ps(m);
        __m512 acc = _mm512_setzero_ps();
        for (int64_t j = 0; j < full; j += SPECVIZ_LANES) {
            acc = _mm512_add_ps(acc, specviz_exp_nonpositive16(_mm512_sub_ps(_mm512_loadu_ps(x + i + j), vm)));
        }
        if (tail) {
            const __m512 v = _mm512_mask_loadu_ps(ninf, tail, x + i + full);
            acc = _mm512_mask_add_ps(acc, tail, acc, specviz_exp_nonpositive16(_mm512_sub_ps(v, vm)));
        }
        s += (double) _mm512_reduce_add_ps(acc);
    }
    specviz_scan_finish(x, m, s, block, best, out);
    return nan != 0;
}
#endif

/*
 * The same scan for CPUs with AVX2 and FMA but not AVX-512 (AMD's Zen 1-3, Intel's client cores): eight
 * float lanes a vector, two vectors a step, so that a block's sum keeps sixteen partial sums as the
 * other paths do. AVX2 has no masked loads of -inf nor scalef: the few values after a block's last whole
 * vector are read one by one (the float exponential above), and 2^n is built from the exponent bits.
 * One unordered comparison of the two vectors of a step finds a NaN in either. The compiler's x86-64-v3
 * build of the plain-C scan takes 1.3 times as long (see the top of the file).
 */
#if defined(__GNUC__) && defined(__x86_64__)
#define SPECVIZ_AVX2 __attribute__((target("avx2,fma")))

SPECVIZ_AVX2 static inline __m256 specviz_exp_nonpositive8f(__m256 x) {
    const __m256 xc = _mm256_max_ps(x, _mm256_set1_ps(SPECVIZ_EXPF_FLOOR)); /* NaN: the second operand */
    /* round(x / ln2) as the plain-C exponential takes it (no round instruction needed) */
    const __m256 shifted = _mm256_fmadd_ps(xc, _mm256_set1_ps(SPECVIZ_EXPF_LOG2E), _mm256_set1_ps(SPECVIZ_EXPF_SHIFT));
    const __m256 n = _mm256_sub_ps(shifted, _mm256_set1_ps(SPECVIZ_EXPF_SHIFT));
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(SPECVIZ_EXPF_LN2_HI), xc);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(SPECVIZ_EXPF_LN2_LO), r);
    const __m256 p = SPECVIZ_EXPF_POLY(_mm256_fmadd_ps, _mm256_set1_ps, r);
    const __m256i bits = /* 2^n from the low bits of the shifted value: n + 127 in the exponent field */
        _mm256_slli_epi32(_mm256_sub_epi32(_mm256_castps_si256(shifted), _mm256_set1_epi32(SPECVIZ_EXPF_SHIFT_BITS - 127)),
                          23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(bits)); /* p * 2^n, n in [-126, 0] */
}

SPECVIZ_AVX2 static inline float specviz_hmax8(__m256 v) {
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

SPECVIZ_AVX2 static inline float specviz_hsum8(__m256 v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

SPECVIZ_AVX2 int specviz_scan_avx2(const float * x, int64_t n, int64_t * best, double * out) {
    const __m256 ninf = _mm256_set1_ps(-__builtin_inff());
    int nan = 0;
    float m = -__builtin_inff();
    double s = 0.0;
    int64_t block = -1;
    for (int64_t i = 0; i < n; i += SPECVIZ_BLOCK) {
        const int64_t len = n - i < SPECVIZ_BLOCK ? n - i : SPECVIZ_BLOCK;
        const int64_t full = len & ~(int64_t) 7;
        const float * b = x + i;
        __m256 v0 = ninf, v1 = ninf, un = _mm256_setzero_ps();
        int64_t j = 0;
        for (; j + 16 <= full; j += 16) {
            const __m256 l0 = _mm256_loadu_ps(b + j), l1 = _mm256_loadu_ps(b + j + 8);
            un = _mm256_or_ps(un, _mm256_cmp_ps(l0, l1, _CMP_UNORD_Q)); /* a NaN in either */
            v0 = _mm256_max_ps(l0, v0); /* NaN in l0: v0 kept */
            v1 = _mm256_max_ps(l1, v1);
        }
        if (j < full) {
            const __m256 l0 = _mm256_loadu_ps(b + j);
            un = _mm256_or_ps(un, _mm256_cmp_ps(l0, l0, _CMP_UNORD_Q));
            v0 = _mm256_max_ps(l0, v0);
        }
        nan |= _mm256_movemask_ps(un) != 0;
        float bm = specviz_hmax8(_mm256_max_ps(v1, v0));
        for (int64_t q = full; q < len; ++q) {
            nan |= b[q] != b[q];
            bm = b[q] > bm ? b[q] : bm;
        }
        if (!specviz_scan_block_max(bm, i, &m, &s, &block)) {
            continue; /* nothing finite yet, or +inf: the caller's non-finite path */
        }
        const __m256 vm = _mm256_set1_ps(m);
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        for (j = 0; j + 16 <= full; j += 16) {
            a0 = _mm256_add_ps(a0, specviz_exp_nonpositive8f(_mm256_sub_ps(_mm256_loadu_ps(b + j), vm)));
            a1 = _mm256_add_ps(a1, specviz_exp_nonpositive8f(_mm256_sub_ps(_mm256_loadu_ps(b + j + 8), vm)));
        }
        if (j < full) {
            a0 = _mm256_add_ps(a0, specviz_exp_nonpositive8f(_mm256_sub_ps(_mm256_loadu_ps(b + j), vm)));
        }
        float t = specviz_hsum8(_mm256_add_ps(a0, a1));
        for (int64_t q = full; q < len; ++q) {
            t += specviz_exp_nonpositive(b[q] - m);
        }
        s += (double) t;
    }
    specviz_scan_finish(x, m, s, block, best, out);
    return nan;
}
#endif

/* Which hand-written scans this CPU runs: bit 0 AVX2 with FMA, bit 1 AVX-512F (the tests check every path
   the machine has against the plain-C one). */
int specviz_vector_paths(void) {
#if defined(__GNUC__) && defined(__x86_64__)
    return (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? 1 : 0) |
           (__builtin_cpu_supports("avx512f") ? 2 : 0);
#else
    return 0;
#endif
}

static int specviz_scan_one(const float * x, int64_t n, int64_t * best, double * out) {
#if defined(__GNUC__) && defined(__x86_64__)
    if (__builtin_cpu_supports("avx512f")) {
        return specviz_scan_avx512(x, n, best, out);
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        return specviz_scan_avx2(x, n, best, out);
    }
#endif
    return specviz_scan_generic(x, n, best, out);
}

/*
 * With OpenMP (libgomp, which llama.cpp's CPU backend already runs in the process) a long row is cut into
 * one piece per thread, up to SPECVIZ_SCAN_THREADS: each piece is scanned as above, then the pieces are
 * joined in order: the maximum is the largest piece maximum (the earliest piece among equals, so the
 * first maximum still wins), the sum is the pieces' sums each rescaled to it (in double). The row scan
 * runs between llama.cpp's decodes, when its worker threads have nothing to do (they are still waiting
 * for the next graph), so the other cores are free. Rows shorter than SPECVIZ_SCAN_SPLIT are scanned
 * on the calling thread: below it starting the team costs more than it saves.
 *
 * The cap on the pieces is SPECVIZ_SCAN_THREADS unless specviz_set_scan_threads changes it (up to
 * SPECVIZ_SCAN_THREADS_MAX, the size of the join's arrays). 8, because on a 16-core GPU host, where the
 * rows arrive from the device in host memory, 8 threads read a 262k-token row fastest (0.034 ms, against
 * 0.049 with 4 and 0.063 with 16) and a round's several rows in about half the time 4 take. OpenMP's
 * thread count caps it too, so a host with fewer cores uses them all.
 */
#define SPECVIZ_SCAN_THREADS 8
#define SPECVIZ_SCAN_THREADS_MAX 16
#define SPECVIZ_SCAN_SPLIT 65536

#ifdef _OPENMP
#include <omp.h>
#endif

static int specviz_scan_cap = SPECVIZ_SCAN_THREADS;

int specviz_set_scan_threads(int cap) {
    specviz_scan_cap = cap < 1 ? 1 : (cap > SPECVIZ_SCAN_THREADS_MAX ? SPECVIZ_SCAN_THREADS_MAX : cap);
    return specviz_scan_cap;
}

int specviz_default_scan_threads(void) {
    return SPECVIZ_SCAN_THREADS;
}

int specviz_scan_threads(void) {
#ifdef _OPENMP
    const int t = omp_get_max_threads();
    return t < specviz_scan_cap ? t : specviz_scan_cap;
#else
    return 1;
#endif
}

int specviz_scan(const float * x, int64_t n, int64_t * best, double * out) {
    const int t = n >= SPECVIZ_SCAN_SPLIT ? specviz_scan_threads() : 1;
    if (t <= 1) {
        return specviz_scan_one(x, n, best, out);
    }
    int64_t bests[SPECVIZ_SCAN_THREADS_MAX];
    double outs[SPECVIZ_SCAN_THREADS_MAX][2];
    int nans[SPECVIZ_SCAN_THREADS_MAX];
    /* pieces of whole blocks, so that every piece but the last sums full blocks as one pass would */
    const int64_t blocks = (n + SPECVIZ_BLOCK - 1) / SPECVIZ_BLOCK;
    const int64_t per = (blocks + t - 1) / t * SPECVIZ_BLOCK;
#ifdef _OPENMP
#pragma omp parallel for num_threads(t) schedule(static, 1)
#endif
    for (int c = 0; c < t; ++c) {
        const int64_t lo = c * per < n ? c * per : n;
        const int64_t hi = lo + per < n ? lo + per : n;
        bests[c] = 0;
        outs[c][0] = -__builtin_inf();
        outs[c][1] = 0.0;
        nans[c] = hi > lo ? specviz_scan_one(x + lo, hi - lo, &bests[c], outs[c]) : 0;
        bests[c] += lo;
    }
    int nan = 0;
    double m = -__builtin_inf();
    int64_t at = 0;
    for (int c = 0; c < t; ++c) {
        nan |= nans[c];
        if (outs[c][0] > m) { /* strictly: an equal maximum in a later piece is not the first */
            m = outs[c][0];
            at = bests[c];
        }
    }
    double z = 0.0;
    if (m > -__builtin_inf() && m < __builtin_inf()) {
        for (int c = 0; c < t; ++c) {
            if (outs[c][0] > -__builtin_inf()) {
                z += outs[c][1] * specviz_exp_nonpositive_d(outs[c][0] - m);
            }
        }
    }
    *best = at;
    out[0] = m;
    out[1] = z;
    return nan;
}

/*
 * The rejection row's two questions, each one pass over a row without NaN (the acceptor's rows are
 * NaN-free by then): the k most likely tokens (the alternatives shown for a rejection) and the rejected
 * draft token's rank. numpy answers each with comparisons into vocabulary-sized arrays and passes over
 * them; here each is one read of the row and no array.
 *
 * specviz_topk: the indices of the k largest values, largest first, ties to the lower index (k <= n,
 * k <= SPECVIZ_TOPK_MAX), written to out. The k best so far are kept sorted; a value enters only when it
 * beats the k-th strictly (the row is read in index order, so an equal later value ranks after), which
 * after the first few thousand values almost never happens: the pass counts, group by group of
 * SPECVIZ_TOPK_GROUP values, those above the k-th (a count vectorises), and walks a group only when one is.
 * specviz_rank: 1 + #{i : x[i] > x[t]} + #{i < t : x[i] == x[t]} (ties go to the lower id).
 * One build each (plain C, cloned by the compiler); the _generic names are the same passes, kept because
 * the tests call every build by name.
 */
#define SPECVIZ_TOPK_MAX 64
#define SPECVIZ_TOPK_GROUP 64

static inline void specviz_topk_insert(float * val, int64_t * idx, int64_t k, float v, int64_t i) {
    int64_t p = k - 1;
    while (p > 0 && val[p - 1] < v) { /* strictly: an equal value found earlier stays ahead */
        val[p] = val[p - 1];
        idx[p] = idx[p - 1];
        --p;
    }
    val[p] = v;
    idx[p] = i;
}

static int64_t specviz_topk_fill(const float * x, int64_t k, float * val, int64_t * idx) {
    for (int64_t j = 0; j < k; ++j) { /* the first k values, sorted (insertion into a growing list) */
        int64_t p = j;
        while (p > 0 && val[p - 1] < x[j]) {
            val[p] = val[p - 1];
            idx[p] = idx[p - 1];
            --p;
        }
        val[p] = x[j];
        idx[p] = j;
    }
    return k;
}

SPECVIZ_CLONES
int64_t specviz_topk_generic(const float * x, int64_t n, int64_t k, int64_t * out) {
    float val[SPECVIZ_TOPK_MAX];
    if (k < 1 || k > SPECVIZ_TOPK_MAX || k > n) {
        return -1;
    }
    int64_t i = specviz_topk_fill(x, k, val, out);
    for (; i + SPECVIZ_TOPK_GROUP <= n; i += SPECVIZ_TOPK_GROUP) {
        const float kth = val[k - 1];
        int32_t enter = 0;
        for (int j = 0; j < SPECVIZ_TOPK_GROUP; ++j) { /* a count, so that it vectorises: does any enter? */
            enter += x[i + j] > kth;
        }
        for (int j = 0; enter != 0 && j < SPECVIZ_TOPK_GROUP; ++j) { /* in index order; the k-th moves up */
            if (x[i + j] > val[k - 1]) {
                specviz_topk_insert(val, out, k, x[i + j], i + j);
            }
        }
    }
    for (; i < n; ++i) {
        if (x[i] > val[k - 1]) {
            specviz_topk_insert(val, out, k, x[i], i);
        }
    }
    return k;
}

/* x[i] > v, or x[i] == v before t, is x[i] >= v before t (NaN: neither). */
SPECVIZ_CLONES
int64_t specviz_rank_generic(const float * x, int64_t n, int64_t t) {
    const float v = x[t];
    int64_t above = 0;
    for (int64_t lo = 0; lo < n; lo += SPECVIZ_BLOCK) { /* 32-bit counts a block: twice the lanes of 64-bit */
        const int64_t hi = lo + SPECVIZ_BLOCK < n ? lo + SPECVIZ_BLOCK : n;
        int32_t c = 0;
        for (int64_t i = lo; i < hi; ++i) {
            c += i < t ? x[i] >= v : x[i] > v;
        }
        above += c;
    }
    return above + 1;
}

int64_t specviz_topk(const float * x, int64_t n, int64_t k, int64_t * out) {
    return specviz_topk_generic(x, n, k, out);
}

int64_t specviz_rank(const float * x, int64_t n, int64_t t) {
    return specviz_rank_generic(x, n, t);
}

/*
 * specviz_verify_greedy: a whole greedy verification in one call, for the acceptor's rows as llama.cpp
 * hands them out (row(ctx, i) is llama_get_logits_ith, whose address Python passes in; the shim links
 * against nothing). Row i is read only when rows 0 ... i-1 all agreed with the draft, exactly as the
 * acceptor reads them, and each row is scanned by specviz_scan as above; at the first row whose choice
 * differs from the draft token, that row's top_n tokens (specviz_topk) and the draft token's rank
 * (read off the top tokens when it is among them, else specviz_rank) are taken too.
 *
 * Why C: read from Python, each row is a call chain (a numpy view of the row, the scan's wrapper, a
 * result tuple, the probability), and right after a decode every one of those objects and code paths is
 * out of the caches, which costs more than the Python itself. Here a round is one call, and the Python
 * side builds the verdict from plain numbers with the numpy reference's arithmetic.
 *
 * Outputs (the caller sizes them for k + 1 rows and top_n tokens):
 *   ibuf[j]              the first maximum of row j, for the rows read (j < return value)
 *   ibuf[k+1 ... +top_n] the rejection row's top tokens, best first; ibuf[k+1+top_n] the draft token's rank
 *   dbuf[3j ... 3j+2]    row j's maximum, its sum(exp(x - max)) and x[best] as double
 *   dbuf[3(k+1)]         the rejection row's value at the draft token; then the top tokens' values
 * Returns the rows read (k + 1 when every draft token was the target's choice, else the rejection row
 * plus one), or a negative code for a round the caller must redo on its own path, which gives the verdict
 * this call would have: -1 a row llama.cpp has no logits for, -2 a row holding a NaN, -3 a row
 * whose maximum is not finite, -4 a draft token outside the vocabulary, -5 top_n outside 1 ... min(n, 64).
 */
typedef const float * (*specviz_row_fn)(void * ctx, int32_t i);

int64_t specviz_verify_greedy(specviz_row_fn row, void * ctx, int64_t n, const int64_t * draft, int64_t k,
                              int64_t top_n, int64_t * ibuf, double * dbuf) {
    if (top_n < 1 || top_n > SPECVIZ_TOPK_MAX || top_n > n) {
        return -5;
    }
    for (int64_t i = 0; i < k; ++i) {
        if (draft[i] < 0 || draft[i] >= n) {
            return -4;
        }
    }
    for (int64_t i = 0; i <= k; ++i) {
        const float * x = row(ctx, (int32_t) i);
        if (x == NULL) {
            return -1;
        }
        int64_t best = 0;
        double out[2];
        if (specviz_scan(x, n, &best, out)) {
            return -2;
        }
        if (!(out[0] > -__builtin_inf() && out[0] < __builtin_inf())) {
            return -3;
        }
        ibuf[i] = best;
        dbuf[3 * i] = out[0];
        dbuf[3 * i + 1] = out[1];
        dbuf[3 * i + 2] = (double) x[best];
        if (i == k || best != draft[i]) {
            if (i < k) {
                const int64_t d = draft[i];
                int64_t * alts = ibuf + k + 1;
                specviz_topk(x, n, top_n, alts);
                int64_t rk = 0;
                for (int64_t j = 0; j < top_n && rk == 0; ++j) {
                    rk = alts[j] == d ? j + 1 : 0;
                }
                ibuf[k + 1 + top_n] = rk != 0 ? rk : specviz_rank(x, n, d);
                dbuf[3 * (k + 1)] = (double) x[d];
                for (int64_t j = 0; j < top_n; ++j) {
                    dbuf[3 * (k + 1) + 1 + j] = (double) x[alts[j]];
                }
            }
            return i + 1;
        }
    }
    return k + 1; /* not reached: row k always returns above */
}

/*
 * Sampled decoding: the tempered softmax of a row, p_i = exp((x_i - m) / T) / Z, read in place. The
 * acceptor needs of a row only p at a few tokens (the draft token's, the committed token's), one draw
 * from p (the bonus) or from p without the draft token (the correction under the point-mass rule), and
 * at a rejection the top tokens and a rank (specviz_topk and specviz_rank above: the tempered softmax
 * orders tokens as the logits do). numpy builds the whole distribution in float64 (a copy, a subtraction,
 * a division, the exponentials, a sum, a normalisation) and a draw a cumulative sum over it: about 3 ms a
 * row for the embedded model's 262 144 tokens. Here a row costs one pass for its maximum and one for the
 * sums, and a draw costs one block.
 *
 * specviz_tempered(x, n, inv_t, skip, out, blocks): the maximum m (NaN skipped), then every term
 * e_i = exp((x_i - m) * inv_t) in double, summed per block of SPECVIZ_BLOCK tokens into blocks[b] with the
 * token `skip` left out (-1: none). out[0] = m, out[1] = Z (every term), out[2] = the sum without `skip`,
 * added from the blocks in order, so that the residual's mass is a sum of its own terms and not Z less
 * a term near Z. Returns 1 when the row holds a NaN (the caller takes its NaN-aware path), else 0; with a
 * non-finite maximum out[1] and out[2] are 0 and the blocks are not written. `generic`: one thread.
 *
 * specviz_tempered_pick(x, n, m, inv_t, skip, target, blocks): the inverse of the cumulative sum, as
 * numpy's searchsorted(cumsum, target, side="right") reads it: the first token i (not `skip`) whose
 * running sum of terms exceeds `target` (the caller passes u times out[2]). Whole blocks are skipped by
 * their sums, in the order specviz_tempered added them; the block that crosses is walked term by term.
 * When rounding leaves the target unreached, the last token with a non-zero term (numpy's clamp to the
 * last entry with mass). -1 when no token but `skip` has mass.
 */
/* The maximum of x[0 .. n) with NaN skipped (-inf when there is none); *nan set when a NaN was seen. */
SPECVIZ_CLONES
static float specviz_max_generic(const float * x, int64_t n, int * nan) {
    float m = -__builtin_inff();
    for (int64_t i = 0; i < n; i += SPECVIZ_BLOCK) {
        m = specviz_max_above(x + i, n - i < SPECVIZ_BLOCK ? n - i : SPECVIZ_BLOCK, m, nan);
    }
    return m;
}

/* blocks[b] for the blocks b_lo .. b_hi - 1: each block's terms exp((x_i - m) * inv_t), `skip` left out.
   Sixteen running sums a block, so that the loop vectorises without reordering any sum. */
SPECVIZ_CLONES
static void specviz_block_sums_generic(const float * x, int64_t n, double m, double inv_t, int64_t skip,
                                       int64_t b_lo, int64_t b_hi, double * blocks) {
    for (int64_t b = b_lo; b < b_hi; ++b) {
        const int64_t lo = b * SPECVIZ_BLOCK;
        const int64_t hi = lo + SPECVIZ_BLOCK < n ? lo + SPECVIZ_BLOCK : n;
        double acc[SPECVIZ_LANES] = {0};
        int64_t i = lo;
        for (; i + SPECVIZ_LANES <= hi; i += SPECVIZ_LANES) {
            for (int l = 0; l < SPECVIZ_LANES; ++l) {
                const double e = specviz_exp_nonpositive_d(((double) x[i + l] - m) * inv_t);
                acc[l] += i + l == skip ? 0.0 : e;
            }
        }
        for (; i < hi; ++i) {
            const double e = specviz_exp_nonpositive_d(((double) x[i] - m) * inv_t);
            acc[(i - lo) & (SPECVIZ_LANES - 1)] += i == skip ? 0.0 : e;
        }
        blocks[b] = specviz_lanes_sum(acc);
    }
}

/* As specviz_scan, a long row is cut into pieces of whole blocks, one per thread; the pieces' maxima are
   joined, then each piece writes its own blocks' sums, which are added in block order on this thread (the
   order specviz_tempered_pick walks them). `generic`: on one thread (the tests compare the two; the sums
   do not depend on it). */
static int specviz_tempered_in(const float * x, int64_t n, double inv_t, int64_t skip, double * out,
                               double * blocks, int generic) {
    const int t = n >= SPECVIZ_SCAN_SPLIT && !generic ? specviz_scan_threads() : 1;
    const int64_t nb = (n + SPECVIZ_BLOCK - 1) / SPECVIZ_BLOCK;
    const int64_t per = (nb + t - 1) / t; /* blocks a piece */
    int nans[SPECVIZ_SCAN_THREADS_MAX] = {0};
    float maxima[SPECVIZ_SCAN_THREADS_MAX];
#ifdef _OPENMP
#pragma omp parallel for num_threads(t) schedule(static, 1) if (t > 1)
#endif
    for (int c = 0; c < t; ++c) {
        const int64_t lo = c * per * SPECVIZ_BLOCK < n ? c * per * SPECVIZ_BLOCK : n;
        const int64_t hi = lo + per * SPECVIZ_BLOCK < n ? lo + per * SPECVIZ_BLOCK : n;
        maxima[c] = specviz_max_generic(x + lo, hi - lo, &nans[c]);
    }
    int nan = 0;
    float m = -__builtin_inff();
    for (int c = 0; c < t; ++c) {
        nan |= nans[c];
        m = maxima[c] > m ? maxima[c] : m;
    }
    out[0] = m;
    out[1] = out[2] = 0.0;
    if (!(m > -__builtin_inff() && m < __builtin_inff())) {
        return nan;
    }
#ifdef _OPENMP
#pragma omp parallel for num_threads(t) schedule(static, 1) if (t > 1)
#endif
    for (int c = 0; c < t; ++c) {
        const int64_t b_lo = c * per < nb ? c * per : nb;
        const int64_t b_hi = b_lo + per < nb ? b_lo + per : nb;
        specviz_block_sums_generic(x, n, (double) m, inv_t, skip, b_lo, b_hi, blocks);
    }
    double total = 0.0;
    for (int64_t b = 0; b < nb; ++b) {
        total += blocks[b];
    }
    out[2] = total;
    out[1] = skip >= 0 && skip < n ? total + specviz_exp_nonpositive_d(((double) x[skip] - (double) m) * inv_t)
                                   : total;
    return nan;
}

int specviz_tempered(const float * x, int64_t n, double inv_t, int64_t skip, double * out, double * blocks,
                     int generic) {
    return specviz_tempered_in(x, n, inv_t, skip, out, blocks, generic);
}

/* What a draw walks: the terms of a tempered row (`xq` NULL: exp((x_i - m) * inv_t), 0 for `skip`) or of a
   draft model's residual (below: max(0, p_i - q_i), p from x, q from xq). One walk for both. */
typedef struct {
    const float * x;
    const float * xq;
    double m, z, mq, zq, inv_t;
    int64_t skip;
} specviz_terms;

static inline double specviz_residual_term(float xp, float xq, double mp, double zp, double mq, double zq,
                                           double inv_t);

static inline double specviz_term(const specviz_terms * t, int64_t i) {
    if (t->xq != NULL) {
        return specviz_residual_term(t->x[i], t->xq[i], t->m, t->z, t->mq, t->zq, t->inv_t);
    }
    return i == t->skip ? 0.0 : specviz_exp_nonpositive_d(((double) t->x[i] - t->m) * t->inv_t);
}

/* The inverse of the running sum of the terms, as numpy's searchsorted(cumsum, target, side="right") reads
   it: whole blocks are skipped by their sums (added in the order they were summed), the block that
   crosses is walked term by term; when rounding leaves the target unreached, the last token with a
   non-zero term; -1 when no term is. */
static int64_t specviz_walk(const specviz_terms * t, int64_t n, double target, const double * blocks) {
    double acc = 0.0;
    for (int64_t b = 0; b * SPECVIZ_BLOCK < n; ++b) {
        if (!(acc + blocks[b] > target)) {
            acc += blocks[b];
            continue;
        }
        const int64_t lo = b * SPECVIZ_BLOCK;
        const int64_t hi = lo + SPECVIZ_BLOCK < n ? lo + SPECVIZ_BLOCK : n;
        for (int64_t i = lo; i < hi; ++i) {
            acc += specviz_term(t, i);
            if (acc > target) {
                return i;
            }
        }
        /* the block's terms, added one by one, fell just short of its sum: go on from here */
    }
    for (int64_t i = n - 1; i >= 0; --i) {
        if (specviz_term(t, i) > 0.0) {
            return i;
        }
    }
    return -1;
}

int64_t specviz_tempered_pick(const float * x, int64_t n, double m, double inv_t, int64_t skip, double target,
                              const double * blocks) {
    const specviz_terms t = {x, NULL, m, 1.0, 0.0, 1.0, inv_t, skip};
    return specviz_walk(&t, n, target, blocks);
}

/*
 * A draft model's residual: when a sampled draft token is rejected, the correction is drawn from
 * max(0, p_i - q_i) normalised, where p is the target's tempered row (maximum mp, sum zp) and q the draft's
 * (mq, zq), both p_i = exp((x_i - m) * inv_t) / z as above, in double. specviz_residual writes the per-block
 * sums of the residual's terms into blocks and returns their sum (added in block order);
 * specviz_residual_pick walks them as specviz_tempered_pick walks a row's: the first token whose running
 * sum of terms exceeds target, else the last token with a non-zero term, else -1 (no mass: the caller
 * draws from p, as numpy's residual does). `generic` changes nothing (one build).
 */
static inline double specviz_residual_term(float xp, float xq, double mp, double zp, double mq, double zq,
                                           double inv_t) {
    const double p = specviz_exp_nonpositive_d(((double) xp - mp) * inv_t) / zp;
    const double q = specviz_exp_nonpositive_d(((double) xq - mq) * inv_t) / zq;
    return p > q ? p - q : 0.0;
}

SPECVIZ_CLONES
static void specviz_residual_sums_generic(const float * xp, const float * xq, int64_t n, double mp, double zp,
                                          double mq, double zq, double inv_t, double * blocks) {
    for (int64_t b = 0; b * SPECVIZ_BLOCK < n; ++b) {
        const int64_t lo = b * SPECVIZ_BLOCK;
        const int64_t hi = lo + SPECVIZ_BLOCK < n ? lo + SPECVIZ_BLOCK : n;
        double acc[SPECVIZ_LANES] = {0};
        int64_t i = lo;
        for (; i + SPECVIZ_LANES <= hi; i += SPECVIZ_LANES) {
            for (int l = 0; l < SPECVIZ_LANES; ++l) {
                acc[l] += specviz_residual_term(xp[i + l], xq[i + l], mp, zp, mq, zq, inv_t);
            }
        }
        for (; i < hi; ++i) {
            acc[(i - lo) & (SPECVIZ_LANES - 1)] += specviz_residual_term(xp[i], xq[i], mp, zp, mq, zq, inv_t);
        }
        blocks[b] = specviz_lanes_sum(acc);
    }
}

double specviz_residual(const float * xp, const float * xq, int64_t n, double mp, double zp, double mq, double zq,
                        double inv_t, double * blocks, int generic) {
    (void) generic; /* one build: the flag stays for the callers */
    specviz_residual_sums_generic(xp, xq, n, mp, zp, mq, zq, inv_t, blocks);
    double total = 0.0;
    for (int64_t b = 0; b * SPECVIZ_BLOCK < n; ++b) {
        total += blocks[b];
    }
    return total;
}

int64_t specviz_residual_pick(const float * xp, const float * xq, int64_t n, double mp, double zp, double mq,
                              double zq, double inv_t, double target, const double * blocks) {
    const specviz_terms t = {xp, xq, mp, zp, mq, zq, inv_t, -1};
    return specviz_walk(&t, n, target, blocks);
}

/*
 * Top-p (the nucleus) of a tempered row, without building the distribution: the nucleus is the smallest
 * set of most probable tokens whose mass reaches top_p, so it is the tokens at or above some logit, and
 * only where that logit lies is needed. specviz_nucleus_mass files every token by its distance below the
 * maximum, d_i = (m - x_i) * inv_t (its term is exp(-d_i)), into buckets of `width`:
 * mass[b] += exp(-d_i) for floor(d_i / width) = b < nb (tokens further down, -inf and NaN are left out)
 * and returns how many tokens it filed. The caller reads the buckets' running mass to the bucket that
 * reaches top_p times Z, and sorts only that bucket's tokens (sampling.py; it checks their exact mass, so
 * that a bucket's rounding can only cost a fallback, never a wrong nucleus).
 *
 * A block's buckets and terms are computed first, in a loop that vectorises; the tokens filed are then
 * listed without a branch (which a row's mix of filed and unfiled tokens would mispredict) and added in
 * double one by one. `mass` is zeroed here; `generic` changes nothing (one build).
 */
SPECVIZ_CLONES
static int64_t specviz_nucleus_mass_generic(const float * x, int64_t n, double m, double inv_t, double inv_w,
                                            int64_t nb, double * mass) {
    double us[SPECVIZ_BLOCK], terms[SPECVIZ_BLOCK];
    int64_t filed = 0;
    for (int64_t lo = 0; lo < n; lo += SPECVIZ_BLOCK) {
        const int64_t len = n - lo < SPECVIZ_BLOCK ? n - lo : SPECVIZ_BLOCK;
        for (int64_t j = 0; j < len; ++j) { /* a block's buckets and terms first: this loop vectorises */
            const double d = (m - (double) x[lo + j]) * inv_t;
            us[j] = d * inv_w;
            terms[j] = specviz_exp_nonpositive_d(-d);
        }
        int32_t in[SPECVIZ_BLOCK];
        int64_t count = 0;
        for (int64_t j = 0; j < len; ++j) { /* the tokens filed: not NaN, +inf (an -inf logit) or the far tail */
            in[count] = (int32_t) j; /* written always, kept when counted: no branch to mispredict */
            count += us[j] < (double) nb;
        }
        for (int64_t c = 0; c < count; ++c) {
            mass[(int64_t) us[in[c]]] += terms[in[c]];
        }
        filed += count;
    }
    return filed;
}

int64_t specviz_nucleus_mass(const float * x, int64_t n, double m, double inv_t, double width, int64_t nb,
                             double * mass, int generic) {
    memset(mass, 0, (size_t) nb * sizeof *mass);
    const double inv_w = 1.0 / width;
    (void) generic; /* one build: the flag stays for the callers */
    return specviz_nucleus_mass_generic(x, n, m, inv_t, inv_w, nb, mass);
}
