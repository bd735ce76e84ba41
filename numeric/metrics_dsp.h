/* Numeric-suite kernel family (kernel layer, core/dsp.h): the block kernels of
 * numeric/metrics.c. Min/max and the non-finite count of a statistics block come from the
 * min/max family (observers/minmax_dsp.h); this family adds the moments and the pair
 * metrics. The C references define the bits: lane sums in the order of the AVX2 kernels
 * (8 double lanes for the moments, 4 for the metrics, lanes combined as
 * ((l0 + l2) + (l1 + l3)) after adding lane k + 4 into lane k), then the tail in order. */
#ifndef QCAL_NUMERIC_METRICS_DSP_H
#define QCAL_NUMERIC_METRICS_DSP_H

#include <stdint.h>

#include "core/dsp.h"
#include "qcal/numeric.h"

/* Mean and sum of squared deviations (m2) of x[0..n), in double. Requires n >= 1 and every
 * x[i] finite (the caller handles blocks with NaN/Inf). */
typedef void (*qcal_f32_moments_fn)(const float *x, int64_t n, double *mean, double *m2);

/* *a = the metric sums of the pairs (x[i], y[i]), i < n; a pair with a non-finite member is
 * skipped and counted. d = x - y in float32 as torch; products and sums in double. */
typedef void (*qcal_f32_pair_metrics_fn)(const float *x, const float *y, int64_t n,
                                         qcal_numeric_metric_acc *a);

typedef struct qcal_metrics_dsp {
    qcal_f32_moments_fn moments;
    qcal_f32_pair_metrics_fn pair_metrics;
} qcal_metrics_dsp;

void qcal_metrics_dsp_init(qcal_metrics_dsp *dsp, qcal_isa isa);
void qcal_metrics_dsp_init_avx2(qcal_metrics_dsp *dsp);
const qcal_metrics_dsp *qcal_metrics_dsp_get(void);

void qcal_f32_moments__c(const float *x, int64_t n, double *mean, double *m2);
void qcal_f32_moments__avx2(const float *x, int64_t n, double *mean, double *m2);
void qcal_f32_pair_metrics__c(const float *x, const float *y, int64_t n,
                              qcal_numeric_metric_acc *a);
void qcal_f32_pair_metrics__avx2(const float *x, const float *y, int64_t n,
                                 qcal_numeric_metric_acc *a);

/* The plain in-order loop over pairs (skips and counts non-finite pairs): the C
 * reference's path for a block with a non-finite pair and for the tail after the lanes. */
void qcal_f32_pair_metrics_serial(const float *x, const float *y, int64_t n,
                                  qcal_numeric_metric_acc *a);

#endif
