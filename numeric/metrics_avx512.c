/* Numeric-suite kernel family, AVX-512 F/BW/DQ/VL (numeric/metrics_dsp.h). */
#include <immintrin.h>

#include "numeric/metrics_dsp.h"

/* The AVX2 kernels' horizontal sum of (lanes 0-3) + (lanes 4-7) of one 8-double vector. */
static inline double hsum8(__m512d s)
{
    __m256d v = _mm256_add_pd(_mm512_castpd512_pd256(s), _mm512_extractf64x4_pd(s, 1));
    __m128d lo = _mm256_castpd256_pd128(v), hi = _mm256_extractf128_pd(v, 1);
    lo = _mm_add_pd(lo, hi);
    return _mm_cvtsd_f64(_mm_add_sd(lo, _mm_unpackhi_pd(lo, lo)));
}

/* Four blocks at a time: one 8-double chain per block (lane k = the reference's lane k),
 * four chains in flight hide the add / FMA latency. */
#define NB 4
static void moments4(const float *const xs[NB], int64_t n, double *mean, double *m2)
{
    __m512d s[NB];
    for (int b = 0; b < NB; b++)
        s[b] = _mm512_setzero_pd();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int b = 0; b < NB; b++)
            s[b] = _mm512_add_pd(s[b], _mm512_cvtps_pd(_mm256_loadu_ps(xs[b] + i)));
    double mu[NB];
    __m512d vm[NB];
    for (int b = 0; b < NB; b++) {
        double sum = hsum8(s[b]);
        for (int64_t j = i; j < n; j++)
            sum += xs[b][j];
        mu[b] = sum / (double)n;
        vm[b] = _mm512_set1_pd(mu[b]);
        s[b] = _mm512_setzero_pd();
    }
    for (int64_t j = 0; j + 8 <= n; j += 8)
        for (int b = 0; b < NB; b++) {
            __m512d d = _mm512_sub_pd(_mm512_cvtps_pd(_mm256_loadu_ps(xs[b] + j)), vm[b]);
            s[b] = _mm512_fmadd_pd(d, d, s[b]);
        }
    for (int b = 0; b < NB; b++) {
        double q = hsum8(s[b]);
        for (int64_t j = i; j < n; j++) {
            double d = (double)xs[b][j] - mu[b];
            q += d * d;
        }
        mean[b] = mu[b];
        m2[b] = q;
    }
}

void qcal_f32_moments_blocks__avx512(const float *x, int64_t len, int64_t blocks,
                                     double *mean, double *m2)
{
    if (len < 16) {
        qcal_f32_moments_blocks__c(x, len, blocks, mean, m2);
        return;
    }
    for (int64_t b = 0; b < blocks; b += NB) {
        const float *xs[NB];
        double mm[NB], qq[NB];
        int64_t k = blocks - b < NB ? blocks - b : NB;
        for (int j = 0; j < NB; j++)   /* a short group repeats its last block */
            xs[j] = x + (b + (j < k ? j : k - 1)) * len;
        moments4(xs, len, mm, qq);
        for (int64_t j = 0; j < k; j++) {
            mean[b + j] = mm[j];
            m2[b + j] = qq[j];
        }
    }
}

void qcal_metrics_dsp_init_avx512(qcal_metrics_dsp *dsp)
{
    dsp->moments = qcal_f32_moments_blocks__avx512;
}
