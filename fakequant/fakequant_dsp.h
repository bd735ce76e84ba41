/* Fake-quant kernel family (kernel layer, core/dsp.h): the element kernels of fake-quant
 * forward, fused forward + straight-through backward, backward, and the LSQ (learnable)
 * backward, with the arithmetic of PyTorch 1.13's ATen CPU kernels and qcal's NaN policy
 * (fakequant/fakequant.c and learnable.c document the formulas). Every ISA version gives the
 * C reference's bits (outputs, masks and the LSQ lane accumulators). */
#ifndef QCAL_FAKEQUANT_FAKEQUANT_DSP_H
#define QCAL_FAKEQUANT_FAKEQUANT_DSP_H

#include <stdbool.h>
#include <stdint.h>

#include "core/dsp.h"

/* One contiguous run of elements sharing one (scale, zero_point). qmin/qmax/zp are the
 * integer parameters converted to float (exact: |value| <= 2^24). mask may be NULL. */
typedef struct qcal_fq_run {
    float scale, inv_scale, zp, qmin, qmax;
} qcal_fq_run;

/* Element kernels. `stream`: the ISA versions write the outputs with non-temporal stores
 * (after peeling to the vector alignment; an output that is also an input, i.e. in place,
 * keeps plain stores) and end with an sfence. Values are identical either way; the C
 * reference ignores the flag. Callers set it from qcal_cpu_stream_stores() for large tensors. */
typedef void (*qcal_f32_fakequant_fn)(const float *src, int64_t n, const qcal_fq_run *p,
                                      float *dst, uint8_t *mask, bool stream);
typedef void (*qcal_f32_fakequant_fused_fn)(const float *src, const float *gy, int64_t n,
                                            const qcal_fq_run *p, float *dst, float *gx,
                                            bool stream);
typedef void (*qcal_f32_fakequant_backward_fn)(const float *gy, const uint8_t *mask, int64_t n,
                                               float *gx, bool stream);

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

typedef void (*qcal_f32_lsq_backward_fn)(const float *x, const float *gy, int64_t n,
                                         const qcal_lsq_run *p, float *gx, double *acc_s,
                                         double *acc_z, bool stream);

typedef struct qcal_fakequant_dsp {
    qcal_f32_fakequant_fn fakequant;
    qcal_f32_fakequant_fused_fn fakequant_fused;
    qcal_f32_fakequant_backward_fn fakequant_backward;
    qcal_f32_lsq_backward_fn lsq_backward;
} qcal_fakequant_dsp;

void qcal_fakequant_dsp_init(qcal_fakequant_dsp *dsp, qcal_isa isa);
void qcal_fakequant_dsp_init_avx2(qcal_fakequant_dsp *dsp);
void qcal_fakequant_dsp_init_avx512(qcal_fakequant_dsp *dsp);
const qcal_fakequant_dsp *qcal_fakequant_dsp_get(void);

/* Combines 16 lane accumulators in a fixed pairwise order. */
double qcal_lsq_lanes_sum(const double *acc);

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

void qcal_f32_lsq_backward__c(const float *x, const float *gy, int64_t n,
                              const qcal_lsq_run *p, float *gx, double *acc_s, double *acc_z,
                              bool stream);
void qcal_f32_lsq_backward__avx2(const float *x, const float *gy, int64_t n,
                                 const qcal_lsq_run *p, float *gx, double *acc_s,
                                 double *acc_z, bool stream);
void qcal_f32_lsq_backward__avx512(const float *x, const float *gy, int64_t n,
                                   const qcal_lsq_run *p, float *gx, double *acc_s,
                                   double *acc_z, bool stream);

#endif
