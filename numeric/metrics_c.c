/* Numeric-suite kernel family: C references and the function table
 * (numeric/metrics_dsp.h). */
#include <math.h>
#include <string.h>

#include "numeric/metrics_dsp.h"

/* Lanes 0..7 as the AVX2 horizontal sum of two 4-double vectors: v = lo + hi, then
 * (v0 + v2) + (v1 + v3). */
static double sum8(const double s[8])
{
    double v0 = s[0] + s[4], v1 = s[1] + s[5], v2 = s[2] + s[6], v3 = s[3] + s[7];
    return (v0 + v2) + (v1 + v3);
}

static double sum4(const double s[4])
{
    return (s[0] + s[2]) + (s[1] + s[3]);
}

void qcal_f32_moments__c(const float *x, int64_t n, double *mean, double *m2)
{
    double sum = 0, q = 0;
    int64_t i = 0;
    if (n >= 16) {
        double s[8] = { 0 };
        for (; i + 8 <= n; i += 8)
            for (int k = 0; k < 8; k++)
                s[k] += (double)x[i + k];
        sum = sum8(s);
    }
    for (int64_t j = i; j < n; j++)
        sum += x[j];
    double mu = sum / (double)n;
    if (n >= 16) {
        double s[8] = { 0 };
        for (int64_t j = 0; j + 8 <= n; j += 8)
            for (int k = 0; k < 8; k++) {
                double d = (double)x[j + k] - mu;
                s[k] = fma(d, d, s[k]);
            }
        q = sum8(s);
    }
    for (int64_t j = i; j < n; j++) {
        double d = (double)x[j] - mu;
        q += d * d;
    }
    *mean = mu;
    *m2 = q;
}

void qcal_f32_moments_blocks__c(const float *x, int64_t len, int64_t blocks, double *mean,
                                double *m2)
{
    for (int64_t b = 0; b < blocks; b++)
        qcal_f32_moments__c(x + b * len, len, &mean[b], &m2[b]);
}

void qcal_f32_pair_metrics_serial(const float *x, const float *y, int64_t n,
                                  qcal_numeric_metric_acc *a)
{
    memset(a, 0, sizeof *a);
    for (int64_t i = 0; i < n; i++) {
        float xv = x[i], yv = y[i];
        if (!isfinite(xv) || !isfinite(yv)) {
            a->nonfinite++;
            continue;
        }
        float d = xv - yv;
        a->count++;
        a->sxx += (double)xv * xv;
        a->syy += (double)yv * yv;
        a->sxy += (double)xv * yv;
        a->sdd += (double)d * d;
        double ad = fabs((double)d);
        a->max_abs_err = ad > a->max_abs_err ? ad : a->max_abs_err;
    }
}

/* A float times a float is exact in double, so lane k's `+= a * b` is the AVX2 kernel's
 * fused multiply-add bit for bit. */
void qcal_f32_pair_metrics__c(const float *x, const float *y, int64_t n,
                              qcal_numeric_metric_acc *a)
{
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i]) || !isfinite(y[i])) {
            qcal_f32_pair_metrics_serial(x, y, n, a);
            return;
        }
    double xx[4] = { 0 }, yy[4] = { 0 }, xy[4] = { 0 }, dd[4] = { 0 };
    float vmax[4] = { 0 };
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int k = 0; k < 4; k++) {
            float d = x[i + k] - y[i + k], ad = fabsf(d);
            double xd = x[i + k], yd = y[i + k], ddd = d;
            xx[k] += xd * xd;
            yy[k] += yd * yd;
            xy[k] += xd * yd;
            dd[k] += ddd * ddd;
            vmax[k] = ad > vmax[k] ? ad : vmax[k];
        }
    qcal_numeric_metric_acc t;
    qcal_f32_pair_metrics_serial(x + i, y + i, n - i, &t);
    double mx = t.max_abs_err;
    for (int k = 0; k < 4; k++)
        mx = vmax[k] > mx ? vmax[k] : mx;
    a->count = n;
    a->nonfinite = 0;
    a->sxx = sum4(xx) + t.sxx;
    a->syy = sum4(yy) + t.syy;
    a->sxy = sum4(xy) + t.sxy;
    a->sdd = sum4(dd) + t.sdd;
    a->max_abs_err = mx;
}

void qcal_metrics_dsp_init(qcal_metrics_dsp *dsp, qcal_isa isa)
{
    dsp->moments = qcal_f32_moments_blocks__c;
    dsp->pair_metrics = qcal_f32_pair_metrics__c;
#if QCAL_HAVE_X86_SIMD
    if (isa >= QCAL_ISA_AVX2)
        qcal_metrics_dsp_init_avx2(dsp);
    if (isa >= QCAL_ISA_AVX512)
        qcal_metrics_dsp_init_avx512(dsp);
#else
    (void)isa;
#endif
}

QCAL_DSP_DEFINE_GET(metrics)
