/* Numeric-suite kernel family, AVX2 + FMA (numeric/metrics_dsp.h). */
#include <immintrin.h>
#include <math.h>

#include "numeric/metrics_dsp.h"

static inline double hsum_pd(__m256d v)
{
    __m128d lo = _mm256_castpd256_pd128(v), hi = _mm256_extractf128_pd(v, 1);
    lo = _mm_add_pd(lo, hi);
    return _mm_cvtsd_f64(_mm_add_sd(lo, _mm_unpackhi_pd(lo, lo)));
}

/* Two blocks at a time (four independent 4-double chains); 8 floats of a block per step,
 * lanes 0-3 in s0, 4-7 in s1, as the C reference. */
static void moments2(const float *xa, const float *xb, int64_t n, double *mean, double *m2)
{
    __m256d a0 = _mm256_setzero_pd(), a1 = a0, b0 = a0, b1 = a0;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 va = _mm256_loadu_ps(xa + i), vb = _mm256_loadu_ps(xb + i);
        a0 = _mm256_add_pd(a0, _mm256_cvtps_pd(_mm256_castps256_ps128(va)));
        a1 = _mm256_add_pd(a1, _mm256_cvtps_pd(_mm256_extractf128_ps(va, 1)));
        b0 = _mm256_add_pd(b0, _mm256_cvtps_pd(_mm256_castps256_ps128(vb)));
        b1 = _mm256_add_pd(b1, _mm256_cvtps_pd(_mm256_extractf128_ps(vb, 1)));
    }
    double sa = hsum_pd(_mm256_add_pd(a0, a1)), sb = hsum_pd(_mm256_add_pd(b0, b1));
    for (int64_t j = i; j < n; j++) {
        sa += xa[j];
        sb += xb[j];
    }
    double ma = sa / (double)n, mb = sb / (double)n;
    __m256d vma = _mm256_set1_pd(ma), vmb = _mm256_set1_pd(mb);
    a0 = a1 = b0 = b1 = _mm256_setzero_pd();
    for (int64_t j = 0; j + 8 <= n; j += 8) {
        __m256 va = _mm256_loadu_ps(xa + j), vb = _mm256_loadu_ps(xb + j);
        __m256d d0 = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(va)), vma);
        __m256d d1 = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(va, 1)), vma);
        __m256d e0 = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(vb)), vmb);
        __m256d e1 = _mm256_sub_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(vb, 1)), vmb);
        a0 = _mm256_fmadd_pd(d0, d0, a0);
        a1 = _mm256_fmadd_pd(d1, d1, a1);
        b0 = _mm256_fmadd_pd(e0, e0, b0);
        b1 = _mm256_fmadd_pd(e1, e1, b1);
    }
    double qa = hsum_pd(_mm256_add_pd(a0, a1)), qb = hsum_pd(_mm256_add_pd(b0, b1));
    for (int64_t j = i; j < n; j++) {
        double d = (double)xa[j] - ma, e = (double)xb[j] - mb;
        qa += d * d;
        qb += e * e;
    }
    mean[0] = ma;
    mean[1] = mb;
    m2[0] = qa;
    m2[1] = qb;
}

void qcal_f32_moments_blocks__avx2(const float *x, int64_t len, int64_t blocks, double *mean,
                                   double *m2)
{
    if (len < 16) {
        qcal_f32_moments_blocks__c(x, len, blocks, mean, m2);
        return;
    }
    int64_t b = 0;
    for (; b + 2 <= blocks; b += 2)
        moments2(x + b * len, x + (b + 1) * len, len, mean + b, m2 + b);
    if (b < blocks) {   /* the odd block: paired with itself */
        double mm[2], qq[2];
        moments2(x + b * len, x + b * len, len, mm, qq);
        mean[b] = mm[0];
        m2[b] = qq[0];
    }
}

/* 4 pairs per step; a block with a non-finite pair falls back to the serial loop. */
void qcal_f32_pair_metrics__avx2(const float *x, const float *y, int64_t n,
                                 qcal_numeric_metric_acc *a)
{
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    const __m256 inf = _mm256_set1_ps(INFINITY);
    __m256 bad = _mm256_setzero_ps();
    __m128 vmax = _mm_setzero_ps();
    __m256d xx = _mm256_setzero_pd(), yy = _mm256_setzero_pd(), xy = _mm256_setzero_pd(),
            dd = _mm256_setzero_pd();
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        __m128 xv = _mm_loadu_ps(x + i), yv = _mm_loadu_ps(y + i);
        __m128 d = _mm_sub_ps(xv, yv);
        __m256 both = _mm256_set_m128(yv, xv);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_and_ps(both, absmask), inf, _CMP_NLT_UQ));
        vmax = _mm_max_ps(vmax, _mm_and_ps(d, _mm256_castps256_ps128(absmask)));
        __m256d xd = _mm256_cvtps_pd(xv), yd = _mm256_cvtps_pd(yv), ddd = _mm256_cvtps_pd(d);
        xx = _mm256_fmadd_pd(xd, xd, xx);
        yy = _mm256_fmadd_pd(yd, yd, yy);
        xy = _mm256_fmadd_pd(xd, yd, xy);
        dd = _mm256_fmadd_pd(ddd, ddd, dd);
    }
    if (_mm256_movemask_ps(bad)) {
        qcal_f32_pair_metrics_serial(x, y, n, a);
        return;
    }
    qcal_numeric_metric_acc t;
    qcal_f32_pair_metrics_serial(x + i, y + i, n - i, &t);
    if (t.nonfinite) {
        qcal_f32_pair_metrics_serial(x, y, n, a);
        return;
    }
    float m[4];
    _mm_storeu_ps(m, vmax);
    double mx = t.max_abs_err;
    for (int k = 0; k < 4; k++)
        mx = m[k] > mx ? m[k] : mx;
    a->count = n;
    a->nonfinite = 0;
    a->sxx = hsum_pd(xx) + t.sxx;
    a->syy = hsum_pd(yy) + t.syy;
    a->sxy = hsum_pd(xy) + t.sxy;
    a->sdd = hsum_pd(dd) + t.sdd;
    a->max_abs_err = mx;
}

void qcal_metrics_dsp_init_avx2(qcal_metrics_dsp *dsp)
{
    dsp->moments = qcal_f32_moments_blocks__avx2;
    dsp->pair_metrics = qcal_f32_pair_metrics__avx2;
}
