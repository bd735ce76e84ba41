/* Min/max kernel family, AVX2 (observers/minmax_dsp.h; built with -mavx2 -mfma).
 *
 * Non-finite test: one AND + integer compare per vector classifies 8 lanes (exponent bits
 * all ones). Non-finite lanes become an all-ones NaN, and vminps(a, b) returns its second
 * operand b when either is NaN, with the accumulator as b, so a NaN lane never replaces
 * the accumulator. Four independent accumulators hide the min/max latency. */
#include <immintrin.h>
#include <math.h>

#include "observers/minmax_dsp.h"

/* Lane counters are int32: flush them to 64 bits at least every 2^28 vectors. */
#define FLUSH_ELEMS ((int64_t)1 << 30)

/* Every 1024 floats (one 4 KiB page) the flat kernel prefetches one line this far ahead, as
 * the AVX-512 kernel does (see minmax_avx512.c): the page's TLB walk and first miss are
 * then done before the loads get there. Prefetches never fault (the address past the end
 * of x is formed as an integer). */
#define PREFETCH_BYTES (64 * 1024)

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

void qcal_f32_minmax__avx2(const float *x, int64_t n, float *mn, float *mx,
                           uint64_t *nonfinite)
{
    const __m256i expm = _mm256_set1_epi32((int)QCAL_F32_EXP_MASK);
    __m256 l0 = _mm256_set1_ps(INFINITY), l1 = l0, l2 = l0, l3 = l0;
    __m256 h0 = _mm256_set1_ps(-INFINITY), h1 = h0, h2 = h0, h3 = h0;
    uint64_t bad = 0;
    int64_t i = 0;
    while (i + 32 <= n) {
        int64_t end = n - i > FLUSH_ELEMS ? i + FLUSH_ELEMS : n;
        __m256i c0 = _mm256_setzero_si256(), c1 = c0, c2 = c0, c3 = c0;
        for (; i + 32 <= end; i += 32) {
            if ((i & 1023) == 0)
                _mm_prefetch((const char *)((uintptr_t)(x + i) + PREFETCH_BYTES), _MM_HINT_T0);
            step(_mm256_loadu_ps(x + i), expm, &l0, &h0, &c0);
            step(_mm256_loadu_ps(x + i + 8), expm, &l1, &h1, &c1);
            step(_mm256_loadu_ps(x + i + 16), expm, &l2, &h2, &c2);
            step(_mm256_loadu_ps(x + i + 24), expm, &l3, &h3, &c3);
        }
        bad += hsum(c0) + hsum(c1) + hsum(c2) + hsum(c3);
    }
    l0 = _mm256_min_ps(_mm256_min_ps(l0, l1), _mm256_min_ps(l2, l3));
    h0 = _mm256_max_ps(_mm256_max_ps(h0, h1), _mm256_max_ps(h2, h3));
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
