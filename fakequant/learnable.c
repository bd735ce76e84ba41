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
 * NaN inputs: ATen casts q to int64 (NaN -> INT64_MIN), i.e. "below qmin"; qcal treats NaN
 * the same. +Inf and q >= 2^63: 1.13 also says "below" (defect); qcal says "above".
 * dx is dy * (0.0f or 1.0f), as ATen (masked negative gradients are -0.0f).
 *
 * Zero-point: the forward rounds the float zero-point half to even and clamps it (ATen's
 * _get_zero_point_from_tensor(is_forward=true); per channel zero_point.round().clamp()).
 * PyTorch 1.13's per-tensor backward uses trunc(clamp(zp + 0.5)) instead, which differs
 * from the forward for exact .5 ties and negative fractional zero-points (a defect: the
 * gradient is taken at another zero-point than the one used forward); qcal uses the
 * forward's rounding in the backward too.
 *
 * Sums: d_scale and d_zp are summed in double. Per tensor over fixed blocks of LRN_BLOCK
 * elements whose partials are combined in block order; per channel each channel is summed
 * sequentially by one thread (channels are shared among threads). Either way the result
 * does not depend on the thread count. */
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

/* One element's gradients. zp: the rounded zero-point as float. */
static inline void lrn_elem(float x, float dy, float scale, float inv, float zp, float qmin,
                            float qmax, float g, float *dx, float *ds, float *dz)
{
    float q = nearbyintf(fmaf(x, inv, zp));
    bool below = !(q >= qmin);   /* NaN counts as below (ATen: INT64_MIN) */
    bool above = q > qmax;
    if (below || above) {
        *dx = dy * 0.0f;
        *dz = dy * -1.0f * scale * g;
        *ds = dy * (below ? qmin - zp : qmax - zp) * g;
    } else {
        *dx = dy * 1.0f;
        *dz = 0.0f;
        *ds = dy * fmaf(q - zp, scale, -x) * inv * g;
    }
}

/* Gradients of the elements [i0, i1) that share one set of parameters: grad_x[i] (when
 * grad_x is non-NULL) and, in element order, the scale / zero-point terms added into
 * *s / *z (double accumulators). */
static void lrn_span(const float *x, const float *gy, int64_t i0, int64_t i1, float scale,
                     float inv, float zp, float qmin, float qmax, float g, float *grad_x,
                     double *s, double *z)
{
    double ls = *s, lz = *z;
    for (int64_t i = i0; i < i1; i++) {
        float dx, ds, dz;
        lrn_elem(x[i], gy[i], scale, inv, zp, qmin, qmax, g, &dx, &ds, &dz);
        if (grad_x)
            grad_x[i] = dx;
        ls += ds;
        lz += dz;
    }
    *s = ls;
    *z = lz;
}

qcal_status qcal_fakequant_learnable_per_tensor(const float *src, int64_t n, float scale,
                                                float zero_point, int64_t quant_min,
                                                int64_t quant_max, float *dst, uint8_t *mask)
{
    qcal_status st = check_learnable_scale(scale, zero_point, -1);
    if (st == QCAL_OK)
        st = qcal_fq_check_range(quant_min, quant_max);
    if (st != QCAL_OK)
        return st;
    int64_t zp = qcal_fq_round_zero_point(zero_point, quant_min, quant_max);
    return qcal_fakequant_per_tensor(src, n, scale, (int32_t)zp, quant_min, quant_max, dst,
                                     mask);
}

qcal_status qcal_fakequant_learnable_per_tensor_backward(
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
    const float zp = (float)qcal_fq_round_zero_point(zero_point, quant_min, quant_max);
    const float inv = 1.0f / scale, qmin = (float)quant_min, qmax = (float)quant_max;
    int nt = qcal_threads_for(n);
#if QCAL_HAVE_OPENMP
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
#endif
    for (int64_t b = 0; b < nblk; b++) {
        int64_t i0 = b * LRN_BLOCK, i1 = i0 + LRN_BLOCK < n ? i0 + LRN_BLOCK : n;
        double s = 0.0, z = 0.0;
        lrn_span(src, grad_y, i0, i1, scale, inv, zp, qmin, qmax, grad_factor, grad_x, &s, &z);
        part[2 * b] = s;
        part[2 * b + 1] = z;
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

qcal_status qcal_fakequant_learnable_per_channel(const qcal_tensor *src, int32_t axis,
                                                 const float *scale, const float *zero_point,
                                                 int64_t quant_min, int64_t quant_max,
                                                 float *dst, uint8_t *mask)
{
    int64_t outer, ch, inner;
    qcal_status st = channel_prepare(src, axis, scale, zero_point, quant_min, quant_max,
                                     &outer, &ch, &inner);
    if (st != QCAL_OK)
        return st;
    int32_t *zp = qcal_malloc((size_t)ch * sizeof *zp);
    if (!zp)
        return QCAL_ERR_NO_MEMORY;
    for (int64_t c = 0; c < ch; c++)
        zp[c] = (int32_t)qcal_fq_round_zero_point(zero_point[c], quant_min, quant_max);
    st = qcal_fakequant_per_channel(src, axis, scale, zp, quant_min, quant_max, dst, mask);
    free(zp);
    return st;
}

qcal_status qcal_fakequant_learnable_per_channel_backward(
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
    /* Compute into scratch first so the outputs stay untouched on failure (none below). */
    const float *x = src->data;
    const float qmin = (float)quant_min, qmax = (float)quant_max;
    int nt = qcal_threads_for(outer * ch * inner);
#if QCAL_HAVE_OPENMP
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
#endif
    for (int64_t c = 0; c < ch; c++) {
        const float sc = scale[c], inv = 1.0f / sc;
        const float zp = (float)qcal_fq_round_zero_point(zero_point[c], quant_min, quant_max);
        double s = 0.0, z = 0.0;
        for (int64_t o = 0; o < outer; o++) {
            int64_t base = (o * ch + c) * inner;
            lrn_span(x, grad_y, base, base + inner, sc, inv, zp, qmin, qmax, grad_factor,
                     grad_x, &s, &z);
        }
        grad_scale[c] = (float)s;
        grad_zero_point[c] = (float)z;
    }
    (void)nt;
    return QCAL_OK;
}
