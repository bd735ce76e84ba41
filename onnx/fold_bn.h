/* Internal to onnx/: BatchNormalization folding with the folded BNs' statistics kept. */
#ifndef QCAL_ONNX_FOLD_BN_H
#define QCAL_ONNX_FOLD_BN_H

#include "onnx/onnx_internal.h"

/* A folded BN: the tensor the Conv now writes, the BN's shift (beta) and scale (gamma), i.e.
 * the per-channel mean and std of that tensor under the BN's assumptions. */
typedef struct onnx_bn_stats {
    char *tensor;
    int64_t channels;
    float *beta, *gamma;
} onnx_bn_stats;

void onnx_bn_stats_free(onnx_bn_stats *s, int64_t n);

/* qcal_onnx_fold_bn; *stats (may be NULL) gets one entry per folded BN. */
qcal_status onnx_fold_bn(qcal_onnx_model *m, qcal_onnx_fold_report *rep, onnx_bn_stats **stats,
                         int64_t *nstats);

#endif
