/* FP8 kernel family, AVX-512 (quant/float8_dsp.h; built with the F/BW/DQ/VL flags): the
 * AVX2 version's operations (quant/float8_avx2.c) 16 lanes at a time with mask registers;
 * the C reference for tails. */
#include <immintrin.h>

#include "quant/float8_kernels.h"

typedef struct f8z {
    __m512 max, minn, sub, subinv, bound, signm, qnan;
    __m512i halfm1, adj, one, keep, nan7f, subthr, infc, nanlo, infbits, qnanbits;
    __m512i expm, emin, cadd;
    __m128i sh;
} f8z;

static inline void f8z_init(f8z *k, int fmt)
{
    const bool e4 = fmt == QCAL_F8_E4M3FN;
    const int sh = e4 ? F8_E4_SHIFT : F8_E5_SHIFT;
    k->max = _mm512_set1_ps(e4 ? F8_E4_MAX : F8_E5_MAX);
    k->minn = _mm512_set1_ps(e4 ? F8_E4_MIN_NORMAL : F8_E5_MIN_NORMAL);
    k->sub = _mm512_set1_ps(e4 ? F8_E4_SUB : F8_E5_SUB);
    k->subinv = _mm512_set1_ps(e4 ? 0x1p-9f : 0x1p-16f);
    k->bound = _mm512_set1_ps(e4 ? F8_E4_BOUND : F8_E5_BOUND);
    k->signm = _mm512_set1_ps(-0.0f);
    k->qnan = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FC00000));
    k->halfm1 = _mm512_set1_epi32((int)((1u << (sh - 1)) - 1u));
    k->adj = _mm512_set1_epi32((int)(e4 ? F8_E4_ADJ : F8_E5_ADJ));
    k->one = _mm512_set1_epi32(1);
    k->keep = _mm512_set1_epi32((int)~((1u << sh) - 1u));
    k->nan7f = _mm512_set1_epi32(0x7F);
    k->subthr = _mm512_set1_epi32(e4 ? 8 : 4);
    k->infc = _mm512_set1_epi32(e4 ? 0x100 : 0x7C);
    k->nanlo = _mm512_set1_epi32(e4 ? 0x7E : 0x7C);
    k->infbits = _mm512_set1_epi32(0x7F800000);
    k->qnanbits = _mm512_set1_epi32(0x7FC00000);
    k->sh = _mm_cvtsi32_si128(sh);
    k->expm = _mm512_set1_epi32(0x7F800000);
    k->emin = _mm512_set1_epi32((e4 ? 121 : 113) << 23);
    k->cadd = _mm512_set1_epi32(sh << 23);
}

static inline __m512i f8_enc16(__m512 v, const f8z *k)
{
    __m512i vi = _mm512_castps_si512(v);
    __m512 a = _mm512_castsi512_ps(_mm512_andnot_si512(_mm512_castps_si512(k->signm), vi));
    __mmask16 nan = _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
    a = _mm512_min_ps(a, k->max);
    __mmask16 sub = _mm512_cmp_ps_mask(a, k->minn, _CMP_LT_OQ);
    __m512i cs = _mm512_cvtps_epi32(_mm512_mul_ps(a, k->sub));
    __m512i ab = _mm512_castps_si512(a);
    __m512i lsb = _mm512_and_si512(_mm512_srl_epi32(ab, k->sh), k->one);
    __m512i cn = _mm512_sub_epi32(
        _mm512_srl_epi32(_mm512_add_epi32(_mm512_add_epi32(ab, k->halfm1), lsb), k->sh), k->adj);
    __m512i c = _mm512_mask_blend_epi32(sub, cn, cs);
    c = _mm512_or_si512(c, _mm512_srli_epi32(
                               _mm512_and_si512(vi, _mm512_castps_si512(k->signm)), 24));
    /* NaN lanes held the largest code (0x7E / 0x7B): | 0x7F makes them sign | 0x7F */
    return _mm512_mask_or_epi32(c, nan, c, k->nan7f);
}

/* The rounding of quant/float8_avx2.c's f8_fq8: (|v| + C) - C with C = 2^(e + shift). */
static inline __m512 f8_fq16(__m512 x, __m512 s, const f8z *k, __mmask16 *inside)
{
    __m512 v = _mm512_div_ps(x, s);
    __m512i vi = _mm512_castps_si512(v);
    __m512i sgn = _mm512_and_si512(vi, _mm512_castps_si512(k->signm));
    __m512 a = _mm512_castsi512_ps(_mm512_andnot_si512(_mm512_castps_si512(k->signm), vi));
    *inside = _mm512_cmp_ps_mask(a, k->bound, _CMP_LE_OQ);
    __mmask16 nan = _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
    a = _mm512_min_ps(a, k->max);
    __m512i e = _mm512_max_epi32(_mm512_and_si512(_mm512_castps_si512(a), k->expm), k->emin);
    __m512 c = _mm512_castsi512_ps(_mm512_add_epi32(e, k->cadd));
    __m512i r = _mm512_castps_si512(_mm512_sub_ps(_mm512_add_ps(a, c), c));
    r = _mm512_mask_blend_epi32(nan, r, k->qnanbits);
    r = _mm512_or_si512(r, sgn);
    return _mm512_mul_ps(_mm512_castsi512_ps(r), s);
}

static inline __m512 f8_dec16(__m512i c, __m512 s, const f8z *k)
{
    __m512i m = _mm512_and_si512(c, k->nan7f);
    __m512i sign = _mm512_slli_epi32(_mm512_andnot_si512(k->nan7f, c), 24);
    __m512i rn = _mm512_add_epi32(_mm512_sll_epi32(m, k->sh), _mm512_sll_epi32(k->adj, k->sh));
    __m512i rs = _mm512_castps_si512(_mm512_mul_ps(_mm512_cvtepi32_ps(m), k->subinv));
    __m512i r = _mm512_mask_blend_epi32(_mm512_cmpgt_epi32_mask(k->subthr, m), rn, rs);
    r = _mm512_mask_blend_epi32(_mm512_cmpeq_epi32_mask(m, k->infc), r, k->infbits);
    r = _mm512_mask_blend_epi32(_mm512_cmpgt_epi32_mask(m, k->nanlo), r, k->qnanbits);
    return _mm512_mul_ps(_mm512_castsi512_ps(_mm512_or_si512(r, sign)), s);
}

void qcal_f32_quantize_f8__avx512(const float *x, int64_t n, float scale, int fmt,
                                  uint8_t *dst, bool stream)
{
    f8z k;
    f8z_init(&k, fmt);
    const __m512 s = _mm512_set1_ps(scale);
    int64_t i = 0;
    if (stream) {   /* codes to a 32-byte boundary first, then non-temporal stores */
        int64_t h = (int64_t)((32 - (uintptr_t)dst % 32) % 32);
        h = h < n ? h : n;
        qcal_f32_quantize_f8__c(x, h, scale, fmt, dst, false);
        i = h;
    }
    for (; i + 32 <= n; i += 32) {
        __m512i a = f8_enc16(_mm512_div_ps(_mm512_loadu_ps(x + i), s), &k);
        __m512i b = f8_enc16(_mm512_div_ps(_mm512_loadu_ps(x + i + 16), s), &k);
        __m256i r = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm512_cvtepi32_epi8(a)),
                                            _mm512_cvtepi32_epi8(b), 1);
        if (stream)
            _mm256_stream_si256((__m256i *)(dst + i), r);
        else
            _mm256_storeu_si256((__m256i *)(dst + i), r);
    }
    if (stream)
        _mm_sfence();
    qcal_f32_quantize_f8__c(x + i, n - i, scale, fmt, dst + i, false);
}

void qcal_f8_dequantize__avx512(const uint8_t *q, int64_t n, float scale, int fmt, float *dst)
{
    f8z k;
    f8z_init(&k, fmt);
    const __m512 s = _mm512_set1_ps(scale);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m128i b = _mm_loadu_si128((const __m128i *)(q + i));
        _mm512_storeu_ps(dst + i, f8_dec16(_mm512_cvtepu8_epi32(b), s, &k));
    }
    qcal_f8_dequantize__c(q + i, n - i, scale, fmt, dst + i);
}

static inline int64_t f8_peel(const void *out, int64_t n, unsigned align)
{
    uintptr_t a = (uintptr_t)out;
    if (a % 4)
        return -1;
    int64_t k = (int64_t)(((align - a % align) % align) / 4);
    return k < n ? k : n;
}

static inline void f8_store(float *d, __m512 v, bool nt)
{
    if (nt)
        _mm512_stream_ps(d, v);
    else
        _mm512_storeu_ps(d, v);
}

void qcal_f32_fakequant_f8__avx512(const float *src, int64_t n, float scale, int fmt,
                                   float *dst, uint8_t *mask, bool stream)
{
    f8z k;
    f8z_init(&k, fmt);
    const __m512 s = _mm512_set1_ps(scale);
    const __m512i one = _mm512_set1_epi32(1);
    int64_t i = 0;
    bool sd = false;
    if (stream && dst != src) {
        int64_t h = f8_peel(dst, n, 64);
        if (h >= 0) {
            qcal_f32_fakequant_f8__c(src, h, scale, fmt, dst, mask, false);
            i = h;
            sd = true;
        }
    }
    for (; i + 16 <= n; i += 16) {
        __mmask16 m;
        __m512 y = f8_fq16(_mm512_loadu_ps(src + i), s, &k, &m);
        f8_store(dst + i, y, sd);
        if (mask)
            _mm_storeu_si128((__m128i *)(mask + i),
                             _mm512_cvtepi32_epi8(_mm512_maskz_mov_epi32(m, one)));
    }
    if (sd)
        _mm_sfence();
    qcal_f32_fakequant_f8__c(src + i, n - i, scale, fmt, dst + i, mask ? mask + i : NULL, false);
}

void qcal_f32_fakequant_f8_fused__avx512(const float *src, const float *gy, int64_t n,
                                         float scale, int fmt, float *dst, float *gx,
                                         bool stream)
{
    f8z k;
    f8z_init(&k, fmt);
    const __m512 s = _mm512_set1_ps(scale), one = _mm512_set1_ps(1.0f);
    int64_t i = 0;
    bool sd = false, sg = false;
    if (stream) {
        int64_t h = f8_peel(dst, n, 64);
        if (h >= 0) {
            qcal_f32_fakequant_f8_fused__c(src, gy, h, scale, fmt, dst, gx, false);
            i = h;
            sd = dst != src;
            sg = gx != gy && (uintptr_t)(gx + i) % 64 == 0;
        }
    }
    for (; i + 16 <= n; i += 16) {
        __mmask16 m;
        __m512 y = f8_fq16(_mm512_loadu_ps(src + i), s, &k, &m);
        __m512 g = _mm512_mul_ps(_mm512_loadu_ps(gy + i), _mm512_maskz_mov_ps(m, one));
        f8_store(dst + i, y, sd);
        f8_store(gx + i, g, sg);
    }
    if (sd || sg)
        _mm_sfence();
    qcal_f32_fakequant_f8_fused__c(src + i, gy + i, n - i, scale, fmt, dst + i, gx + i, false);
}

void qcal_float8_dsp_init_avx512(qcal_float8_dsp *dsp)
{
    dsp->quantize = qcal_f32_quantize_f8__avx512;
    dsp->dequantize = qcal_f8_dequantize__avx512;
    dsp->fakequant = qcal_f32_fakequant_f8__avx512;
    dsp->fakequant_fused = qcal_f32_fakequant_f8_fused__avx512;
}
