/* Half-precision conversion kernel family: C references and the function table
 * (io/half_dsp.h). */
#include <string.h>

#include "io/half_dsp.h"

float qcal_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1F;
    uint32_t man = h & 0x3FF;
    uint32_t bits;
    if (exp == 0x1F) {
        bits = sign | 0x7F800000u | (man << 13) | (man ? 0x00400000u : 0);   /* inf / quiet NaN */
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else {
        /* subnormal: value = man * 2^-24, exact in float */
        float f = (float)man * 0x1p-24f;
        memcpy(&bits, &f, 4);
        bits |= sign;
    }
    float out;
    memcpy(&out, &bits, 4);
    return out;
}

float qcal_bf16_to_f32(uint16_t b)
{
    uint32_t bits = (uint32_t)b << 16;
    if ((bits & 0x7F800000u) == 0x7F800000u && (bits & 0x007FFFFFu))
        bits |= 0x00400000u;   /* keep NaN quiet */
    float out;
    memcpy(&out, &bits, 4);
    return out;
}

void qcal_f16_to_f32_n__c(const void *src, size_t n, float *dst)
{
    const uint8_t *s = src;
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, s + 2 * i, 2);
        dst[i] = qcal_f16_to_f32(h);
    }
}

void qcal_bf16_to_f32_n__c(const void *src, size_t n, float *dst)
{
    const uint8_t *s = src;
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, s + 2 * i, 2);
        dst[i] = qcal_bf16_to_f32(h);
    }
}

void qcal_half_dsp_init(qcal_half_dsp *dsp, qcal_isa isa)
{
    dsp->f16_to_f32 = qcal_f16_to_f32_n__c;
    dsp->bf16_to_f32 = qcal_bf16_to_f32_n__c;
#if QCAL_HAVE_X86_SIMD
    if (isa >= QCAL_ISA_AVX512)
        qcal_half_dsp_init_avx512(dsp);
#else
    (void)isa;
#endif
}

QCAL_DSP_DEFINE_GET(half)
