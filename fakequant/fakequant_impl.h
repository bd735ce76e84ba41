/* Internal contract of the fake-quant module: the element kernels (C reference and ISA
 * versions, chosen at run time) and the argument checks shared by fakequant.c,
 * learnable.c and fake_quantize.c. Not installed. */
#ifndef QCAL_FAKEQUANT_IMPL_H
#define QCAL_FAKEQUANT_IMPL_H

#include "core/cpu.h"
#include "core/internal.h"
#include "qcal/fakequant.h"

/* One contiguous run of elements sharing one (scale, zero_point). qmin/qmax/zp are the
 * integer parameters converted to float (exact: |value| <= 2^24). mask may be NULL. */
typedef struct qcal_fq_run {
    float scale, inv_scale, zp, qmin, qmax;
} qcal_fq_run;

void qcal_f32_fakequant__c(const float *src, int64_t n, const qcal_fq_run *p, float *dst,
                           uint8_t *mask);
void qcal_f32_fakequant__avx2(const float *src, int64_t n, const qcal_fq_run *p, float *dst,
                              uint8_t *mask);
void qcal_f32_fakequant__avx512(const float *src, int64_t n, const qcal_fq_run *p,
                                float *dst, uint8_t *mask);

void qcal_f32_fakequant_fused__c(const float *src, const float *gy, int64_t n,
                                 const qcal_fq_run *p, float *dst, float *gx);
void qcal_f32_fakequant_fused__avx2(const float *src, const float *gy, int64_t n,
                                    const qcal_fq_run *p, float *dst, float *gx);
void qcal_f32_fakequant_fused__avx512(const float *src, const float *gy, int64_t n,
                                      const qcal_fq_run *p, float *dst, float *gx);

void qcal_f32_fakequant_backward__c(const float *gy, const uint8_t *mask, int64_t n,
                                    float *gx);
void qcal_f32_fakequant_backward__avx2(const float *gy, const uint8_t *mask, int64_t n,
                                       float *gx);
void qcal_f32_fakequant_backward__avx512(const float *gy, const uint8_t *mask, int64_t n,
                                         float *gx);

/* Checks quant_min/quant_max (ordered, within +-QCAL_FAKEQUANT_QRANGE_LIMIT). */
qcal_status qcal_fq_check_range(int64_t quant_min, int64_t quant_max);
/* Checks one scale (> 0, finite) and integer zero-point (in range); `what` names the
 * channel in messages (-1 for per-tensor). */
qcal_status qcal_fq_check_qparams(float scale, int64_t zero_point, int64_t quant_min,
                                  int64_t quant_max, int64_t channel);
/* Fills a run descriptor. */
void qcal_fq_run_init(qcal_fq_run *r, float scale, int64_t zero_point, int64_t quant_min,
                      int64_t quant_max);

/* Splits a tensor around axis: outer * channels * inner == numel. Validates the tensor
 * (data non-NULL, numel > 0) and the axis. */
qcal_status qcal_fq_split(const qcal_tensor *t, int32_t axis, int64_t *outer,
                          int64_t *channels, int64_t *inner);

/* Learnable: rounds a float zero-point as the forward does (nearbyintf, clamp). NaN/Inf
 * zero-points are rejected by the callers first. */
int64_t qcal_fq_round_zero_point(float zero_point, int64_t quant_min, int64_t quant_max);

#endif
