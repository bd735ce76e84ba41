/* Quantize kernel family: C references and the function table (quant/quantize_dsp.h). */
#include <math.h>

#include "quant/quantize_dsp.h"

static inline int32_t quant_one8(float x, float inv, float lo, float hi, int32_t zp)
{
    float v = x * inv;
    if (v != v)
        return zp;            /* NaN -> zero-point */
    v = v < lo ? lo : v;
    v = v > hi ? hi : v;
    return (int32_t)nearbyintf(v) + zp;
}

void qcal_f32_quantize_u8__c(const float *x, int64_t n, float inv, int32_t zp, uint8_t *dst)
{
    const float lo = (float)(0 - zp), hi = (float)(255 - zp);
    for (int64_t i = 0; i < n; i++)
        dst[i] = (uint8_t)quant_one8(x[i], inv, lo, hi, zp);
}

void qcal_f32_quantize_i8__c(const float *x, int64_t n, float inv, int32_t zp, int8_t *dst)
{
    const float lo = (float)(-128 - zp), hi = (float)(127 - zp);
    for (int64_t i = 0; i < n; i++)
        dst[i] = (int8_t)quant_one8(x[i], inv, lo, hi, zp);
}

/* qint32: bounds INT32_MIN - zp, INT32_MAX - zp are exact in double; the clamped value is
 * rounded in double (same as nearbyintf on the float) and the zero-point added exactly.
 * qint32 tensors are biases (small), so there is no SIMD version. */
void qcal_f32_quantize_i32__c(const float *x, int64_t n, float inv, int32_t zp, int32_t *dst)
{
    const double lo = (double)INT32_MIN - zp, hi = (double)INT32_MAX - zp;
    for (int64_t i = 0; i < n; i++) {
        float v = x[i] * inv;
        if (v != v) {
            dst[i] = zp;
            continue;
        }
        double d = v;
        d = d < lo ? lo : d;
        d = d > hi ? hi : d;
        dst[i] = (int32_t)((int64_t)nearbyint(d) + zp);
    }
}

/* Same arithmetic as quant_one8 with parameters per position (lo[i] = qmin - zp[i],
 * hi[i] = qmax - zp[i] as floats): used for per-channel quantize when a channel's run of
 * contiguous elements (inner) is short, e.g. channels on the last axis. */
void qcal_f32_quantize_prow8__c(const float *x, int64_t n, const float *inv, const float *lo,
                                const float *hi, const int32_t *zp, uint8_t *dst)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] = (uint8_t)quant_one8(x[i], inv[i], lo[i], hi[i], zp[i]);
}

/* Dequantize (elementwise; the compiler vectorises these loops). */
void qcal_u8_dequantize__c(const void *src, int64_t off, int64_t n, float scale, int32_t zp,
                           float *dst)
{
    const uint8_t *q = (const uint8_t *)src + off;
    for (int64_t i = 0; i < n; i++)
        dst[i] = (float)((int32_t)q[i] - zp) * scale;
}

void qcal_i8_dequantize__c(const void *src, int64_t off, int64_t n, float scale, int32_t zp,
                           float *dst)
{
    const int8_t *q = (const int8_t *)src + off;
    for (int64_t i = 0; i < n; i++)
        dst[i] = (float)((int32_t)q[i] - zp) * scale;
}

/* The difference in int64: PyTorch subtracts in int32, which wraps for q near INT32_MIN/MAX
 * (e.g. q = INT32_MIN, zp = 3 dequantizes to +2^31 * scale there). */
void qcal_i32_dequantize__c(const void *src, int64_t off, int64_t n, float scale, int32_t zp,
                            float *dst)
{
    const int32_t *q = (const int32_t *)src + off;
    for (int64_t i = 0; i < n; i++)
        dst[i] = (float)((int64_t)q[i] - zp) * scale;
}

void qcal_quantize_dsp_init(qcal_quantize_dsp *dsp, qcal_isa isa)
{
    dsp->quantize_u8 = qcal_f32_quantize_u8__c;
    dsp->quantize_i8 = qcal_f32_quantize_i8__c;
    dsp->quantize_i32 = qcal_f32_quantize_i32__c;
    dsp->quantize_prow8 = qcal_f32_quantize_prow8__c;
    dsp->dequantize_u8 = qcal_u8_dequantize__c;
    dsp->dequantize_i8 = qcal_i8_dequantize__c;
    dsp->dequantize_i32 = qcal_i32_dequantize__c;
#if QCAL_HAVE_X86_SIMD
    if (isa >= QCAL_ISA_AVX2)
        qcal_quantize_dsp_init_avx2(dsp);
    if (isa >= QCAL_ISA_AVX512)
        qcal_quantize_dsp_init_avx512(dsp);
#else
    (void)isa;
#endif
}

QCAL_DSP_DEFINE_GET(quantize)
