/* Internal kernels of the numeric suite (numeric/metrics.c). Not installed. */
#ifndef QCAL_NUMERIC_IMPL_H
#define QCAL_NUMERIC_IMPL_H

#include <stdint.h>

#include "qcal/numeric.h"

/* Partial statistics of a block: finite count, non-finite count, min/max, mean, m2. */
typedef struct qcal_num_blk {
    int64_t n;
    uint64_t nonfinite;
    float min, max;
    double mean, m2;
} qcal_num_blk;

/* Block kernels: C reference and AVX2 (x, y may be unaligned). */
void qcal_num_block_stats__c(const float *x, int64_t n, qcal_num_blk *b);
void qcal_num_block_stats__avx2(const float *x, int64_t n, qcal_num_blk *b);
void qcal_num_block_metrics__c(const float *x, const float *y, int64_t n, qcal_numeric_metric_acc *a);
void qcal_num_block_metrics__avx2(const float *x, const float *y, int64_t n,
                                  qcal_numeric_metric_acc *a);

/* Statistics of x[0..n) with the fixed superblock structure (threads per qcal_threads_for). */
qcal_status qcal_num_stats_blk(const float *x, int64_t n, qcal_num_blk *out);

#endif
