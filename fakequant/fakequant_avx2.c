/* Fake-quant kernel family, AVX2 (fakequant/fakequant_dsp.h; built with -mavx2 -mfma): the
 * same float operations as the C reference, 8 lanes at a time (vroundps to nearest even;
 * NaN lanes zeroed before the scale multiply); streaming stores as documented in
 * fakequant/fakequant.c. */
#include <immintrin.h>

#include "fakequant/fakequant_kernels.h"

static inline __m128i avx2_mask_bytes(__m256 m0, __m256 m1)
{
    __m256i a = _mm256_srli_epi32(_mm256_castps_si256(m0), 31);
    __m256i b = _mm256_srli_epi32(_mm256_castps_si256(m1), 31);
    __m128i a16 = _mm_packus_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    __m128i b16 = _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
    return _mm_packus_epi16(a16, b16);
}

static inline __m256 avx2_fq(__m256 x, __m256 inv, __m256 zp, __m256 qmin,
                                         __m256 qmax, __m256 scale, __m256 *mask)
{
    __m256 q = _mm256_add_ps(zp, _mm256_round_ps(_mm256_mul_ps(x, inv),
                                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    *mask = _mm256_and_ps(_mm256_cmp_ps(q, qmin, _CMP_GE_OQ), _mm256_cmp_ps(q, qmax, _CMP_LE_OQ));
    __m256 c = _mm256_min_ps(_mm256_max_ps(q, qmin), qmax);   /* max(NaN, qmin) = qmin */
    __m256 ord = _mm256_cmp_ps(q, q, _CMP_ORD_Q);             /* NaN lanes: c - zp -> +0 */
    return _mm256_mul_ps(_mm256_and_ps(_mm256_sub_ps(c, zp), ord), scale);
}

static inline void avx2_store(float *d, __m256 v, bool nt)
{
    if (nt)
        _mm256_stream_ps(d, v);
    else
        _mm256_storeu_ps(d, v);
}

void qcal_f32_fakequant__avx2(const float *src, int64_t n, const qcal_fq_run *p,
                                          float *dst, uint8_t *mask, bool stream)
{
    const __m256 inv = _mm256_set1_ps(p->inv_scale), zp = _mm256_set1_ps(p->zp);
    const __m256 qmin = _mm256_set1_ps(p->qmin), qmax = _mm256_set1_ps(p->qmax);
    const __m256 scale = _mm256_set1_ps(p->scale);
    int64_t i = 0;
    bool sd = false, sm = false;
    if (stream && dst != src) {
        int64_t k = fq_peel(dst, n, 32, 4);
        if (k >= 0) {
            qcal_f32_fakequant__c(src, k, p, dst, mask, false);
            i = k;
            sd = true;
            sm = mask && fq_aligned(mask + i, 16);
        }
    }
    for (; i + 16 <= n; i += 16) {
        __m256 m0, m1;
        __m256 y0 = avx2_fq(_mm256_loadu_ps(src + i), inv, zp, qmin, qmax, scale, &m0);
        __m256 y1 = avx2_fq(_mm256_loadu_ps(src + i + 8), inv, zp, qmin, qmax, scale, &m1);
        avx2_store(dst + i, y0, sd);
        avx2_store(dst + i + 8, y1, sd);
        if (mask) {
            __m128i mb = avx2_mask_bytes(m0, m1);
            if (sm)
                _mm_stream_si128((__m128i *)(mask + i), mb);
            else
                _mm_storeu_si128((__m128i *)(mask + i), mb);
        }
    }
    if (sd)
        _mm_sfence();
    if (i < n)
        qcal_f32_fakequant__c(src + i, n - i, p, dst + i, mask ? mask + i : NULL, false);
}

void qcal_f32_fakequant_fused__avx2(const float *src, const float *gy, int64_t n,
                                                const qcal_fq_run *p, float *dst, float *gx,
                                                bool stream)
{
    const __m256 inv = _mm256_set1_ps(p->inv_scale), zp = _mm256_set1_ps(p->zp);
    const __m256 qmin = _mm256_set1_ps(p->qmin), qmax = _mm256_set1_ps(p->qmax);
    const __m256 scale = _mm256_set1_ps(p->scale), one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    bool sd = false, sg = false;
    if (stream) {
        int64_t k = fq_peel(dst, n, 32, 4);
        if (k >= 0) {
            qcal_f32_fakequant_fused__c(src, gy, k, p, dst, gx, false);
            i = k;
            sd = dst != src;
            sg = gx != gy && fq_aligned(gx + i, 32);
        }
    }
    for (; i + 8 <= n; i += 8) {
        __m256 m;
        __m256 y = avx2_fq(_mm256_loadu_ps(src + i), inv, zp, qmin, qmax, scale, &m);
        __m256 g = _mm256_mul_ps(_mm256_loadu_ps(gy + i), _mm256_and_ps(m, one));
        avx2_store(dst + i, y, sd);
        avx2_store(gx + i, g, sg);
    }
    if (sd || sg)
        _mm_sfence();
    if (i < n)
        qcal_f32_fakequant_fused__c(src + i, gy + i, n - i, p, dst + i, gx + i, false);
}

void qcal_f32_fakequant_backward__avx2(const float *gy, const uint8_t *mask,
                                                   int64_t n, float *gx, bool stream)
{
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256i zero = _mm256_setzero_si256();
    int64_t i = 0;
    bool sg = false;
    if (stream && gx != gy) {
        int64_t k = fq_peel(gx, n, 32, 4);
        if (k >= 0) {
            qcal_f32_fakequant_backward__c(gy, mask, k, gx, false);
            i = k;
            sg = true;
        }
    }
    for (; i + 8 <= n; i += 8) {
        __m256i m = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(mask + i)));
        __m256 keep = _mm256_castsi256_ps(
            _mm256_xor_si256(_mm256_cmpeq_epi32(m, zero), _mm256_set1_epi32(-1)));
        avx2_store(gx + i, _mm256_mul_ps(_mm256_loadu_ps(gy + i), _mm256_and_ps(keep, one)), sg);
    }
    if (sg)
        _mm_sfence();
    if (i < n)
        qcal_f32_fakequant_backward__c(gy + i, mask + i, n - i, gx + i, false);
}

/* Eight elements: dx, ds, dz as in lsq_elem. */
static inline void avx2_lsq(__m256 x, __m256 dy, __m256 inv, __m256 zp,
                                        __m256 qmin, __m256 qmax, __m256 scale, __m256 g,
                                        __m256 cmin, __m256 cmax, __m256 *dx, __m256 *ds,
                                        __m256 *dz)
{
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    __m256 q = _mm256_round_ps(_mm256_fmadd_ps(x, inv, zp),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 ge = _mm256_cmp_ps(q, qmin, _CMP_GE_OQ);          /* !below */
    __m256 in = _mm256_and_ps(ge, _mm256_cmp_ps(q, qmax, _CMP_LE_OQ));
    *dx = _mm256_mul_ps(dy, _mm256_and_ps(in, one));
    __m256 f = _mm256_fmsub_ps(_mm256_sub_ps(q, zp), scale, x);   /* fmaf(q-zp, s, -x) */
    __m256 c = _mm256_blendv_ps(cmin, cmax, ge);                  /* outside: below? */
    c = _mm256_blendv_ps(c, f, in);
    __m256 t = _mm256_mul_ps(dy, c);
    t = _mm256_blendv_ps(t, _mm256_mul_ps(t, inv), in);
    __m256 ord = _mm256_cmp_ps(q, q, _CMP_ORD_Q);                /* NaN lanes: 0 */
    *ds = _mm256_and_ps(_mm256_mul_ps(t, g), ord);
    __m256 z = _mm256_mul_ps(_mm256_mul_ps(_mm256_xor_ps(dy, sign), scale), g);
    *dz = _mm256_and_ps(_mm256_andnot_ps(in, z), ord);
}

void qcal_f32_lsq_backward__avx2(const float *x, const float *gy, int64_t n,
                                             const qcal_lsq_run *p, float *gx, double *acc_s,
                                             double *acc_z, bool stream)
{
    int64_t k = lsq_head(gx, n, stream && gx != gy, 32);
    lsq_range(x, gy, 0, k, p, gx, acc_s, acc_z);
    const bool nt = k < n && stream && gx && gx != gy && (uintptr_t)(gx + k) % 32 == 0;
    const __m256 inv = _mm256_set1_ps(p->inv_scale), zp = _mm256_set1_ps(p->zp);
    const __m256 qmin = _mm256_set1_ps(p->qmin), qmax = _mm256_set1_ps(p->qmax);
    const __m256 scale = _mm256_set1_ps(p->scale), g = _mm256_set1_ps(p->grad_factor);
    const __m256 cmin = _mm256_set1_ps(p->qmin - p->zp), cmax = _mm256_set1_ps(p->qmax - p->zp);
    double rs_buf[QCAL_LSQ_LANES], rz_buf[QCAL_LSQ_LANES];
    double *rs = lsq_unaligned(rs_buf), *rz = lsq_unaligned(rz_buf);
    lsq_rot_load(acc_s, k, rs);
    lsq_rot_load(acc_z, k, rz);
    __m256d s[4], z[4];
    for (int r = 0; r < 4; r++) {
        s[r] = _mm256_loadu_pd(rs + 4 * r);
        z[r] = _mm256_loadu_pd(rz + 4 * r);
    }
    int64_t j = k;
    for (; j + 16 <= n; j += 16) {
        for (int h = 0; h < 2; h++) {
            __m256 dx, ds, dz;
            avx2_lsq(_mm256_loadu_ps(x + j + 8 * h), _mm256_loadu_ps(gy + j + 8 * h), inv, zp,
                     qmin, qmax, scale, g, cmin, cmax, &dx, &ds, &dz);
            if (gx) {
                if (nt)
                    _mm256_stream_ps(gx + j + 8 * h, dx);
                else
                    _mm256_storeu_ps(gx + j + 8 * h, dx);
            }
            s[2 * h] = _mm256_add_pd(s[2 * h], _mm256_cvtps_pd(_mm256_castps256_ps128(ds)));
            s[2 * h + 1] = _mm256_add_pd(s[2 * h + 1],
                                         _mm256_cvtps_pd(_mm256_extractf128_ps(ds, 1)));
            z[2 * h] = _mm256_add_pd(z[2 * h], _mm256_cvtps_pd(_mm256_castps256_ps128(dz)));
            z[2 * h + 1] = _mm256_add_pd(z[2 * h + 1],
                                         _mm256_cvtps_pd(_mm256_extractf128_ps(dz, 1)));
        }
    }
    if (nt)
        _mm_sfence();
    for (int r = 0; r < 4; r++) {
        _mm256_storeu_pd(rs + 4 * r, s[r]);
        _mm256_storeu_pd(rz + 4 * r, z[r]);
    }
    lsq_rot_store(rs, k, acc_s);
    lsq_rot_store(rz, k, acc_z);
    lsq_range(x, gy, j, n, p, gx, acc_s, acc_z);
}

void qcal_fakequant_dsp_init_avx2(qcal_fakequant_dsp *dsp)
{
    dsp->fakequant = qcal_f32_fakequant__avx2;
    dsp->fakequant_fused = qcal_f32_fakequant_fused__avx2;
    dsp->fakequant_backward = qcal_f32_fakequant_backward__avx2;
    dsp->lsq_backward = qcal_f32_lsq_backward__avx2;
}
