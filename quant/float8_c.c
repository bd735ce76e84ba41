/* FP8 kernel family: C references and the function table (quant/float8_dsp.h). */
#include "quant/float8_kernels.h"

void qcal_f32_quantize_f8__c(const float *x, int64_t n, float scale, int fmt, uint8_t *dst,
                             bool stream)
{
    (void)stream;
    for (int64_t i = 0; i < n; i++)
        dst[i] = f8_encode(x[i] / scale, fmt);
}

void qcal_f8_dequantize__c(const uint8_t *q, int64_t n, float scale, int fmt, float *dst)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] = f8_decode(q[i], fmt) * scale;
}

void qcal_f32_fakequant_f8__c(const float *src, int64_t n, float scale, int fmt, float *dst,
                              uint8_t *mask, bool stream)
{
    (void)stream;
    for (int64_t i = 0; i < n; i++) {
        bool in;
        float y = f8_fq(src[i], scale, fmt, &in);
        dst[i] = y;
        if (mask)
            mask[i] = (uint8_t)in;
    }
}

/* v, hidden from the optimiser (a multiply by 0.0f / 1.0f stays a multiply). */
static inline float f8_opaque(float v)
{
#if defined(__x86_64__) || defined(__i386__)
    __asm__("" : "+x"(v));
#else
    __asm__("" : "+g"(v));
#endif
    return v;
}

void qcal_f32_fakequant_f8_fused__c(const float *src, const float *gy, int64_t n, float scale,
                                    int fmt, float *dst, float *gx, bool stream)
{
    (void)stream;
    for (int64_t i = 0; i < n; i++) {
        bool in;
        float y = f8_fq(src[i], scale, fmt, &in);
        float g = gy[i] * f8_opaque(in ? 1.0f : 0.0f);
        dst[i] = y;
        gx[i] = g;
    }
}

void qcal_float8_dsp_init(qcal_float8_dsp *dsp, qcal_isa isa)
{
    dsp->quantize = qcal_f32_quantize_f8__c;
    dsp->dequantize = qcal_f8_dequantize__c;
    dsp->fakequant = qcal_f32_fakequant_f8__c;
    dsp->fakequant_fused = qcal_f32_fakequant_f8_fused__c;
#if QCAL_HAVE_X86_SIMD
    if (isa >= QCAL_ISA_AVX2)
        qcal_float8_dsp_init_avx2(dsp);
    if (isa >= QCAL_ISA_AVX512)
        qcal_float8_dsp_init_avx512(dsp);
#else
    (void)isa;
#endif
}

QCAL_DSP_DEFINE_GET(float8)
