/* Quantize kernel family, AVX2 (quant/quantize_dsp.h; built with -mavx2 -mfma): 32 codes
 * per iteration, the C reference for the tail. */
#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "quant/quantize_dsp.h"

/* 8 floats -> 8 int32 offsets from zp: clamp(x*inv) with NaN lanes zeroed, rounded
 * half-even by cvtps2dq (MXCSR default). */
static inline __m256i q8_avx2(const float *x, __m256 inv, __m256 lo, __m256 hi)
{
    __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x), inv);
    __m256 ord = _mm256_cmp_ps(v, v, _CMP_ORD_Q);
    __m256 c = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
    return _mm256_cvtps_epi32(_mm256_and_ps(c, ord));
}

static inline __m256i q32x8_avx2(const float *x, __m256 inv, __m256 lo, __m256 hi,
                                              __m256i z, bool is_unsigned)
{
    __m256i a = _mm256_add_epi32(q8_avx2(x, inv, lo, hi), z);
    __m256i b = _mm256_add_epi32(q8_avx2(x + 8, inv, lo, hi), z);
    __m256i c = _mm256_add_epi32(q8_avx2(x + 16, inv, lo, hi), z);
    __m256i d = _mm256_add_epi32(q8_avx2(x + 24, inv, lo, hi), z);
    __m256i ab = _mm256_packs_epi32(a, b);   /* in range already: no saturation occurs */
    __m256i cd = _mm256_packs_epi32(c, d);
    __m256i r = is_unsigned ? _mm256_packus_epi16(ab, cd) : _mm256_packs_epi16(ab, cd);
    return _mm256_permutevar8x32_epi32(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

void qcal_f32_quantize_u8__avx2(const float *x, int64_t n, float inv, int32_t zp,
                                            uint8_t *dst)
{
    const __m256 vinv = _mm256_set1_ps(inv), lo = _mm256_set1_ps((float)(0 - zp)),
                 hi = _mm256_set1_ps((float)(255 - zp));
    const __m256i z = _mm256_set1_epi32(zp);
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        _mm256_storeu_si256((__m256i *)(dst + i), q32x8_avx2(x + i, vinv, lo, hi, z, true));
    qcal_f32_quantize_u8__c(x + i, n - i, inv, zp, dst + i);
}

void qcal_f32_quantize_i8__avx2(const float *x, int64_t n, float inv, int32_t zp,
                                            int8_t *dst)
{
    const __m256 vinv = _mm256_set1_ps(inv), lo = _mm256_set1_ps((float)(-128 - zp)),
                 hi = _mm256_set1_ps((float)(127 - zp));
    const __m256i z = _mm256_set1_epi32(zp);
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        _mm256_storeu_si256((__m256i *)(dst + i), q32x8_avx2(x + i, vinv, lo, hi, z, false));
    qcal_f32_quantize_i8__c(x + i, n - i, inv, zp, dst + i);
}

/* Per-position parameters: 8 lanes at a time, the low byte of each int32 kept (values are
 * in [qmin, qmax] of an 8-bit type, so the byte is the u8 or i8 result). */
void qcal_f32_quantize_prow8__avx2(const float *x, int64_t n, const float *inv,
                                               const float *lo, const float *hi,
                                               const int32_t *zp, uint8_t *dst)
{
    const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                          -1, -1, 0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1,
                                          -1, -1, -1, -1);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(inv + i));
        __m256 ord = _mm256_cmp_ps(v, v, _CMP_ORD_Q);
        __m256 c = _mm256_min_ps(_mm256_max_ps(v, _mm256_loadu_ps(lo + i)),
                                 _mm256_loadu_ps(hi + i));
        __m256i q = _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_and_ps(c, ord)),
                                     _mm256_loadu_si256((const __m256i *)(zp + i)));
        __m256i b = _mm256_shuffle_epi8(q, pick);
        uint32_t w0 = (uint32_t)_mm256_extract_epi32(b, 0),
                 w1 = (uint32_t)_mm256_extract_epi32(b, 4);
        memcpy(dst + i, &w0, 4);
        memcpy(dst + i + 4, &w1, 4);
    }
    qcal_f32_quantize_prow8__c(x + i, n - i, inv + i, lo + i, hi + i, zp + i, dst + i);
}

void qcal_quantize_dsp_init_avx2(qcal_quantize_dsp *dsp)
{
    dsp->quantize_u8 = qcal_f32_quantize_u8__avx2;
    dsp->quantize_i8 = qcal_f32_quantize_i8__avx2;
    dsp->quantize_prow8 = qcal_f32_quantize_prow8__avx2;
}
