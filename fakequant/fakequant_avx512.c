/* Fake-quant kernel family, AVX-512 (fakequant/fakequant_dsp.h; built with the AVX-512
 * F/BW/DQ/VL flags): 16 lanes at a time, masked loads/stores for the edges; same bits as
 * the C reference. */
#include <immintrin.h>

#include "fakequant/fakequant_kernels.h"

static inline __m512 avx512_fq(__m512 x, __m512 inv, __m512 zp, __m512 qmin,
                                             __m512 qmax, __m512 scale, __mmask16 *mask)
{
    __m512 q = _mm512_add_ps(zp, _mm512_roundscale_ps(_mm512_mul_ps(x, inv),
                                                      _MM_FROUND_TO_NEAREST_INT |
                                                          _MM_FROUND_NO_EXC));
    *mask = _mm512_cmp_ps_mask(q, qmin, _CMP_GE_OQ) & _mm512_cmp_ps_mask(q, qmax, _CMP_LE_OQ);
    __m512 c = _mm512_min_ps(_mm512_max_ps(q, qmin), qmax);
    __mmask16 ord = _mm512_cmp_ps_mask(q, q, _CMP_ORD_Q);    /* NaN lanes: c - zp -> +0 */
    return _mm512_mul_ps(_mm512_maskz_sub_ps(ord, c, zp), scale);
}

static inline void avx512_store(float *d, __m512 v, bool nt)
{
    if (nt)
        _mm512_stream_ps(d, v);
    else
        _mm512_storeu_ps(d, v);
}

/* Masked (partial) vectors: the first k < 16 elements, plain stores. */
static inline void avx512_fwd_part(const float *src, int64_t k,
                                                 const qcal_fq_run *p, float *dst,
                                                 uint8_t *mask)
{
    const __m512 inv = _mm512_set1_ps(p->inv_scale), zp = _mm512_set1_ps(p->zp);
    const __m512 qmin = _mm512_set1_ps(p->qmin), qmax = _mm512_set1_ps(p->qmax);
    const __m512 scale = _mm512_set1_ps(p->scale);
    __mmask16 t = (__mmask16)((1u << k) - 1u), m;
    __m512 y = avx512_fq(_mm512_maskz_loadu_ps(t, src), inv, zp, qmin, qmax, scale, &m);
    _mm512_mask_storeu_ps(dst, t, y);
    if (mask)
        _mm_mask_storeu_epi8(mask, t, _mm_maskz_mov_epi8(m, _mm_set1_epi8(1)));
}

void qcal_f32_fakequant__avx512(const float *src, int64_t n,
                                              const qcal_fq_run *p, float *dst,
                                              uint8_t *mask, bool stream)
{
    const __m512 inv = _mm512_set1_ps(p->inv_scale), zp = _mm512_set1_ps(p->zp);
    const __m512 qmin = _mm512_set1_ps(p->qmin), qmax = _mm512_set1_ps(p->qmax);
    const __m512 scale = _mm512_set1_ps(p->scale);
    const __m128i ones = _mm_set1_epi8(1);
    int64_t i = 0;
    bool sd = false, sm = false;
    if (stream && dst != src) {
        int64_t k = fq_peel(dst, n, 64, 4);
        if (k >= 0) {
            if (k > 0)
                avx512_fwd_part(src, k, p, dst, mask);
            i = k;
            sd = true;
            sm = mask && fq_aligned(mask + i, 16);
        }
    }
    for (; i + 16 <= n; i += 16) {
        __mmask16 m;
        __m512 y = avx512_fq(_mm512_loadu_ps(src + i), inv, zp, qmin, qmax, scale, &m);
        avx512_store(dst + i, y, sd);
        if (mask) {
            __m128i mb = _mm_maskz_mov_epi8(m, ones);
            if (sm)
                _mm_stream_si128((__m128i *)(mask + i), mb);
            else
                _mm_storeu_si128((__m128i *)(mask + i), mb);
        }
    }
    if (sd)
        _mm_sfence();
    if (i < n)
        avx512_fwd_part(src + i, n - i, p, dst + i, mask ? mask + i : NULL);
}

static inline void avx512_fused_part(const float *src, const float *gy,
                                                   int64_t k, const qcal_fq_run *p,
                                                   float *dst, float *gx)
{
    const __m512 inv = _mm512_set1_ps(p->inv_scale), zp = _mm512_set1_ps(p->zp);
    const __m512 qmin = _mm512_set1_ps(p->qmin), qmax = _mm512_set1_ps(p->qmax);
    const __m512 scale = _mm512_set1_ps(p->scale), one = _mm512_set1_ps(1.0f);
    __mmask16 t = (__mmask16)((1u << k) - 1u), m;
    __m512 y = avx512_fq(_mm512_maskz_loadu_ps(t, src), inv, zp, qmin, qmax, scale, &m);
    __m512 g = _mm512_mul_ps(_mm512_maskz_loadu_ps(t, gy), _mm512_maskz_mov_ps(m, one));
    _mm512_mask_storeu_ps(dst, t, y);
    _mm512_mask_storeu_ps(gx, t, g);
}

void qcal_f32_fakequant_fused__avx512(const float *src, const float *gy,
                                                    int64_t n, const qcal_fq_run *p,
                                                    float *dst, float *gx, bool stream)
{
    const __m512 inv = _mm512_set1_ps(p->inv_scale), zp = _mm512_set1_ps(p->zp);
    const __m512 qmin = _mm512_set1_ps(p->qmin), qmax = _mm512_set1_ps(p->qmax);
    const __m512 scale = _mm512_set1_ps(p->scale), one = _mm512_set1_ps(1.0f);
    int64_t i = 0;
    bool sd = false, sg = false;
    if (stream) {
        int64_t k = fq_peel(dst, n, 64, 4);
        if (k >= 0) {
            if (k > 0)
                avx512_fused_part(src, gy, k, p, dst, gx);
            i = k;
            sd = dst != src;
            sg = gx != gy && fq_aligned(gx + i, 64);
        }
    }
    if (sd && sg) {
        /* The common large case, unswitched: both outputs streamed. */
        for (; i + 16 <= n; i += 16) {
            __mmask16 m;
            __m512 y = avx512_fq(_mm512_loadu_ps(src + i), inv, zp, qmin, qmax, scale, &m);
            __m512 g = _mm512_mul_ps(_mm512_loadu_ps(gy + i), _mm512_maskz_mov_ps(m, one));
            _mm512_stream_ps(dst + i, y);
            _mm512_stream_ps(gx + i, g);
        }
    }
    for (; i + 16 <= n; i += 16) {
        __mmask16 m;
        __m512 y = avx512_fq(_mm512_loadu_ps(src + i), inv, zp, qmin, qmax, scale, &m);
        __m512 g = _mm512_mul_ps(_mm512_loadu_ps(gy + i), _mm512_maskz_mov_ps(m, one));
        avx512_store(dst + i, y, sd);
        avx512_store(gx + i, g, sg);
    }
    if (sd || sg)
        _mm_sfence();
    if (i < n)
        avx512_fused_part(src + i, gy + i, n - i, p, dst + i, gx + i);
}

static inline void avx512_bwd_part(const float *gy, const uint8_t *mask,
                                                 int64_t k, float *gx)
{
    __mmask16 t = (__mmask16)((1u << k) - 1u);
    __m128i mb = _mm_maskz_loadu_epi8(t, mask);
    __mmask16 m = _mm_test_epi8_mask(mb, mb);
    __m512 g = _mm512_mul_ps(_mm512_maskz_loadu_ps(t, gy),
                             _mm512_maskz_mov_ps(m, _mm512_set1_ps(1.0f)));
    _mm512_mask_storeu_ps(gx, t, g);
}

void qcal_f32_fakequant_backward__avx512(const float *gy, const uint8_t *mask,
                                                       int64_t n, float *gx, bool stream)
{
    const __m512 one = _mm512_set1_ps(1.0f);
    int64_t i = 0;
    bool sg = false;
    if (stream && gx != gy) {
        int64_t k = fq_peel(gx, n, 64, 4);
        if (k >= 0) {
            if (k > 0)
                avx512_bwd_part(gy, mask, k, gx);
            i = k;
            sg = true;
        }
    }
    for (; i + 16 <= n; i += 16) {
        __m128i mb = _mm_loadu_si128((const __m128i *)(mask + i));
        __mmask16 m = _mm_test_epi8_mask(mb, mb);
        avx512_store(gx + i, _mm512_mul_ps(_mm512_loadu_ps(gy + i), _mm512_maskz_mov_ps(m, one)),
                     sg);
    }
    if (sg)
        _mm_sfence();
    if (i < n)
        avx512_bwd_part(gy + i, mask + i, n - i, gx + i);
}
void qcal_f32_lsq_backward__avx512(const float *x, const float *gy, int64_t n,
                                                 const qcal_lsq_run *p, float *gx,
                                                 double *acc_s, double *acc_z, bool stream)
{
    int64_t k = lsq_head(gx, n, stream && gx != gy, 64);
    lsq_range(x, gy, 0, k, p, gx, acc_s, acc_z);
    const bool nt = k < n && stream && gx && gx != gy && (uintptr_t)(gx + k) % 64 == 0;
    const __m512 inv = _mm512_set1_ps(p->inv_scale), zp = _mm512_set1_ps(p->zp);
    const __m512 qmin = _mm512_set1_ps(p->qmin), qmax = _mm512_set1_ps(p->qmax);
    const __m512 scale = _mm512_set1_ps(p->scale), g = _mm512_set1_ps(p->grad_factor);
    const __m512 cmin = _mm512_set1_ps(p->qmin - p->zp), cmax = _mm512_set1_ps(p->qmax - p->zp);
    const __m512 one = _mm512_set1_ps(1.0f), sign = _mm512_set1_ps(-0.0f);
    double rs_buf[QCAL_LSQ_LANES], rz_buf[QCAL_LSQ_LANES];
    double *rs = lsq_unaligned(rs_buf), *rz = lsq_unaligned(rz_buf);
    lsq_rot_load(acc_s, k, rs);
    lsq_rot_load(acc_z, k, rz);
    __m512d s0 = _mm512_loadu_pd(rs), s1 = _mm512_loadu_pd(rs + 8);
    __m512d z0 = _mm512_loadu_pd(rz), z1 = _mm512_loadu_pd(rz + 8);
    int64_t j = k;
    for (; j + 16 <= n; j += 16) {
        __m512 xv = _mm512_loadu_ps(x + j), dy = _mm512_loadu_ps(gy + j);
        __m512 q = _mm512_roundscale_ps(_mm512_fmadd_ps(xv, inv, zp),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __mmask16 ge = _mm512_cmp_ps_mask(q, qmin, _CMP_GE_OQ);
        __mmask16 in = ge & _mm512_cmp_ps_mask(q, qmax, _CMP_LE_OQ);
        __m512 dx = _mm512_mul_ps(dy, _mm512_maskz_mov_ps(in, one));
        if (gx) {
            if (nt)
                _mm512_stream_ps(gx + j, dx);
            else
                _mm512_storeu_ps(gx + j, dx);
        }
        __m512 f = _mm512_fmsub_ps(_mm512_sub_ps(q, zp), scale, xv);
        __m512 c = _mm512_mask_blend_ps(ge, cmin, cmax);
        c = _mm512_mask_mov_ps(c, in, f);
        __m512 t = _mm512_mul_ps(dy, c);
        t = _mm512_mask_mul_ps(t, in, t, inv);
        __mmask16 ord = _mm512_cmp_ps_mask(q, q, _CMP_ORD_Q);    /* NaN lanes: 0 */
        __m512 ds = _mm512_maskz_mul_ps(ord, t, g);
        __m512 dz = _mm512_maskz_mul_ps((__mmask16)(~in & ord),
                                        _mm512_mul_ps(_mm512_xor_ps(dy, sign), scale), g);
        s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm512_castps512_ps256(ds)));
        s1 = _mm512_add_pd(s1, _mm512_cvtps_pd(_mm512_extractf32x8_ps(ds, 1)));
        z0 = _mm512_add_pd(z0, _mm512_cvtps_pd(_mm512_castps512_ps256(dz)));
        z1 = _mm512_add_pd(z1, _mm512_cvtps_pd(_mm512_extractf32x8_ps(dz, 1)));
    }
    if (nt)
        _mm_sfence();
    _mm512_storeu_pd(rs, s0);
    _mm512_storeu_pd(rs + 8, s1);
    _mm512_storeu_pd(rz, z0);
    _mm512_storeu_pd(rz + 8, z1);
    lsq_rot_store(rs, k, acc_s);
    lsq_rot_store(rz, k, acc_z);
    lsq_range(x, gy, j, n, p, gx, acc_s, acc_z);
}

void qcal_fakequant_dsp_init_avx512(qcal_fakequant_dsp *dsp)
{
    dsp->fakequant = qcal_f32_fakequant__avx512;
    dsp->fakequant_fused = qcal_f32_fakequant_fused__avx512;
    dsp->fakequant_backward = qcal_f32_fakequant_backward__avx512;
    dsp->lsq_backward = qcal_f32_lsq_backward__avx512;
}
