/* float32 -> quint8 per-tensor affine quantization of the int8 runtime's input, with a
 * portable C reference and AVX2 / AVX-512 versions chosen at run time.
 *
 * Rounding contract (the one of qcal/quantize.h, bit-identical to PyTorch's
 * quantize_per_tensor for finite inputs): q = clamp(zp + nearbyintf(x * inv_scale), 0, 255)
 * in float32, inv_scale = 1.0f / scale, round half to even under the default rounding mode,
 * clamp in float before converting. NaN gives zp, +-Inf saturate (PyTorch 1.13 gives 0 for
 * both through an undefined float->int64 cast). */
#include <math.h>
#include <stdint.h>

#include "core/cpu.h"
#include "quant/onednn_quantize.h"
#include "qcal_config.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define QCAL_X86 1
#else
#define QCAL_X86 0
#endif

int64_t qcal_f32_quantize_u8_count__c(const float *src, int64_t n, float inv_scale, int32_t zp,
                                uint8_t *dst)
{
    const float zpf = (float)zp;
    int64_t nonfinite = 0;
    for (int64_t i = 0; i < n; i++) {
        float x = src[i];
        nonfinite += !isfinite(x);
        float v = x * inv_scale;
        if (v != v) {           /* NaN */
            dst[i] = (uint8_t)zp;
            continue;
        }
        float q = zpf + nearbyintf(v);
        q = q < 0.0f ? 0.0f : q;
        q = q > 255.0f ? 255.0f : q;
        dst[i] = (uint8_t)(int32_t)q;
    }
    return nonfinite;
}

#if QCAL_X86
__attribute__((target("avx2,fma")))
int64_t qcal_f32_quantize_u8_count__avx2(const float *src, int64_t n, float inv_scale, int32_t zp,
                                   uint8_t *dst)
{
    const __m256 vinv = _mm256_set1_ps(inv_scale);
    const __m256 vzp = _mm256_set1_ps((float)zp);
    const __m256 vlo = _mm256_setzero_ps();
    const __m256 vhi = _mm256_set1_ps(255.0f);
    const __m256i absmask = _mm256_set1_epi32(0x7fffffff);
    const __m256i maxfin = _mm256_set1_epi32(0x7f7fffff);
    int64_t nonfinite = 0;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(src + i);
        __m256i bits = _mm256_and_si256(_mm256_castps_si256(x), absmask);
        __m256i nf = _mm256_cmpgt_epi32(bits, maxfin);
        nonfinite += __builtin_popcount((unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(nf)));
        __m256 v = _mm256_mul_ps(x, vinv);
        __m256 r = _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m256 q = _mm256_add_ps(vzp, r);
        q = _mm256_min_ps(_mm256_max_ps(q, vlo), vhi);
        __m256 isnan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
        q = _mm256_blendv_ps(q, vzp, isnan);
        __m256i qi = _mm256_cvtps_epi32(q);
        __m128i w16 = _mm_packus_epi32(_mm256_castsi256_si128(qi), _mm256_extracti128_si256(qi, 1));
        __m128i w8 = _mm_packus_epi16(w16, w16);
        _mm_storel_epi64((__m128i *)(dst + i), w8);
    }
    if (i < n)
        nonfinite += qcal_f32_quantize_u8_count__c(src + i, n - i, inv_scale, zp, dst + i);
    return nonfinite;
}

__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl")))
int64_t qcal_f32_quantize_u8_count__avx512(const float *src, int64_t n, float inv_scale, int32_t zp,
                                     uint8_t *dst)
{
    const __m512 vinv = _mm512_set1_ps(inv_scale);
    const __m512 vzp = _mm512_set1_ps((float)zp);
    const __m512 vlo = _mm512_setzero_ps();
    const __m512 vhi = _mm512_set1_ps(255.0f);
    int64_t nonfinite = 0;
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1u);
        __m512 x = _mm512_maskz_loadu_ps(m, src + i);
        /* classes: QNaN 0x01, +Inf 0x08, -Inf 0x10, SNaN 0x80 */
        __mmask16 nf = _mm512_mask_fpclass_ps_mask(m, x, 0x01 | 0x08 | 0x10 | 0x80);
        nonfinite += __builtin_popcount((unsigned)nf);
        __m512 v = _mm512_mul_ps(x, vinv);
        __m512 r = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m512 q = _mm512_add_ps(vzp, r);
        q = _mm512_min_ps(_mm512_max_ps(q, vlo), vhi);
        __mmask16 isnan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        q = _mm512_mask_mov_ps(q, isnan, vzp);
        _mm512_mask_cvtusepi32_storeu_epi8(dst + i, m, _mm512_cvtps_epi32(q));
    }
    return nonfinite;
}
#else
int64_t qcal_f32_quantize_u8_count__avx2(const float *src, int64_t n, float inv_scale, int32_t zp,
                                   uint8_t *dst)
{
    return qcal_f32_quantize_u8_count__c(src, n, inv_scale, zp, dst);
}
int64_t qcal_f32_quantize_u8_count__avx512(const float *src, int64_t n, float inv_scale, int32_t zp,
                                     uint8_t *dst)
{
    return qcal_f32_quantize_u8_count__c(src, n, inv_scale, zp, dst);
}
#endif

qcal_f32_quantize_u8_count_fn qcal_f32_quantize_u8_count_best(void)
{
    switch (qcal_cpu_isa()) {
    case QCAL_ISA_AVX512: return qcal_f32_quantize_u8_count__avx512;
    case QCAL_ISA_AVX2: return qcal_f32_quantize_u8_count__avx2;
    default: return qcal_f32_quantize_u8_count__c;
    }
}

int64_t qcal_f32_quantize_u8_count(const float *src, int64_t n, float inv_scale, int32_t zp,
                             uint8_t *dst)
{
    qcal_f32_quantize_u8_count_fn fn = qcal_f32_quantize_u8_count_best();
    int threads = qcal_threads_for(n);
    if (threads <= 1)
        return fn(src, n, inv_scale, zp, dst);
    /* Independent chunks of 64-element multiples; counts combined in chunk order. */
    enum { MAX_CHUNKS = 256 };
    int64_t partial[MAX_CHUNKS];
    int chunks = threads * 4 < MAX_CHUNKS ? threads * 4 : MAX_CHUNKS;
    int64_t step = ((n + chunks - 1) / chunks + 63) & ~(int64_t)63;
#if QCAL_HAVE_OPENMP
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
    for (int c = 0; c < chunks; c++) {
        int64_t lo = (int64_t)c * step;
        int64_t hi = lo + step < n ? lo + step : n;
        partial[c] = lo < hi ? fn(src + lo, hi - lo, inv_scale, zp, dst + lo) : 0;
    }
    int64_t total = 0;
    for (int c = 0; c < chunks; c++)
        total += partial[c];
    return total;
}
