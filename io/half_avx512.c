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

void qcal_half_dsp_init_avx512(qcal_half_dsp *dsp)
{
    dsp->f16_to_f32 = qcal_f16_to_f32_n__avx512;
}
