/* Quantize kernel family, AVX-512 (quant/quantize_dsp.h; built with the AVX-512 F/BW/DQ/VL
 * flags): 64 codes per iteration, then 16, the C reference for the tail. */
#include <immintrin.h>

#include "quant/quantize_dsp.h"

static inline __m512i q16_avx512(const float *x, __m512 inv, __m512 lo,
                                                __m512 hi, __m512i z)
{
    __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x), inv);
    __mmask16 ord = _mm512_cmp_ps_mask(v, v, _CMP_ORD_Q);
    __m512 c = _mm512_maskz_mov_ps(ord, _mm512_min_ps(_mm512_max_ps(v, lo), hi));
    return _mm512_add_epi32(_mm512_cvtps_epi32(c), z);
}

void qcal_f32_quantize_u8__avx512(const float *x, int64_t n, float inv,
                                                int32_t zp, uint8_t *dst)
{
    const __m512 vinv = _mm512_set1_ps(inv), lo = _mm512_set1_ps((float)(0 - zp)),
                 hi = _mm512_set1_ps((float)(255 - zp));
    const __m512i z = _mm512_set1_epi32(zp);
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m128i a = _mm512_cvtepi32_epi8(q16_avx512(x + i, vinv, lo, hi, z));
        __m128i b = _mm512_cvtepi32_epi8(q16_avx512(x + i + 16, vinv, lo, hi, z));
        __m128i c = _mm512_cvtepi32_epi8(q16_avx512(x + i + 32, vinv, lo, hi, z));
        __m128i d = _mm512_cvtepi32_epi8(q16_avx512(x + i + 48, vinv, lo, hi, z));
        __m512i r = _mm512_inserti64x2(_mm512_castsi128_si512(a), b, 1);
        r = _mm512_inserti64x2(r, c, 2);
        r = _mm512_inserti64x2(r, d, 3);
        _mm512_storeu_si512((void *)(dst + i), r);
    }
    for (; i + 16 <= n; i += 16)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm512_cvtepi32_epi8(q16_avx512(x + i, vinv, lo, hi, z)));
    qcal_f32_quantize_u8__c(x + i, n - i, inv, zp, dst + i);
}

void qcal_f32_quantize_i8__avx512(const float *x, int64_t n, float inv,
                                                int32_t zp, int8_t *dst)
{
    /* Same bytes as the unsigned path: vpmovdb truncates, values are in range. */
    const __m512 vinv = _mm512_set1_ps(inv), lo = _mm512_set1_ps((float)(-128 - zp)),
                 hi = _mm512_set1_ps((float)(127 - zp));
    const __m512i z = _mm512_set1_epi32(zp);
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m128i a = _mm512_cvtepi32_epi8(q16_avx512(x + i, vinv, lo, hi, z));
        __m128i b = _mm512_cvtepi32_epi8(q16_avx512(x + i + 16, vinv, lo, hi, z));
        __m128i c = _mm512_cvtepi32_epi8(q16_avx512(x + i + 32, vinv, lo, hi, z));
        __m128i d = _mm512_cvtepi32_epi8(q16_avx512(x + i + 48, vinv, lo, hi, z));
        __m512i r = _mm512_inserti64x2(_mm512_castsi128_si512(a), b, 1);
        r = _mm512_inserti64x2(r, c, 2);
        r = _mm512_inserti64x2(r, d, 3);
        _mm512_storeu_si512((void *)(dst + i), r);
    }
    for (; i + 16 <= n; i += 16)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm512_cvtepi32_epi8(q16_avx512(x + i, vinv, lo, hi, z)));
    qcal_f32_quantize_i8__c(x + i, n - i, inv, zp, dst + i);
}

void qcal_f32_quantize_prow8__avx512(const float *x, int64_t n, const float *inv,
                                                   const float *lo, const float *hi,
                                                   const int32_t *zp, uint8_t *dst)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(inv + i));
        __mmask16 ord = _mm512_cmp_ps_mask(v, v, _CMP_ORD_Q);
        __m512 c = _mm512_maskz_mov_ps(
            ord, _mm512_min_ps(_mm512_max_ps(v, _mm512_loadu_ps(lo + i)),
                               _mm512_loadu_ps(hi + i)));
        __m512i q = _mm512_add_epi32(_mm512_cvtps_epi32(c), _mm512_loadu_si512(zp + i));
        _mm_storeu_si128((__m128i *)(dst + i), _mm512_cvtepi32_epi8(q));
    }
    qcal_f32_quantize_prow8__c(x + i, n - i, inv + i, lo + i, hi + i, zp + i, dst + i);
}

void qcal_quantize_dsp_init_avx512(qcal_quantize_dsp *dsp)
{
    dsp->quantize_u8 = qcal_f32_quantize_u8__avx512;
    dsp->quantize_i8 = qcal_f32_quantize_i8__avx512;
    dsp->quantize_prow8 = qcal_f32_quantize_prow8__avx512;
}
