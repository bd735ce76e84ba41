/* Min/max kernel family, AVX-512 F/BW/DQ/VL (observers/minmax_dsp.h).
 *
 * The flat kernel reads the input in blocks of BLOCK floats (one 4 KiB page) with a fast
 * pass: plain vminps/vmaxps and one FMA per vector, f = a * 0 + f, which stays 0 for finite
 * lanes and turns into a sticky NaN at a NaN or +-Inf lane. A block whose f ends up NaN
 * (rare) is redone from the accumulators saved at its start with the exact step: finite
 * lanes (exponent bits not all ones) kept with masked vminps/vmaxps, non-finite lanes counted
 * with a masked add. On a block without non-finite values both passes do the same
 * vminps/vmaxps on the same accumulators in the same order, so the bits do not change.
 * Each block also prefetches one line PREFETCH_BYTES ahead (one touch per page ahead).
 * Measured on a 64 MiB input, one thread (docs/performance.md): the page-ahead prefetch is
 * most of the gain, the lighter fast pass a few percent more.
 * Four independent accumulators hide the min/max latency; the tail is one masked load. */
#include <immintrin.h>
#include <math.h>
#include <stdbool.h>

#include "observers/minmax_dsp.h"

/* Floats per block of the fast pass (4 KiB: a block that has to be redone is still in L1;
 * a per-channel row of 1024 floats is one block). A multiple of 64. */
#define BLOCK 1024

/* Each block first prefetches one line this far ahead: one touch per 4 KiB page, early
 * enough that the page's TLB walk and first miss are done when the loads get there (the
 * hardware prefetchers stop at 4 KiB page boundaries). Prefetches never fault, so running
 * past the end of x is harmless (the address is formed as an integer) (and helps the next row of a per-channel tensor). */
#define PREFETCH_BYTES (64 * 1024)

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

/* The accumulators: vector k of every 64 floats folds into l[k] / h[k]. */
typedef struct acc4 {
    __m512 l0, l1, l2, l3, h0, h1, h2, h3;
} acc4;

/* Exact pass over x[0..n), n a multiple of 64 and at most BLOCK (the int32 lane counters
 * cannot overflow); returns the number of non-finite values. */
static inline uint64_t exact64(const float *x, int64_t n, acc4 *a)
{
    const __m512i expm = _mm512_set1_epi32((int)QCAL_F32_EXP_MASK);
    __m512i c0 = _mm512_setzero_si512(), c1 = c0, c2 = c0, c3 = c0;
    for (int64_t i = 0; i < n; i += 64) {
        step(_mm512_loadu_ps(x + i), expm, &a->l0, &a->h0, &c0);
        step(_mm512_loadu_ps(x + i + 16), expm, &a->l1, &a->h1, &c1);
        step(_mm512_loadu_ps(x + i + 32), expm, &a->l2, &a->h2, &c2);
        step(_mm512_loadu_ps(x + i + 48), expm, &a->l3, &a->h3, &c3);
    }
    return hsum(_mm512_add_epi32(_mm512_add_epi32(c0, c1), _mm512_add_epi32(c2, c3)));
}

/* Fast pass over one block of BLOCK floats: folds it into *a and returns true, or returns
 * false with *a untouched when the block holds a non-finite value. */
static inline bool fast_block(const float *x, acc4 *a)
{
    const __m512 z = _mm512_setzero_ps();
    __m512 l0 = a->l0, l1 = a->l1, l2 = a->l2, l3 = a->l3;
    __m512 h0 = a->h0, h1 = a->h1, h2 = a->h2, h3 = a->h3;
    __m512 f0 = z, f1 = z, f2 = z, f3 = z;
    _mm_prefetch((const char *)((uintptr_t)x + PREFETCH_BYTES), _MM_HINT_T0);
    for (int64_t i = 0; i < BLOCK; i += 64) {
        __m512 v0 = _mm512_loadu_ps(x + i), v1 = _mm512_loadu_ps(x + i + 16);
        __m512 v2 = _mm512_loadu_ps(x + i + 32), v3 = _mm512_loadu_ps(x + i + 48);
        l0 = _mm512_min_ps(l0, v0);
        h0 = _mm512_max_ps(h0, v0);
        f0 = _mm512_fmadd_ps(v0, z, f0);
        l1 = _mm512_min_ps(l1, v1);
        h1 = _mm512_max_ps(h1, v1);
        f1 = _mm512_fmadd_ps(v1, z, f1);
        l2 = _mm512_min_ps(l2, v2);
        h2 = _mm512_max_ps(h2, v2);
        f2 = _mm512_fmadd_ps(v2, z, f2);
        l3 = _mm512_min_ps(l3, v3);
        h3 = _mm512_max_ps(h3, v3);
        f3 = _mm512_fmadd_ps(v3, z, f3);
    }
    __m512 f = _mm512_add_ps(_mm512_add_ps(f0, f1), _mm512_add_ps(f2, f3));
    if (_mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q))
        return false;
    a->l0 = l0, a->l1 = l1, a->l2 = l2, a->l3 = l3;
    a->h0 = h0, a->h1 = h1, a->h2 = h2, a->h3 = h3;
    return true;
}

void qcal_f32_minmax__avx512(const float *x, int64_t n, float *mn, float *mx,
                             uint64_t *nonfinite)
{
    const __m512i expm = _mm512_set1_epi32((int)QCAL_F32_EXP_MASK);
    const __m512 pinf = _mm512_set1_ps(INFINITY), ninf = _mm512_set1_ps(-INFINITY);
    acc4 a = { pinf, pinf, pinf, pinf, ninf, ninf, ninf, ninf };
    uint64_t bad = 0;
    int64_t i = 0;
    for (; i + BLOCK <= n; i += BLOCK)
        if (!fast_block(x + i, &a))
            bad += exact64(x + i, BLOCK, &a);
    int64_t n64 = (n - i) & ~(int64_t)63;
    bad += exact64(x + i, n64, &a);
    i += n64;
    /* Remaining < 64 elements: whole vectors, then a masked load for the last few. */
    __m512i ct = _mm512_setzero_si512();
    for (; i + 16 <= n; i += 16)
        step(_mm512_loadu_ps(x + i), expm, &a.l0, &a.h0, &ct);
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        /* Masked-off lanes load as 0.0f and are left out of the finite mask. */
        __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        __mmask16 ok = m & _mm512_cmpneq_epi32_mask(
                               _mm512_and_si512(_mm512_castps_si512(v), expm), expm);
        a.l0 = _mm512_mask_min_ps(a.l0, ok, a.l0, v);
        a.h0 = _mm512_mask_max_ps(a.h0, ok, a.h0, v);
        bad += (uint64_t)__builtin_popcount((unsigned)(m & (__mmask16)~ok));
    }
    bad += hsum(ct);
    __m512 lo = _mm512_min_ps(_mm512_min_ps(a.l0, a.l1), _mm512_min_ps(a.l2, a.l3));
    __m512 hi = _mm512_max_ps(_mm512_max_ps(a.h0, a.h1), _mm512_max_ps(a.h2, a.h3));
    *mn = _mm512_reduce_min_ps(lo);
    *mx = _mm512_reduce_max_ps(hi);
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
