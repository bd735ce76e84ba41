/* Learnable fake-quant (LSQ): torch._fake_quantize_learnable_per_{tensor,channel}_affine and
 * their backward, with the arithmetic of PyTorch 1.13's ATen CPU kernels
 * (fake_quantize_learnable_tensor_grad_kernel_cpu, _fake_quantize_grad_learnable_channel_
 * kernel_cpu).
 *
 * Per element (float), q = nearbyintf(zp + x * inv_scale):
 *   inside [qmin, qmax]: dx = dy,  d_scale = dy * (xfq - x) * inv_scale * g,  d_zp = 0
 *   below / above:       dx = 0,   d_scale = dy * (qmin|qmax - zp) * g,  d_zp = -dy * scale * g
 * with xfq = (clamp(q) - zp) * scale. The x86 builds of ATen (Debian's python3-torch, run
 * with the AVX2/AVX-512 kernels) contract `zp + x * inv_scale` and `xfq - x` into fused
 * multiply-adds; measured on this machine's PyTorch 1.13 (tests/ref/gen_fakequant.py probes
 * ~9k near-tie inputs where contraction changes q), so qcal uses fmaf() for both: correctly
 * rounded on every CPU, identical to PyTorch here. Note the backward's q rounds *after*
 * adding zp while the forward rounds before, so at near-ties the backward's inside/outside
 * decision can differ from the forward mask: reproduced, not "fixed", because it is what
 * PyTorch's gradients are.
 *
 * NaN inputs: ATen casts q to int64 (NaN -> INT64_MIN), i.e. "below qmin". qcal follows
 * its NaN policy (qcal/fakequant.h): a NaN q is the zero-point, y = 0.0 does not depend on
 * scale or zero-point, so d_scale = d_zp = 0 and dx = dy * 0.0f. +Inf and q >= 2^63: 1.13
 * also says "below" (defect); qcal says "above".
 * dx is dy * (0.0f or 1.0f), as ATen (masked negative gradients are -0.0f).
 *
 * Zero-point: the forward rounds the float zero-point half to even and clamps it (ATen's
 * _get_zero_point_from_tensor(is_forward=true); per channel zero_point.round().clamp()).
 * PyTorch 1.13's per-tensor backward uses trunc(clamp(zp + 0.5)) instead, which differs
 * from the forward for exact .5 ties and negative fractional zero-points (a defect: the
 * gradient is taken at another zero-point than the one used forward); qcal uses the
 * forward's rounding in the backward too.
 *
 * Sums: d_scale and d_zp terms (float) are summed in double in 16 lanes: element j of a
 * span of same-parameter elements goes to lane j % 16, each lane adds in element order,
 * and the lanes are combined by a fixed pairwise tree (qcal_lsq_lanes_sum). The C, AVX2
 * and AVX-512 kernels do exactly these additions, so the sums are bit-identical between
 * ISAs. Per tensor: spans are fixed blocks of LRN_BLOCK elements whose lane sums are
 * combined in block order; per channel: each channel's rows are spans (each starting at
 * lane 0) accumulated in row order by one thread. Either way the result does not depend
 * on the thread count. (Before the SIMD kernels, one sequential double sum per block:
 * 1.6 GB/s; the vector kernels run at the memory bandwidth.) */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "fakequant/fakequant_impl.h"
#include "qcal_config.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define QCAL_LRN_X86 1
#else
#define QCAL_LRN_X86 0
#endif

#define LRN_BLOCK 65536

int64_t qcal_fq_round_zero_point(float zero_point, int64_t quant_min, int64_t quant_max)
{
    float z = nearbyintf(zero_point);
    if (z < (float)quant_min)
        z = (float)quant_min;
    if (z > (float)quant_max)
        z = (float)quant_max;
    return (int64_t)z;
}

qcal_status qcal_fakequant_grad_factor(int64_t numel, int64_t quant_max, double *out)
{
    if (!out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "output is NULL");
    if (numel < 1 || quant_max < 1)
        return qcal_error(QCAL_ERR_INVALID_ARG,
                          "grad_factor needs numel >= 1 and quant_max >= 1 (got %lld, %lld)",
                          (long long)numel, (long long)quant_max);
    /* Python: 1.0 / (X.numel() * self.quant_max) ** 0.5 (integer product, then double). */
    *out = 1.0 / sqrt((double)numel * (double)quant_max);
    return QCAL_OK;
}

static qcal_status check_learnable_scale(float scale, float zero_point, int64_t channel)
{
    char where[48] = "";
    if (channel >= 0)
        snprintf(where, sizeof where, " (channel %lld)", (long long)channel);
    if (!(scale > 0.0f && isfinite(scale)))
        return qcal_error(QCAL_ERR_INVALID_ARG,
                          "learnable scale %g%s must be > 0 and finite (clamp it to >= eps "
                          "after each optimiser step)",
                          (double)scale, where);
    if (!isfinite(zero_point))
        return qcal_error(QCAL_ERR_INVALID_ARG, "learnable zero_point %g%s is not finite",
                          (double)zero_point, where);
    return QCAL_OK;
}

/* ----------------------------------------------------------------------------------- */
/* Backward kernels (C reference, AVX2, AVX-512). Per element j of a span, in float:
 *   q  = nearbyintf(fmaf(x, inv, zp))          (round half to even; PyTorch's FMA)
 *   q NaN:   dx = dy * 0.0f; ds = dz = 0.0f  (NaN policy)
 *   inside = q >= qmin && q <= qmax
 *   inside:  dx = dy * 1.0f;  ds = ((dy * fmaf(q - zp, scale, -x)) * inv) * g;  dz = 0.0f
 *   outside: dx = dy * 0.0f;  ds = (dy * (below ? qmin - zp : qmax - zp)) * g;
 *            dz = ((-dy) * scale) * g        (-dy: ATen's dy * -1, the same value)
 * then acc_s[j % 16] += (double)ds, acc_z[j % 16] += (double)dz. The SIMD versions do the
 * same operations lane by lane (vrndscaleps / vroundps to nearest even, vfmadd/vfmsub are
 * fmaf, float -> double conversion is exact), so all ISAs give identical accumulators. */

static inline void lsq_elem(float x, float dy, const qcal_lsq_run *p, float *dx, float *ds,
                            float *dz)
{
    float q = nearbyintf(fmaf(x, p->inv_scale, p->zp));
    if (q != q) {   /* NaN policy: y is the zero-point (0.0), constant: no gradient */
        *dx = dy * 0.0f;
        *ds = 0.0f;
        *dz = 0.0f;
        return;
    }
    bool below = !(q >= p->qmin);
    bool above = q > p->qmax;
    if (below || above) {
        *dx = dy * 0.0f;
        *dz = -dy * p->scale * p->grad_factor;
        *ds = dy * (below ? p->qmin - p->zp : p->qmax - p->zp) * p->grad_factor;
    } else {
        *dx = dy * 1.0f;
        *dz = 0.0f;
        *ds = dy * fmaf(q - p->zp, p->scale, -x) * p->inv_scale * p->grad_factor;
    }
}

/* Elements [j0, j1) of a span; lane j % 16. */
static void lsq_range(const float *x, const float *gy, int64_t j0, int64_t j1,
                      const qcal_lsq_run *p, float *gx, double *acc_s, double *acc_z)
{
    for (int64_t j = j0; j < j1; j++) {
        float dx, ds, dz;
        lsq_elem(x[j], gy[j], p, &dx, &ds, &dz);
        if (gx)
            gx[j] = dx;
        acc_s[j % QCAL_LSQ_LANES] += (double)ds;
        acc_z[j % QCAL_LSQ_LANES] += (double)dz;
    }
}

void qcal_f32_lsq_backward__c(const float *x, const float *gy, int64_t n,
                              const qcal_lsq_run *p, float *gx, double *acc_s, double *acc_z,
                              bool stream)
{
    (void)stream;
    lsq_range(x, gy, 0, n, p, gx, acc_s, acc_z);
}

double qcal_lsq_lanes_sum(const double *acc)
{
    double t[QCAL_LSQ_LANES];
    memcpy(t, acc, sizeof t);
    for (int w = QCAL_LSQ_LANES / 2; w >= 1; w /= 2)
        for (int k = 0; k < w; k++)
            t[k] += t[k + w];
    return t[0];
}

/* SIMD span layout: a scalar head [0, k) (k < 16; to gx's vector alignment when
 * streaming, else 0), full vectors of 16 from k, a scalar tail. Register lane v of the
 * vector part holds span element j with j % 16 == (v + k) % 16: the accumulators are
 * rotated by k on load and back on store. */
static inline int64_t lsq_head(const float *gx, int64_t n, bool stream, unsigned align)
{
    if (!stream || !gx || (uintptr_t)gx % 4)
        return 0;
    int64_t k = (int64_t)((align - (uintptr_t)gx % align) % align / 4);
    return k < n ? k : n;
}

/* Hides where a local lane buffer lives, so the compiler keeps the unaligned vector moves
 * written in the kernels: it would otherwise give the array 64-byte alignment and emit
 * vmovapd, and ASan's fake stack (detect_stack_use_after_return, used in CI) only aligns
 * locals to 32 bytes — that combination faulted. */
static inline double *lsq_unaligned(double *p)
{
    __asm__("" : "+r"(p));
    return p;
}

static inline void lsq_rot_load(const double *acc, int64_t k, double *reg)
{
    for (int v = 0; v < QCAL_LSQ_LANES; v++)
        reg[v] = acc[(v + k) % QCAL_LSQ_LANES];
}

static inline void lsq_rot_store(const double *reg, int64_t k, double *acc)
{
    for (int v = 0; v < QCAL_LSQ_LANES; v++)
        acc[(v + k) % QCAL_LSQ_LANES] = reg[v];
}

#if QCAL_LRN_X86
#define AVX2_TARGET __attribute__((target("avx2,fma")))
#define AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl")))

/* Eight elements: dx, ds, dz as in lsq_elem. */
AVX2_TARGET static inline void avx2_lsq(__m256 x, __m256 dy, __m256 inv, __m256 zp,
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

AVX2_TARGET void qcal_f32_lsq_backward__avx2(const float *x, const float *gy, int64_t n,
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

AVX512_TARGET void qcal_f32_lsq_backward__avx512(const float *x, const float *gy, int64_t n,
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
#else
void qcal_f32_lsq_backward__avx2(const float *x, const float *gy, int64_t n,
                                 const qcal_lsq_run *p, float *gx, double *acc_s,
                                 double *acc_z, bool stream)
{
    qcal_f32_lsq_backward__c(x, gy, n, p, gx, acc_s, acc_z, stream);
}
void qcal_f32_lsq_backward__avx512(const float *x, const float *gy, int64_t n,
                                   const qcal_lsq_run *p, float *gx, double *acc_s,
                                   double *acc_z, bool stream)
{
    qcal_f32_lsq_backward__c(x, gy, n, p, gx, acc_s, acc_z, stream);
}
#endif

typedef void (*lsq_kernel)(const float *, const float *, int64_t, const qcal_lsq_run *,
                           float *, double *, double *, bool);

static lsq_kernel lsq_kernel_get(void)
{
    static const lsq_kernel table[3] = { qcal_f32_lsq_backward__c, qcal_f32_lsq_backward__avx2,
                                         qcal_f32_lsq_backward__avx512 };
    return table[qcal_cpu_isa()];
}

static void lsq_run_init(qcal_lsq_run *r, float scale, float zero_point, int64_t quant_min,
                         int64_t quant_max, float grad_factor)
{
    r->scale = scale;
    r->inv_scale = 1.0f / scale;
    r->zp = (float)qcal_fq_round_zero_point(zero_point, quant_min, quant_max);
    r->qmin = (float)quant_min;
    r->qmax = (float)quant_max;
    r->grad_factor = grad_factor;
}

static qcal_status lrn_per_tensor_backward(
    const float *src, const float *grad_y, int64_t n, float scale, float zero_point,
    int64_t quant_min, int64_t quant_max, float grad_factor, float *grad_x,
    float *grad_scale, float *grad_zero_point)
{
    if (!src || !grad_y || !grad_scale || !grad_zero_point)
        return qcal_error(QCAL_ERR_INVALID_ARG, "input, gradient or output is NULL");
    if (n < 1)
        return qcal_error(n == 0 ? QCAL_ERR_EMPTY : QCAL_ERR_INVALID_ARG,
                          "element count %lld must be >= 1", (long long)n);
    qcal_status st = check_learnable_scale(scale, zero_point, -1);
    if (st == QCAL_OK)
        st = qcal_fq_check_range(quant_min, quant_max);
    if (st != QCAL_OK)
        return st;
    if (!isfinite(grad_factor))
        return qcal_error(QCAL_ERR_INVALID_ARG, "grad_factor %g is not finite",
                          (double)grad_factor);
    int64_t nblk = (n + LRN_BLOCK - 1) / LRN_BLOCK;
    double *part = qcal_malloc((size_t)nblk * 2 * sizeof *part);
    if (!part)
        return QCAL_ERR_NO_MEMORY;
    qcal_lsq_run p;
    lsq_run_init(&p, scale, zero_point, quant_min, quant_max, grad_factor);
    const lsq_kernel k = lsq_kernel_get();
    /* Reads x, grad_y, writes grad_x: stream grad_x when that overflows the cache. */
    const bool stream = grad_x && grad_x != grad_y && qcal_fq_stream(n * 12);
    int nt = qcal_threads_for(n);
#if QCAL_HAVE_OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt) if (nt > 1)
#endif
    for (int64_t b = 0; b < nblk; b++) {
        int64_t i0 = b * LRN_BLOCK, m = n - i0 < LRN_BLOCK ? n - i0 : LRN_BLOCK;
        double as[QCAL_LSQ_LANES] = { 0 }, az[QCAL_LSQ_LANES] = { 0 };
        k(src + i0, grad_y + i0, m, &p, grad_x ? grad_x + i0 : NULL, as, az, stream);
        part[2 * b] = qcal_lsq_lanes_sum(as);
        part[2 * b + 1] = qcal_lsq_lanes_sum(az);
    }
    (void)nt;
    double s = 0.0, z = 0.0;
    for (int64_t b = 0; b < nblk; b++) {
        s += part[2 * b];
        z += part[2 * b + 1];
    }
    free(part);
    *grad_scale = (float)s;
    *grad_zero_point = (float)z;
    return QCAL_OK;
}

static qcal_status check_channel_params(int64_t ch, const float *scale, const float *zero_point)
{
    if (!scale || !zero_point)
        return qcal_error(QCAL_ERR_INVALID_ARG, "per-channel scale or zero_point is NULL");
    for (int64_t c = 0; c < ch; c++) {
        qcal_status st = check_learnable_scale(scale[c], zero_point[c], c);
        if (st != QCAL_OK)
            return st;
    }
    return QCAL_OK;
}

/* src split around axis into (outer, ch, inner), then the per-channel parameters and the
 * quantization range checked. */
static qcal_status channel_prepare(const qcal_tensor *src, int32_t axis, const float *scale,
                                   const float *zero_point, int64_t quant_min,
                                   int64_t quant_max, int64_t *outer, int64_t *ch,
                                   int64_t *inner)
{
    qcal_status st = qcal_fq_split(src, axis, outer, ch, inner);
    if (st == QCAL_OK)
        st = check_channel_params(*ch, scale, zero_point);
    if (st == QCAL_OK)
        st = qcal_fq_check_range(quant_min, quant_max);
    return st;
}

static qcal_status lrn_per_channel_backward(
    const qcal_tensor *src, const float *grad_y, int32_t axis, const float *scale,
    const float *zero_point, int64_t quant_min, int64_t quant_max, float grad_factor,
    float *grad_x, float *grad_scale, float *grad_zero_point)
{
    if (!grad_y || !grad_scale || !grad_zero_point)
        return qcal_error(QCAL_ERR_INVALID_ARG, "gradient or output is NULL");
    int64_t outer, ch, inner;
    qcal_status st = channel_prepare(src, axis, scale, zero_point, quant_min, quant_max,
                                     &outer, &ch, &inner);
    if (st == QCAL_OK && !isfinite(grad_factor))
        st = qcal_error(QCAL_ERR_INVALID_ARG, "grad_factor %g is not finite",
                        (double)grad_factor);
    if (st != QCAL_OK)
        return st;
    const float *x = src->data;
    const lsq_kernel k = lsq_kernel_get();
    const int64_t n = outer * ch * inner;
    const bool stream = grad_x && grad_x != grad_y && qcal_fq_stream(n * 12);
    int nt = qcal_threads_for(n);
#if QCAL_HAVE_OPENMP
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
#endif
    for (int64_t c = 0; c < ch; c++) {
        qcal_lsq_run p;
        lsq_run_init(&p, scale[c], zero_point[c], quant_min, quant_max, grad_factor);
        /* Every row's span starts at lane 0; lanes accumulate across rows in row order. */
        double as[QCAL_LSQ_LANES] = { 0 }, az[QCAL_LSQ_LANES] = { 0 };
        for (int64_t o = 0; o < outer; o++) {
            int64_t base = (o * ch + c) * inner;
            k(x + base, grad_y + base, inner, &p, grad_x ? grad_x + base : NULL, as, az,
              stream);
        }
        grad_scale[c] = (float)qcal_lsq_lanes_sum(as);
        grad_zero_point[c] = (float)qcal_lsq_lanes_sum(az);
    }
    (void)nt;
    return QCAL_OK;
}

/* ----------------------------------------------------------------------------------- */
/* Public entry points */

qcal_status qcal_fakequant_learnable_forward(const qcal_tensor *src, const qcal_qparams *qp,
                                             qcal_tensor *dst, uint8_t *mask)
{
    int64_t n = 0;
    qcal_status st = qcal_fq_check_args("fakequant learnable", src, qp, true, &n);
    if (st == QCAL_OK)
        st = qcal_fq_check_out("fakequant learnable", dst, n, "destination");
    if (st != QCAL_OK)
        return st;
    /* The fixed forward with the rounded, clamped zero-points. */
    qcal_qparams v = *qp;
    v.owned = NULL;
    v.zero_points_float = NULL;
    int32_t *zp = NULL;
    if (qcal_qscheme_is_per_channel(qp->qscheme)) {
        zp = qcal_malloc((size_t)qp->channels * sizeof *zp);
        if (!zp)
            return QCAL_ERR_NO_MEMORY;
        for (int64_t c = 0; c < qp->channels; c++)
            zp[c] = (int32_t)qcal_fq_round_zero_point(qp->zero_points_float[c], qp->quant_min,
                                                      qp->quant_max);
        v.zero_points = zp;
        v.qscheme = QCAL_PER_CHANNEL_AFFINE;
    } else {
        v.zero_point = (int32_t)qcal_fq_round_zero_point(qp->zero_point_float, qp->quant_min,
                                                         qp->quant_max);
    }
    st = qcal_fakequant_forward(src, &v, dst, mask);
    free(zp);
    return st;
}

qcal_status qcal_fakequant_learnable_backward(const qcal_tensor *src, const qcal_tensor *grad_y,
                                              const qcal_qparams *qp, float grad_factor,
                                              qcal_tensor *grad_x, float *grad_scale,
                                              float *grad_zero_point)
{
    int64_t n = 0;
    qcal_status st = qcal_fq_check_args("fakequant learnable", src, qp, true, &n);
    if (st == QCAL_OK)
        st = qcal_fq_check_out("fakequant learnable", grad_y, n, "grad_y");
    if (st == QCAL_OK && grad_x)
        st = qcal_fq_check_out("fakequant learnable", grad_x, n, "grad_x");
    if (st != QCAL_OK)
        return st;
    float *gx = grad_x ? grad_x->data : NULL;
    if (qcal_qscheme_is_per_channel(qp->qscheme))
        return lrn_per_channel_backward(src, grad_y->data, qp->axis, qp->scales,
                                        qp->zero_points_float, qp->quant_min, qp->quant_max,
                                        grad_factor, gx, grad_scale, grad_zero_point);
    return lrn_per_tensor_backward(src->data, grad_y->data, n, qp->scale, qp->zero_point_float,
                                   qp->quant_min, qp->quant_max, grad_factor, gx, grad_scale,
                                   grad_zero_point);
}
