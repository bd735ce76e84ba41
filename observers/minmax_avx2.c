/* Min/max kernel family, AVX2 (observers/minmax_dsp.h; built with -mavx2 -mfma).
 *
 * Exact step: one AND + integer compare per vector classifies 8 lanes (exponent bits all
 * ones). Non-finite lanes become an all-ones NaN, and vminps(a, b) returns its second
 * operand b when either is NaN, with the accumulator as b, so a NaN lane never replaces
 * the accumulator. The flat kernel runs a lighter fast pass per block and redoes only a
 * block that holds a non-finite value with the exact step (fast_block below). Four
 * independent accumulators hide the min/max latency. */
#include <immintrin.h>
#include <math.h>
#include <stdbool.h>

#include "observers/minmax_dsp.h"

/* Floats per block of the fast pass (4 KiB: a block that has to be redone is still in L1;
 * a per-channel row of 4096 floats is four blocks). A multiple of 32. */
#define BLOCK 1024

/* No software prefetch here, unlike the AVX-512 kernel: on the AVX2-only machines this
 * kernel runs on, one prefetch per 4 KiB page ahead made a 64 MiB pass slower; the hardware
 * prefetchers do better alone (docs/performance.md, "Min/max at the memory limit"). */

static inline void step(__m256 a, __m256i expm, __m256 *lo, __m256 *hi, __m256i *cnt)
{
    __m256i bad = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(a), expm), expm);
    __m256 y = _mm256_or_ps(a, _mm256_castsi256_ps(bad));   /* non-finite -> NaN */
    *lo = _mm256_min_ps(y, *lo);                            /* NaN y -> keeps *lo */
    *hi = _mm256_max_ps(y, *hi);
    *cnt = _mm256_sub_epi32(*cnt, bad);
}

static uint64_t hsum(__m256i c)
{
    uint32_t t[8];
    _mm256_storeu_si256((__m256i *)t, c);
    uint64_t s = 0;
    for (int i = 0; i < 8; i++)
        s += t[i];
    return s;
}

/* The accumulators: vector k of every 32 floats folds into l[k] / h[k]. */
typedef struct acc4 {
    __m256 l0, l1, l2, l3, h0, h1, h2, h3;
} acc4;

/* Exact pass over x[0..n), n a multiple of 32 and at most BLOCK (the int32 lane counters
 * cannot overflow); returns the number of non-finite values. */
static inline uint64_t exact32(const float *x, int64_t n, acc4 *a)
{
    const __m256i expm = _mm256_set1_epi32((int)QCAL_F32_EXP_MASK);
    __m256i c0 = _mm256_setzero_si256(), c1 = c0, c2 = c0, c3 = c0;
    for (int64_t i = 0; i < n; i += 32) {
        step(_mm256_loadu_ps(x + i), expm, &a->l0, &a->h0, &c0);
        step(_mm256_loadu_ps(x + i + 8), expm, &a->l1, &a->h1, &c1);
        step(_mm256_loadu_ps(x + i + 16), expm, &a->l2, &a->h2, &c2);
        step(_mm256_loadu_ps(x + i + 24), expm, &a->l3, &a->h3, &c3);
    }
    return hsum(_mm256_add_epi32(_mm256_add_epi32(c0, c1), _mm256_add_epi32(c2, c3)));
}

/* Fast pass over one block of BLOCK floats: plain vminps/vmaxps (the value first, the
 * accumulator second, as in step()) and one FMA per vector, f = a * 0 + f, which stays 0 for
 * finite lanes and turns into a sticky NaN at a NaN or +-Inf lane. Folds the block into *a
 * and returns true, or returns false with *a untouched when the block holds a non-finite
 * value; on a block without one, step() would do the same vminps/vmaxps in the same order,
 * so the bits do not depend on which pass ran (the gain over the exact step alone:
 * docs/performance.md, "Min/max at the memory limit"). */
static inline bool fast_block(const float *x, acc4 *a)
{
    const __m256 z = _mm256_setzero_ps();
    __m256 l0 = a->l0, l1 = a->l1, l2 = a->l2, l3 = a->l3;
    __m256 h0 = a->h0, h1 = a->h1, h2 = a->h2, h3 = a->h3;
    __m256 f0 = z, f1 = z, f2 = z, f3 = z;
    for (int64_t i = 0; i < BLOCK; i += 32) {
        __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
        __m256 v2 = _mm256_loadu_ps(x + i + 16), v3 = _mm256_loadu_ps(x + i + 24);
        l0 = _mm256_min_ps(v0, l0);
        h0 = _mm256_max_ps(v0, h0);
        f0 = _mm256_fmadd_ps(v0, z, f0);
        l1 = _mm256_min_ps(v1, l1);
        h1 = _mm256_max_ps(v1, h1);
        f1 = _mm256_fmadd_ps(v1, z, f1);
        l2 = _mm256_min_ps(v2, l2);
        h2 = _mm256_max_ps(v2, h2);
        f2 = _mm256_fmadd_ps(v2, z, f2);
        l3 = _mm256_min_ps(v3, l3);
        h3 = _mm256_max_ps(v3, h3);
        f3 = _mm256_fmadd_ps(v3, z, f3);
    }
    __m256 f = _mm256_add_ps(_mm256_add_ps(f0, f1), _mm256_add_ps(f2, f3));
    if (_mm256_movemask_ps(_mm256_cmp_ps(f, f, _CMP_UNORD_Q)))
        return false;
    a->l0 = l0, a->l1 = l1, a->l2 = l2, a->l3 = l3;
    a->h0 = h0, a->h1 = h1, a->h2 = h2, a->h3 = h3;
    return true;
}

void qcal_f32_minmax__avx2(const float *x, int64_t n, float *mn, float *mx,
                           uint64_t *nonfinite)
{
    const __m256 pinf = _mm256_set1_ps(INFINITY), ninf = _mm256_set1_ps(-INFINITY);
    acc4 a = { pinf, pinf, pinf, pinf, ninf, ninf, ninf, ninf };
    uint64_t bad = 0;
    int64_t i = 0;
    for (; i + BLOCK <= n; i += BLOCK)
        if (!fast_block(x + i, &a))
            bad += exact32(x + i, BLOCK, &a);
    int64_t m = (n - i) & ~(int64_t)31;
    bad += exact32(x + i, m, &a);
    i += m;
    __m256 l0 = _mm256_min_ps(_mm256_min_ps(a.l0, a.l1), _mm256_min_ps(a.l2, a.l3));
    __m256 h0 = _mm256_max_ps(_mm256_max_ps(a.h0, a.h1), _mm256_max_ps(a.h2, a.h3));
    float lt[8], ht[8];
    _mm256_storeu_ps(lt, l0);
    _mm256_storeu_ps(ht, h0);
    float lo, hi;
    uint64_t tb;
    qcal_f32_minmax__c(x + i, n - i, &lo, &hi, &tb);
    for (int k = 0; k < 8; k++) {
        lo = lt[k] < lo ? lt[k] : lo;
        hi = ht[k] > hi ? ht[k] : hi;
    }
    *mn = lo;
    *mx = hi;
    *nonfinite = bad + tb;
}

/* Wide rows (the running columns cmn + cmx fill a 32 KiB L1 at width 4096) go four at a
 * time: each column vector is loaded and stored once per four rows, and the four row
 * streams (in different pages) stay sequential. Narrower rows go one by one, in memory
 * order (four rows inside one page defeat the prefetcher: 2x slower at width 256).
 * Either way every column folds its rows in order. */
#define ROWS4_MIN_WIDTH 4096
void qcal_f32_minmax_cols__avx2(const float *x, int64_t rows, int64_t width, float *cmn,
                                float *cmx, uint64_t *nonfinite)
{
    const __m256i expm = _mm256_set1_epi32((int)QCAL_F32_EXP_MASK);
    uint64_t bad = 0;
    int64_t r = 0;
    for (; width >= ROWS4_MIN_WIDTH && r + 4 <= rows; r += 4) {
        const float *r0 = x + r * width, *r1 = r0 + width, *r2 = r1 + width, *r3 = r2 + width;
        __m256i cnt = _mm256_setzero_si256();
        int64_t j = 0;
        for (; j + 8 <= width; j += 8) {
            __m256 lo = _mm256_loadu_ps(cmn + j), hi = _mm256_loadu_ps(cmx + j);
            step(_mm256_loadu_ps(r0 + j), expm, &lo, &hi, &cnt);
            step(_mm256_loadu_ps(r1 + j), expm, &lo, &hi, &cnt);
            step(_mm256_loadu_ps(r2 + j), expm, &lo, &hi, &cnt);
            step(_mm256_loadu_ps(r3 + j), expm, &lo, &hi, &cnt);
            _mm256_storeu_ps(cmn + j, lo);
            _mm256_storeu_ps(cmx + j, hi);
        }
        bad += hsum(cnt);
        if (j < width)
            for (int k = 0; k < 4; k++)
                qcal_f32_minmax_cols__c(r0 + k * width + j, 1, width - j, cmn + j, cmx + j,
                                        &bad);
    }
    for (; r < rows; r++) {
        const float *row = x + r * width;
        __m256i cnt = _mm256_setzero_si256();
        int64_t j = 0;
        for (; j + 8 <= width; j += 8) {
            __m256 lo = _mm256_loadu_ps(cmn + j), hi = _mm256_loadu_ps(cmx + j);
            step(_mm256_loadu_ps(row + j), expm, &lo, &hi, &cnt);
            _mm256_storeu_ps(cmn + j, lo);
            _mm256_storeu_ps(cmx + j, hi);
        }
        bad += hsum(cnt);
        if (j < width)
            qcal_f32_minmax_cols__c(row + j, 1, width - j, cmn + j, cmx + j, &bad);
    }
    *nonfinite += bad;
}

void qcal_minmax_dsp_init_avx2(qcal_minmax_dsp *dsp)
{
    dsp->minmax = qcal_f32_minmax__avx2;
    dsp->minmax_cols = qcal_f32_minmax_cols__avx2;
}
