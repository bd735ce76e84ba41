/* Min/max kernel family, AVX-512 F/BW/DQ/VL (observers/minmax_dsp.h).
 *
 * Finite lanes (exponent bits not all ones) are kept with masked vminps/vmaxps; the
 * non-finite lanes are counted with a masked add. Four independent accumulators hide the
 * min/max latency; the tail is one masked load. */
#include <immintrin.h>
#include <math.h>

#include "observers/minmax_dsp.h"

/* Lane counters are int32: flush them to 64 bits at least every 2^28 vectors. */
#define FLUSH_ELEMS ((int64_t)1 << 30)

static inline void step(__m512 a, __m512i expm, __m512 *lo, __m512 *hi, __m512i *cnt)
{
    __mmask16 ok = _mm512_cmpneq_epi32_mask(
        _mm512_and_si512(_mm512_castps_si512(a), expm), expm);
    *lo = _mm512_mask_min_ps(*lo, ok, *lo, a);
    *hi = _mm512_mask_max_ps(*hi, ok, *hi, a);
    *cnt = _mm512_mask_add_epi32(*cnt, (__mmask16)~ok, *cnt, _mm512_set1_epi32(1));
}

static uint64_t hsum(__m512i c)
{
    uint32_t t[16];
    _mm512_storeu_si512((void *)t, c);
    uint64_t s = 0;
    for (int i = 0; i < 16; i++)
        s += t[i];
    return s;
}

void qcal_f32_minmax__avx512(const float *x, int64_t n, float *mn, float *mx,
                             uint64_t *nonfinite)
{
    const __m512i expm = _mm512_set1_epi32((int)QCAL_F32_EXP_MASK);
    __m512 l0 = _mm512_set1_ps(INFINITY), l1 = l0, l2 = l0, l3 = l0;
    __m512 h0 = _mm512_set1_ps(-INFINITY), h1 = h0, h2 = h0, h3 = h0;
    uint64_t bad = 0;
    int64_t i = 0;
    while (i + 64 <= n) {
        int64_t end = n - i > FLUSH_ELEMS ? i + FLUSH_ELEMS : n;
        __m512i c0 = _mm512_setzero_si512(), c1 = c0, c2 = c0, c3 = c0;
        for (; i + 64 <= end; i += 64) {
            step(_mm512_loadu_ps(x + i), expm, &l0, &h0, &c0);
            step(_mm512_loadu_ps(x + i + 16), expm, &l1, &h1, &c1);
            step(_mm512_loadu_ps(x + i + 32), expm, &l2, &h2, &c2);
            step(_mm512_loadu_ps(x + i + 48), expm, &l3, &h3, &c3);
        }
        bad += hsum(_mm512_add_epi32(_mm512_add_epi32(c0, c1), _mm512_add_epi32(c2, c3)));
    }
    /* Remaining < 64 elements: whole vectors, then a masked load for the last few. */
    __m512i ct = _mm512_setzero_si512();
    for (; i + 16 <= n; i += 16)
        step(_mm512_loadu_ps(x + i), expm, &l0, &h0, &ct);
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        /* Masked-off lanes load as 0.0f and are left out of the finite mask. */
        __m512 a = _mm512_maskz_loadu_ps(m, x + i);
        __mmask16 ok = m & _mm512_cmpneq_epi32_mask(
                               _mm512_and_si512(_mm512_castps_si512(a), expm), expm);
        l0 = _mm512_mask_min_ps(l0, ok, l0, a);
        h0 = _mm512_mask_max_ps(h0, ok, h0, a);
        bad += (uint64_t)__builtin_popcount((unsigned)(m & (__mmask16)~ok));
    }
    bad += hsum(ct);
    l0 = _mm512_min_ps(_mm512_min_ps(l0, l1), _mm512_min_ps(l2, l3));
    h0 = _mm512_max_ps(_mm512_max_ps(h0, h1), _mm512_max_ps(h2, h3));
    *mn = _mm512_reduce_min_ps(l0);
    *mx = _mm512_reduce_max_ps(h0);
    *nonfinite = bad;
}

/* As step(), but a tie (-0.0 vs +0.0) keeps the running value as the C reference does:
 * vminps returns its second operand when the two compare equal. */
static inline void step_keep(__m512 a, __m512i expm, __m512 *lo, __m512 *hi, __m512i *cnt)
{
    __mmask16 ok = _mm512_cmpneq_epi32_mask(
        _mm512_and_si512(_mm512_castps_si512(a), expm), expm);
    *lo = _mm512_mask_min_ps(*lo, ok, a, *lo);
    *hi = _mm512_mask_max_ps(*hi, ok, a, *hi);
    *cnt = _mm512_mask_add_epi32(*cnt, (__mmask16)~ok, *cnt, _mm512_set1_epi32(1));
}

/* Wide rows (the running columns cmn + cmx fill a 32 KiB L1 at width 4096) go four at a
 * time: each column vector is loaded and stored once per four rows, and the four row
 * streams (in different pages) stay sequential. Narrower rows go one by one, in memory
 * order (four rows inside one page defeat the prefetcher: 2x slower at width 256).
 * Either way every column folds its rows in order. */
#define ROWS4_MIN_WIDTH 4096
void qcal_f32_minmax_cols__avx512(const float *x, int64_t rows, int64_t width, float *cmn,
                                  float *cmx, uint64_t *nonfinite)
{
    const __m512i expm = _mm512_set1_epi32((int)QCAL_F32_EXP_MASK);
    uint64_t bad = 0;
    int64_t r = 0;
    for (; width >= ROWS4_MIN_WIDTH && r + 4 <= rows; r += 4) {
        const float *r0 = x + r * width, *r1 = r0 + width, *r2 = r1 + width, *r3 = r2 + width;
        __m512i cnt = _mm512_setzero_si512();
        int64_t j = 0;
        for (; j + 16 <= width; j += 16) {
            __m512 lo = _mm512_loadu_ps(cmn + j), hi = _mm512_loadu_ps(cmx + j);
            step_keep(_mm512_loadu_ps(r0 + j), expm, &lo, &hi, &cnt);
            step_keep(_mm512_loadu_ps(r1 + j), expm, &lo, &hi, &cnt);
            step_keep(_mm512_loadu_ps(r2 + j), expm, &lo, &hi, &cnt);
            step_keep(_mm512_loadu_ps(r3 + j), expm, &lo, &hi, &cnt);
            _mm512_storeu_ps(cmn + j, lo);
            _mm512_storeu_ps(cmx + j, hi);
        }
        bad += hsum(cnt);
        if (j < width)
            for (int k = 0; k < 4; k++)
                qcal_f32_minmax_cols__c(r0 + k * width + j, 1, width - j, cmn + j, cmx + j,
                                        &bad);
    }
    for (; r < rows; r++) {
        const float *row = x + r * width;
        __m512i cnt = _mm512_setzero_si512();
        int64_t j = 0;
        for (; j + 16 <= width; j += 16) {
            __m512 lo = _mm512_loadu_ps(cmn + j), hi = _mm512_loadu_ps(cmx + j);
            step_keep(_mm512_loadu_ps(row + j), expm, &lo, &hi, &cnt);
            _mm512_storeu_ps(cmn + j, lo);
            _mm512_storeu_ps(cmx + j, hi);
        }
        bad += hsum(cnt);
        if (j < width)
            qcal_f32_minmax_cols__c(row + j, 1, width - j, cmn + j, cmx + j, &bad);
    }
    *nonfinite += bad;
}

void qcal_minmax_dsp_init_avx512(qcal_minmax_dsp *dsp)
{
    dsp->minmax = qcal_f32_minmax__avx512;
    dsp->minmax_cols = qcal_f32_minmax_cols__avx512;
}
