/* Fake-quant kernel family: C references and the function table (fakequant/fakequant_dsp.h).
 * `stream` is a hint for the ISA versions only. */
#include "fakequant/fakequant_kernels.h"

void qcal_f32_fakequant__c(const float *src, int64_t n, const qcal_fq_run *p, float *dst,
                           uint8_t *mask, bool stream)
{
    (void)stream;
    for (int64_t i = 0; i < n; i++) {
        float q = fq_q(src[i], p);
        uint8_t m = (uint8_t)(q >= p->qmin && q <= p->qmax);
        dst[i] = fq_y(q, p);
        if (mask)
            mask[i] = m;
    }
}

void qcal_f32_fakequant_fused__c(const float *src, const float *gy, int64_t n,
                                 const qcal_fq_run *p, float *dst, float *gx, bool stream)
{
    (void)stream;
    for (int64_t i = 0; i < n; i++) {
        float q = fq_q(src[i], p);
        float m = qcal_fq_opaque((q >= p->qmin && q <= p->qmax) ? 1.0f : 0.0f);
        dst[i] = fq_y(q, p);
        gx[i] = gy[i] * m;
    }
}

void qcal_f32_fakequant_backward__c(const float *gy, const uint8_t *mask, int64_t n,
                                    float *gx, bool stream)
{
    (void)stream;
    /* A real multiply by 0.0f / 1.0f, as the ISA versions do (a select of gy[i] * 1.0f
     * would let the compiler fold it to gy[i] and keep a signalling NaN unquieted). */
    static const float keep[2] = { 0.0f, 1.0f };
    for (int64_t i = 0; i < n; i++)
        gx[i] = gy[i] * qcal_fq_opaque(keep[mask[i] != 0]);
}

void qcal_f32_lsq_backward__c(const float *x, const float *gy, int64_t n,
                              const qcal_lsq_run *p, float *gx, double *acc_s, double *acc_z,
                              bool stream)
{
    (void)stream;
    lsq_range(x, gy, 0, n, p, gx, acc_s, acc_z);
}

double qcal_lsq_lanes_sum(const double *acc)
{
    double t[QCAL_LSQ_LANES];
    memcpy(t, acc, sizeof t);
    for (int w = QCAL_LSQ_LANES / 2; w >= 1; w /= 2)
        for (int k = 0; k < w; k++)
            t[k] += t[k + w];
    return t[0];
}

void qcal_fakequant_dsp_init(qcal_fakequant_dsp *dsp, qcal_isa isa)
{
    dsp->fakequant = qcal_f32_fakequant__c;
    dsp->fakequant_fused = qcal_f32_fakequant_fused__c;
    dsp->fakequant_backward = qcal_f32_fakequant_backward__c;
    dsp->lsq_backward = qcal_f32_lsq_backward__c;
#if QCAL_HAVE_X86_SIMD
    if (isa >= QCAL_ISA_AVX2)
        qcal_fakequant_dsp_init_avx2(dsp);
    if (isa >= QCAL_ISA_AVX512)
        qcal_fakequant_dsp_init_avx512(dsp);
#else
    (void)isa;
#endif
}

QCAL_DSP_DEFINE_GET(fakequant)
