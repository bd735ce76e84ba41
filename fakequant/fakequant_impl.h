/* Internal contract of the fake-quant module: the element kernels (C reference and ISA
 * versions, chosen at run time) and the argument checks shared by fakequant.c,
 * learnable.c and fake_quantize.c. Not installed. */
#ifndef QCAL_FAKEQUANT_IMPL_H
#define QCAL_FAKEQUANT_IMPL_H

#include <stdbool.h>

#include "core/cpu.h"
#include "core/internal.h"
#include "qcal/fakequant.h"

/* One contiguous run of elements sharing one (scale, zero_point). qmin/qmax/zp are the
 * integer parameters converted to float (exact: |value| <= 2^24). mask may be NULL. */
typedef struct qcal_fq_run {
    float scale, inv_scale, zp, qmin, qmax;
} qcal_fq_run;

/* Element kernels. `stream`: the ISA versions write the outputs with non-temporal stores
 * (after peeling to the vector alignment; an output that is also an input, i.e. in place,
 * keeps plain stores) and end with an sfence. Values are identical either way; the C
 * reference ignores the flag. Callers set it from qcal_fq_stream() for large tensors. */
void qcal_f32_fakequant__c(const float *src, int64_t n, const qcal_fq_run *p, float *dst,
                           uint8_t *mask, bool stream);
void qcal_f32_fakequant__avx2(const float *src, int64_t n, const qcal_fq_run *p, float *dst,
                              uint8_t *mask, bool stream);
void qcal_f32_fakequant__avx512(const float *src, int64_t n, const qcal_fq_run *p,
                                float *dst, uint8_t *mask, bool stream);

void qcal_f32_fakequant_fused__c(const float *src, const float *gy, int64_t n,
                                 const qcal_fq_run *p, float *dst, float *gx, bool stream);
void qcal_f32_fakequant_fused__avx2(const float *src, const float *gy, int64_t n,
                                    const qcal_fq_run *p, float *dst, float *gx, bool stream);
void qcal_f32_fakequant_fused__avx512(const float *src, const float *gy, int64_t n,
                                      const qcal_fq_run *p, float *dst, float *gx,
                                      bool stream);

void qcal_f32_fakequant_backward__c(const float *gy, const uint8_t *mask, int64_t n,
                                    float *gx, bool stream);
void qcal_f32_fakequant_backward__avx2(const float *gy, const uint8_t *mask, int64_t n,
                                       float *gx, bool stream);
void qcal_f32_fakequant_backward__avx512(const float *gy, const uint8_t *mask, int64_t n,
                                         float *gx, bool stream);

/* True when a pass touching `bytes` bytes in total should use non-temporal stores: more
 * than half the L3 (Linux sysfs, read once; 32 MiB if unknown), so
 * its outputs would not stay cached anyway and plain stores would only add the
 * read-for-ownership traffic. */
bool qcal_fq_stream(int64_t bytes);

/* LSQ (learnable) backward over one span of elements sharing one set of parameters.
 * Per element j of the span (see learnable.c for the formulas): grad_x[j] (gx may be NULL)
 * and the d_scale / d_zero_point terms, converted to double and added into the per-lane
 * accumulators acc_s[j % 16] / acc_z[j % 16] in increasing j. Every ISA does exactly these
 * float operations and double additions, so the accumulators come out bit-identical
 * between C, AVX2 and AVX-512 (the SIMD versions rotate their registers when they peel to
 * the output's alignment). `stream` as above, for gx. */
typedef struct qcal_lsq_run {
    float scale, inv_scale, zp, qmin, qmax, grad_factor;
} qcal_lsq_run;

#define QCAL_LSQ_LANES 16

void qcal_f32_lsq_backward__c(const float *x, const float *gy, int64_t n,
                              const qcal_lsq_run *p, float *gx, double *acc_s, double *acc_z,
                              bool stream);
void qcal_f32_lsq_backward__avx2(const float *x, const float *gy, int64_t n,
                                 const qcal_lsq_run *p, float *gx, double *acc_s,
                                 double *acc_z, bool stream);
void qcal_f32_lsq_backward__avx512(const float *x, const float *gy, int64_t n,
                                   const qcal_lsq_run *p, float *gx, double *acc_s,
                                   double *acc_z, bool stream);

/* Combines 16 lane accumulators in a fixed pairwise order. */
double qcal_lsq_lanes_sum(const double *acc);

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

/* Checks the arguments of a public fake-quant call: src (non-empty, data), qp (validated;
 * learnable: float zero-points, else integer ones in range), the +-2^24 range limit, and
 * per-channel qp->channels == src->shape[qp->axis]. *n gets numel(src). */
qcal_status qcal_fq_check_args(const char *what, const qcal_tensor *src, const qcal_qparams *qp,
                               bool learnable, int64_t *n);
/* Checks an output (or second input) tensor view: non-NULL, n elements, data set. */
qcal_status qcal_fq_check_out(const char *what, const qcal_tensor *t, int64_t n,
                              const char *name);

/* Learnable: rounds a float zero-point as the forward does (nearbyintf, clamp). NaN/Inf
 * zero-points are rejected by the callers first. */
int64_t qcal_fq_round_zero_point(float zero_point, int64_t quant_min, int64_t quant_max);

#endif
