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

/* Mean and sum of squared deviations (m2) of each of `blocks` consecutive blocks of `len`
 * elements (block b is x[b*len .. (b+1)*len)): mean[b], m2[b] in double, each exactly
 * qcal_f32_moments__c(x + b*len, len). Requires len >= 1 and every value finite (the
 * caller handles blocks with NaN/Inf). The SIMD versions work on several blocks at once:
 * each lane's sum is a serial chain (that is the contract), so one block alone is bound by
 * the add latency. */
typedef void (*qcal_f32_moments_fn)(const float *x, int64_t len, int64_t blocks,
                                    double *mean, double *m2);

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
void qcal_metrics_dsp_init_avx512(qcal_metrics_dsp *dsp);
const qcal_metrics_dsp *qcal_metrics_dsp_get(void);

/* One block: the definition of the moments' bits (lanes as described above). */
void qcal_f32_moments__c(const float *x, int64_t n, double *mean, double *m2);
void qcal_f32_moments_blocks__c(const float *x, int64_t len, int64_t blocks, double *mean,
                                double *m2);
void qcal_f32_moments_blocks__avx2(const float *x, int64_t len, int64_t blocks, double *mean,
                                   double *m2);
void qcal_f32_moments_blocks__avx512(const float *x, int64_t len, int64_t blocks,
                                     double *mean, double *m2);
void qcal_f32_pair_metrics__c(const float *x, const float *y, int64_t n,
                              qcal_numeric_metric_acc *a);
void qcal_f32_pair_metrics__avx2(const float *x, const float *y, int64_t n,
                                 qcal_numeric_metric_acc *a);

/* The plain in-order loop over pairs (skips and counts non-finite pairs): the C
 * reference's path for a block with a non-finite pair and for the tail after the lanes. */
void qcal_f32_pair_metrics_serial(const float *x, const float *y, int64_t n,
                                  qcal_numeric_metric_acc *a);

#endif
