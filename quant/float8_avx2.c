/* FP8 kernel family, AVX2 (quant/float8_dsp.h; built with -mavx2 -mfma): the C reference's
 * operations 8 lanes at a time, the C reference for heads and tails. Encode: the float32
 * division, |v| clamped to the largest finite value, then the rounding half to even on the
 * format's grid by one float32 addition of a power of two C (subnormals alike), the code
 * read from the sum's low bits (f8_mag8), 32 codes packed at a time with their signs and
 * NaNs (f8_quant32); fake-quant does the same rounding and subtracts C again (the value of
 * the code directly: see f8_fq8). */
#include <immintrin.h>

#include "quant/float8_kernels.h"

typedef struct f8v {
    __m256 max, subinv, bound, signm, qnan;
    __m256i adj, nan7f;
    __m128i sh;
    /* dequantize */
    __m256i subthr, infc, nanlo, infbits, qnanbits;
    __m256 subscale;
    /* fake-quant rounding */
    __m256i expm, emin, cadd;
} f8v;

static inline void f8v_init(f8v *k, int fmt)
{
    const bool e4 = fmt == QCAL_F8_E4M3FN;
    const int sh = e4 ? F8_E4_SHIFT : F8_E5_SHIFT;
    k->max = _mm256_set1_ps(e4 ? F8_E4_MAX : F8_E5_MAX);
    k->subinv = _mm256_set1_ps(e4 ? 0x1p-9f : 0x1p-16f);
    k->bound = _mm256_set1_ps(e4 ? F8_E4_BOUND : F8_E5_BOUND);
    k->signm = _mm256_set1_ps(-0.0f);
    k->qnan = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC00000));
    k->adj = _mm256_set1_epi32((int)(e4 ? F8_E4_ADJ : F8_E5_ADJ));
    k->nan7f = _mm256_set1_epi32(0x7F);
    k->sh = _mm_cvtsi32_si128(sh);
    k->subthr = _mm256_set1_epi32(e4 ? 8 : 4);
    k->infc = _mm256_set1_epi32(e4 ? 0x100 : 0x7C);     /* E4M3FN has no infinity code */
    k->nanlo = _mm256_set1_epi32(e4 ? 0x7E : 0x7C);     /* m > nanlo: NaN */
    k->infbits = _mm256_set1_epi32(0x7F800000);
    k->qnanbits = _mm256_set1_epi32(0x7FC00000);
    k->subscale = k->subinv;
    k->expm = _mm256_set1_epi32(0x7F800000);
    k->emin = _mm256_set1_epi32((e4 ? 121 : 113) << 23);   /* the smallest normal's exponent */
    k->cadd = _mm256_set1_epi32(sh << 23);                   /* C = 2^(e + shift) */
}

/* Software prefetch distance of the quantize loop, in floats (2 KiB). */
#define F8_PREFETCH 512

/* The magnitude codes of 8 values v = x / scale, in int32 lanes, for the format whose
 * float32 mantissa bits dropped are `sh` (20: E4M3FN, 21: E5M2). With a = min(|v|, largest),
 * E = max(exponent bits of a, those of the smallest normal) and C = 2^(e + sh) (the float
 * with exponent bits E + (sh << 23)), the float32 addition a + C rounds a half to even at
 * the format's last mantissa bit, subnormals included (C's ulp is the format's step there),
 * and leaves the rounded multiple k of that step in the sum's low bits: bits(a + C) -
 * bits(C) = k (0..16; 16 is the next binade's first code). The code is then k plus 2^mbits
 * per binade above the smallest normal's, ((E - Emin) >> sh). NaN lanes stay NaN through
 * the min (min_ps returns its second operand when one is NaN) and give a negative lane
 * (the NaN's bits minus a C that wrapped past 2^31), which f8_quant32 turns into 0x7F. */
static inline __attribute__((always_inline)) __m256i f8_mag8(__m256 v, __m256 max, int sh)
{
    const __m256i expm = _mm256_set1_epi32(0x7F800000);
    const __m256i emin = _mm256_set1_epi32((sh == F8_E4_SHIFT ? 121 : 113) << 23);
    __m256 a = _mm256_min_ps(max, _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v));
    __m256i e = _mm256_max_epi32(_mm256_and_si256(_mm256_castps_si256(a), expm), emin);
    __m256i c = _mm256_add_epi32(e, _mm256_set1_epi32(sh << 23));
    __m256i k = _mm256_sub_epi32(_mm256_castps_si256(_mm256_add_ps(a, _mm256_castsi256_ps(c))), c);
    return _mm256_add_epi32(k, _mm256_srli_epi32(_mm256_sub_epi32(e, emin), sh));
}

/* The codes of x[0..31] / s, in order. Magnitudes 0..0x7E (0x7B) pack without saturation;
 * the signed packs turn NaN lanes into -128, which + (-1) makes 0x7F. The signs: the same
 * signed packs of the bits of v put each lane's sign in its byte's top bit. */
static inline __attribute__((always_inline)) __m256i f8_quant32(const float *x, __m256 s,
                                                                __m256 max, int sh)
{
    __m256 v0 = _mm256_div_ps(_mm256_loadu_ps(x), s);
    __m256 v1 = _mm256_div_ps(_mm256_loadu_ps(x + 8), s);
    __m256 v2 = _mm256_div_ps(_mm256_loadu_ps(x + 16), s);
    __m256 v3 = _mm256_div_ps(_mm256_loadu_ps(x + 24), s);
    /* the signs first: one register instead of four live across the magnitudes (fewer
     * spills; 1-4 points of the copy rate, docs/fp8.md) */
    __m256i sg = _mm256_packs_epi16(
        _mm256_packs_epi32(_mm256_castps_si256(v0), _mm256_castps_si256(v1)),
        _mm256_packs_epi32(_mm256_castps_si256(v2), _mm256_castps_si256(v3)));
    __m256i m01 = _mm256_packs_epi32(f8_mag8(v0, max, sh), f8_mag8(v1, max, sh));
    __m256i m = _mm256_packs_epi16(m01, _mm256_packs_epi32(f8_mag8(v2, max, sh), f8_mag8(v3, max, sh)));
    m = _mm256_add_epi8(m, _mm256_cmpgt_epi8(_mm256_setzero_si256(), m));
    m = _mm256_or_si256(m, _mm256_and_si256(sg, _mm256_set1_epi8((char)0x80)));
    return _mm256_permutevar8x32_epi32(m, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* 8 floats x -> value(encode(x / s)) * s; *inside: the mask lanes. The rounding to the
 * format's grid in the float domain: with E = the exponent bits of |v| (at least those of
 * the smallest normal), C = 2^(e + 23 - mantissa bits) and (|v| + C) - C rounds |v| half to
 * even at the format's last mantissa bit (the float32 addition's rounding), subnormal
 * multiples of 2^-9 (2^-16) included; the subtraction is exact. Same value as the C
 * reference's integer rounding. */
static inline __m256 f8_fq8(__m256 x, __m256 s, const f8v *k, __m256 *inside)
{
    __m256 v = _mm256_div_ps(x, s);
    __m256 sgn = _mm256_and_ps(v, k->signm);
    __m256 a = _mm256_andnot_ps(k->signm, v);
    *inside = _mm256_cmp_ps(a, k->bound, _CMP_LE_OQ);
    __m256 nan = _mm256_cmp_ps(a, a, _CMP_UNORD_Q);
    a = _mm256_min_ps(a, k->max);
    __m256i e = _mm256_max_epi32(_mm256_and_si256(_mm256_castps_si256(a), k->expm), k->emin);
    __m256 c = _mm256_castsi256_ps(_mm256_add_epi32(e, k->cadd));
    __m256 r = _mm256_or_ps(_mm256_sub_ps(_mm256_add_ps(a, c), c), sgn);
    r = _mm256_blendv_ps(r, _mm256_or_ps(k->qnan, sgn), nan);
    return _mm256_mul_ps(r, s);
}

/* 8 codes (int32 lanes) -> values * s. */
static inline __m256 f8_dec8(__m256i c, __m256 s, const f8v *k)
{
    __m256i m = _mm256_and_si256(c, k->nan7f);
    __m256i sign = _mm256_slli_epi32(_mm256_andnot_si256(k->nan7f, c), 24);
    __m256i rn = _mm256_add_epi32(_mm256_sll_epi32(m, k->sh), _mm256_sll_epi32(k->adj, k->sh));
    __m256i rs = _mm256_castps_si256(_mm256_mul_ps(_mm256_cvtepi32_ps(m), k->subscale));
    __m256i r = _mm256_blendv_epi8(rn, rs, _mm256_cmpgt_epi32(k->subthr, m));
    r = _mm256_blendv_epi8(r, k->infbits, _mm256_cmpeq_epi32(m, k->infc));
    r = _mm256_blendv_epi8(r, k->qnanbits, _mm256_cmpgt_epi32(m, k->nanlo));
    return _mm256_mul_ps(_mm256_castsi256_ps(_mm256_or_si256(r, sign)), s);
}

/* 32 codes of x[0..31] / s to dst, the input F8_PREFETCH floats ahead prefetched (both
 * lines of the block's 128 bytes). */
static inline __attribute__((always_inline)) void f8_quant32_to(const float *x, uint8_t *dst,
                                                                __m256 s, __m256 max, int sh,
                                                                bool stream)
{
    _mm_prefetch((const char *)(x + F8_PREFETCH), _MM_HINT_T0);
    _mm_prefetch((const char *)(x + F8_PREFETCH + 16), _MM_HINT_T0);
    __m256i r = f8_quant32(x, s, max, sh);
    if (stream)
        _mm256_stream_si256((__m256i *)dst, r);
    else
        _mm256_storeu_si256((__m256i *)dst, r);
}

/* Block of the two-stream loop, in floats (1 KiB of input, 256 codes). */
#define F8_QBLOCK 256

static inline __attribute__((always_inline)) void
f8_quantize_run(const float *x, int64_t n, float scale, int fmt, uint8_t *dst, bool stream,
                int sh)
{
    const __m256 s = _mm256_set1_ps(scale);
    const __m256 max = _mm256_set1_ps(sh == F8_E4_SHIFT ? F8_E4_MAX : F8_E5_MAX);
    int64_t i = 0;
    if (stream) {   /* codes to a 32-byte boundary first, then non-temporal stores */
        int64_t h = (int64_t)((32 - (uintptr_t)dst % 32) % 32);
        h = h < n ? h : n;
        qcal_f32_quantize_f8__c(x, h, scale, fmt, dst, false);
        i = h;
    }
    /* Two read streams: the range's halves, F8_QBLOCK floats of one then of the other. One
     * thread reads memory faster from two places at once than from one (docs/fp8.md,
     * Performance).
     * Each element still gets its own code: only the order of the work changes. */
    int64_t half = (n - i) / (2 * F8_QBLOCK) * F8_QBLOCK;
    if (half >= 4 * F8_QBLOCK) {
        const float *xa = x + i, *xb = x + i + half;
        uint8_t *da = dst + i, *db = dst + i + half;
        for (int64_t j = 0; j < half; j += F8_QBLOCK) {
            for (int u = 0; u < F8_QBLOCK; u += 32)
                f8_quant32_to(xa + j + u, da + j + u, s, max, sh, stream);
            for (int u = 0; u < F8_QBLOCK; u += 32)
                f8_quant32_to(xb + j + u, db + j + u, s, max, sh, stream);
        }
        i += 2 * half;
    }
    for (; i + 32 <= n; i += 32)
        f8_quant32_to(x + i, dst + i, s, max, sh, stream);
    if (stream)
        _mm_sfence();
    qcal_f32_quantize_f8__c(x + i, n - i, scale, fmt, dst + i, false);
}

void qcal_f32_quantize_f8__avx2(const float *x, int64_t n, float scale, int fmt, uint8_t *dst,
                                bool stream)
{
    if (fmt == QCAL_F8_E4M3FN)
        f8_quantize_run(x, n, scale, fmt, dst, stream, F8_E4_SHIFT);
    else
        f8_quantize_run(x, n, scale, fmt, dst, stream, F8_E5_SHIFT);
}

void qcal_f8_dequantize__avx2(const uint8_t *q, int64_t n, float scale, int fmt, float *dst)
{
    f8v k;
    f8v_init(&k, fmt);
    const __m256 s = _mm256_set1_ps(scale);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m128i b = _mm_loadu_si128((const __m128i *)(q + i));
        __m256 y0 = f8_dec8(_mm256_cvtepu8_epi32(b), s, &k);
        __m256 y1 = f8_dec8(_mm256_cvtepu8_epi32(_mm_srli_si128(b, 8)), s, &k);
        _mm256_storeu_ps(dst + i, y0);
        _mm256_storeu_ps(dst + i + 8, y1);
    }
    qcal_f8_dequantize__c(q + i, n - i, scale, fmt, dst + i);
}

/* Elements before `out` reaches an `align`-byte boundary (capped at n); -1 when `out` is
 * not float-aligned. */
static inline int64_t f8_peel(const void *out, int64_t n, unsigned align)
{
    uintptr_t a = (uintptr_t)out;
    if (a % 4)
        return -1;
    int64_t k = (int64_t)(((align - a % align) % align) / 4);
    return k < n ? k : n;
}

static inline void f8_store(float *d, __m256 v, bool nt)
{
    if (nt)
        _mm256_stream_ps(d, v);
    else
        _mm256_storeu_ps(d, v);
}

static inline __m128i f8_mask_bytes(__m256 m0, __m256 m1)
{
    __m256i a = _mm256_srli_epi32(_mm256_castps_si256(m0), 31);
    __m256i b = _mm256_srli_epi32(_mm256_castps_si256(m1), 31);
    __m128i a16 = _mm_packus_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    __m128i b16 = _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
    return _mm_packus_epi16(a16, b16);
}

void qcal_f32_fakequant_f8__avx2(const float *src, int64_t n, float scale, int fmt,
                                 float *dst, uint8_t *mask, bool stream)
{
    f8v k;
    f8v_init(&k, fmt);
    const __m256 s = _mm256_set1_ps(scale);
    int64_t i = 0;
    bool sd = false;
    if (stream && dst != src) {
        int64_t h = f8_peel(dst, n, 32);
        if (h >= 0) {
            qcal_f32_fakequant_f8__c(src, h, scale, fmt, dst, mask, false);
            i = h;
            sd = true;
        }
    }
    for (; i + 16 <= n; i += 16) {
        __m256 m0, m1;
        __m256 y0 = f8_fq8(_mm256_loadu_ps(src + i), s, &k, &m0);
        __m256 y1 = f8_fq8(_mm256_loadu_ps(src + i + 8), s, &k, &m1);
        f8_store(dst + i, y0, sd);
        f8_store(dst + i + 8, y1, sd);
        if (mask)
            _mm_storeu_si128((__m128i *)(mask + i), f8_mask_bytes(m0, m1));
    }
    if (sd)
        _mm_sfence();
    qcal_f32_fakequant_f8__c(src + i, n - i, scale, fmt, dst + i, mask ? mask + i : NULL, false);
}

void qcal_f32_fakequant_f8_fused__avx2(const float *src, const float *gy, int64_t n,
                                       float scale, int fmt, float *dst, float *gx,
                                       bool stream)
{
    f8v k;
    f8v_init(&k, fmt);
    const __m256 s = _mm256_set1_ps(scale), one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    bool sd = false, sg = false;
    if (stream) {
        int64_t h = f8_peel(dst, n, 32);
        if (h >= 0) {
            qcal_f32_fakequant_f8_fused__c(src, gy, h, scale, fmt, dst, gx, false);
            i = h;
            sd = dst != src;
            sg = gx != gy && (uintptr_t)(gx + i) % 32 == 0;
        }
    }
    for (; i + 8 <= n; i += 8) {
        __m256 m;
        __m256 y = f8_fq8(_mm256_loadu_ps(src + i), s, &k, &m);
        __m256 g = _mm256_mul_ps(_mm256_loadu_ps(gy + i), _mm256_and_ps(m, one));
        f8_store(dst + i, y, sd);
        f8_store(gx + i, g, sg);
    }
    if (sd || sg)
        _mm_sfence();
    qcal_f32_fakequant_f8_fused__c(src + i, gy + i, n - i, scale, fmt, dst + i, gx + i, false);
}

void qcal_float8_dsp_init_avx2(qcal_float8_dsp *dsp)
{
    dsp->quantize = qcal_f32_quantize_f8__avx2;
    dsp->dequantize = qcal_f8_dequantize__avx2;
    dsp->fakequant = qcal_f32_fakequant_f8__avx2;
    dsp->fakequant_fused = qcal_f32_fakequant_f8_fused__avx2;
}
