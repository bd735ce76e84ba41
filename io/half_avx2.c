/* Half-precision conversion kernel family, AVX2 (io/half_dsp.h). BF16 only: F16 needs
 * F16C, which qcal's AVX2 level does not require. */
#include <immintrin.h>

#include "io/half_dsp.h"

/* bf16 -> f32 is a 16-bit shift; a NaN (exponent all ones, mantissa non-zero, i.e.
 * |bits| > 0x7f800000) gets the quiet bit as the C reference does. */
void qcal_bf16_to_f32_n__avx2(const void *src, size_t n, float *dst)
{
    const uint8_t *s = src;
    const __m256i abs = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    const __m256i quiet = _mm256_set1_epi32(0x00400000);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i b = _mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(s + 2 * i))), 16);
        __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(b, abs), inf);
        b = _mm256_or_si256(b, _mm256_and_si256(nan, quiet));
        _mm256_storeu_si256((__m256i *)(dst + i), b);
    }
    if (i < n)
        qcal_bf16_to_f32_n__c(s + 2 * i, n - i, dst + i);
}

void qcal_half_dsp_init_avx2(qcal_half_dsp *dsp)
{
    dsp->bf16_to_f32 = qcal_bf16_to_f32_n__avx2;
}
