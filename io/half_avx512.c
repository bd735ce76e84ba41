/* Half-precision conversion kernel family, AVX-512 F/BW/DQ/VL (io/half_dsp.h). */
#include <immintrin.h>

#include "io/half_dsp.h"

/* vcvtph2ps is exact and quiets signalling NaNs, as the C reference does. */
void qcal_f16_to_f32_n__avx512(const void *src, size_t n, float *dst)
{
    const uint8_t *s = src;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i h = _mm256_loadu_si256((const __m256i *)(s + 2 * i));
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(h));
    }
    if (i < n)
        qcal_f16_to_f32_n__c(s + 2 * i, n - i, dst + i);
}

/* bf16 -> f32: a 16-bit shift; NaNs get the quiet bit (|bits| > 0x7f800000). */
void qcal_bf16_to_f32_n__avx512(const void *src, size_t n, float *dst)
{
    const uint8_t *s = src;
    const __m512i abs = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    const __m512i quiet = _mm512_set1_epi32(0x00400000);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i b = _mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(s + 2 * i))), 16);
        __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(b, abs), inf);
        b = _mm512_mask_or_epi32(b, nan, b, quiet);
        _mm512_storeu_si512((void *)(dst + i), b);
    }
    if (i < n) {
        __mmask16 m = (__mmask16)((1u << (n - i)) - 1);
        __m512i b = _mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, s + 2 * i)), 16);
        __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(b, abs), inf);
        b = _mm512_mask_or_epi32(b, nan, b, quiet);
        _mm512_mask_storeu_epi32(dst + i, m, b);
    }
}

void qcal_half_dsp_init_avx512(qcal_half_dsp *dsp)
{
    dsp->f16_to_f32 = qcal_f16_to_f32_n__avx512;
    dsp->bf16_to_f32 = qcal_bf16_to_f32_n__avx512;
}
