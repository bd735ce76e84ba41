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
 * on the thread count. (Before the SIMD kernels, one sequential double sum per block was
 * far below the memory bandwidth the vector kernels reach: docs/performance.md.) */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "fakequant/fakequant_impl.h"
#include "qcal_config.h"


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
    const qcal_f32_lsq_backward_fn k = qcal_fakequant_dsp_get()->lsq_backward;
    /* Reads x, grad_y, writes grad_x: stream grad_x when that overflows the cache. */
    const bool stream = grad_x && grad_x != grad_y && qcal_cpu_stream_stores(n * 12);
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
    const qcal_f32_lsq_backward_fn k = qcal_fakequant_dsp_get()->lsq_backward;
    const int64_t n = outer * ch * inner;
    const bool stream = grad_x && grad_x != grad_y && qcal_cpu_stream_stores(n * 12);
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
                                             qcal_tensor_mut *dst, uint8_t *mask)
{
    int64_t n = 0;
    qcal_status st = qcal_fq_check_args("fakequant learnable", src, qp, true, &n);
    if (st == QCAL_OK)
        st = qcal_fq_check_dst("fakequant learnable", dst, n, "destination");
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
                                              qcal_tensor_mut *grad_x, float *grad_scale,
                                              float *grad_zero_point)
{
    int64_t n = 0;
    qcal_status st = qcal_fq_check_args("fakequant learnable", src, qp, true, &n);
    if (st == QCAL_OK)
        st = qcal_fq_check_out("fakequant learnable", grad_y, n, "grad_y");
    if (st == QCAL_OK && grad_x)
        st = qcal_fq_check_dst("fakequant learnable", grad_x, n, "grad_x");
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
