/* Quantize / dequantize, bit-identical to PyTorch 1.13 on x86 (ATen's quantize_val /
 * dequantize_val; the Debian build has no fbgemm, and its arithmetic is the same):
 *
 *   inv_scale = 1.0f / scale                        (float32)
 *   q = clamp(zero_point + nearbyintf(x * inv_scale), qmin, qmax)
 *   x' = (float)(q - zero_point) * scale            (float32)
 *
 * Rounding contract: round half to even through nearbyintf / cvtps2dq under the default
 * rounding mode. We clamp x * inv_scale to [qmin - zp, qmax - zp] in float *before*
 * rounding: the bounds are integers, so round(clamp(v)) == clamp(round(v)), and nothing
 * ever converts an out-of-range float. PyTorch instead converts zp + round(v) to int64
 * (undefined for NaN, +-Inf and |v| >= 2^63; x86 gives INT64_MIN, i.e. qmin) and adds zp in
 * float (for qint32 a zero-point beyond 2^24 loses bits). qcal saturates +Inf / huge values
 * to qmax, -Inf to qmin, maps NaN to the zero-point and adds the zero-point exactly; on
 * every other input the result is PyTorch's, bit for bit (tests/test_quantize.c). */
#include <math.h>
#include <string.h>

#include "core/cpu.h"
#include "core/internal.h"
#include "qcal/quantize.h"
#include "quant/float8_dsp.h"
#include "qcal/qparams.h"
#include "quant/quantize_dsp.h"
#include "qcal_config.h"

size_t qcal_dtype_size(qcal_dtype dtype)
{
    switch (dtype) {
    case QCAL_QUINT8:
    case QCAL_QINT8:
    case QCAL_FLOAT8_E4M3FN:
    case QCAL_FLOAT8_E5M2: return 1;
    case QCAL_QINT32: return 4;
    }
    return 0;
}

/* One quantize kernel call for dtype (the table's slot of that dtype). */
static void quant_call(const qcal_quantize_dsp *d, qcal_dtype dtype, const float *x, int64_t n,
                       float inv, int32_t zp, void *dst)
{
    switch (dtype) {
    case QCAL_QUINT8: d->quantize_u8(x, n, inv, zp, dst); return;
    case QCAL_QINT8: d->quantize_i8(x, n, inv, zp, dst); return;
    case QCAL_QINT32: d->quantize_i32(x, n, inv, zp, dst); return;
    case QCAL_FLOAT8_E4M3FN:
    case QCAL_FLOAT8_E5M2: return;   /* float8_run */
    }
}

static void dtype_limits(qcal_dtype dtype, int64_t *lo, int64_t *hi)
{
    switch (dtype) {
    case QCAL_QUINT8: *lo = 0; *hi = 255; return;
    case QCAL_QINT8: *lo = -128; *hi = 127; return;
    case QCAL_QINT32: *lo = INT32_MIN; *hi = INT32_MAX; return;
    case QCAL_FLOAT8_E4M3FN:
    case QCAL_FLOAT8_E5M2: break;
    }
    *lo = 0;
    *hi = -1;
}

/* Runs f over n elements in blocks, in parallel above the threading threshold
 * (elementwise: the result does not depend on the thread count). */
static void run_quant(qcal_dtype dtype, const float *x, int64_t n, float inv, int32_t zp,
                      uint8_t *dst, size_t esz)
{
    const qcal_quantize_dsp *d = qcal_quantize_dsp_get();
    int nt = qcal_threads_for(n);
    if (nt <= 1) {
        quant_call(d, dtype, x, n, inv, zp, dst);
        return;
    }
    const int64_t block = 1 << 16;
    int64_t nblocks = (n + block - 1) / block;
#if QCAL_HAVE_OPENMP
#pragma omp parallel for num_threads(nt) schedule(static)
#endif
    for (int64_t b = 0; b < nblocks; b++) {
        int64_t s = b * block, len = n - s < block ? n - s : block;
        quant_call(d, dtype, x + s, len, inv, zp, dst + (size_t)s * esz);
    }
}

static void quantize_per_tensor(const float *x, int64_t n, float scale, int32_t zero_point,
                                qcal_dtype dtype, void *dst)
{
    const float inv = 1.0f / scale;
    run_quant(dtype, x, n, inv, zero_point, dst, qcal_dtype_size(dtype));
}

/* shape split around axis: outer * C * inner. */
static qcal_status split_axis(const qcal_tensor *t, int32_t axis, int64_t channels,
                              int64_t *outer, int64_t *inner)
{
    int64_t n;
    qcal_status st = qcal_tensor_numel(t, &n);
    if (st != QCAL_OK)
        return st;
    int32_t a;
    if ((st = qcal_tensor_axis(t, axis, &a)) != QCAL_OK)
        return st;
    if (t->shape[a] != channels)
        return qcal_error(QCAL_ERR_MISMATCH,
                          "%lld scales/zero-points given but axis %d has %lld channels",
                          (long long)channels, (int)axis, (long long)t->shape[a]);
    int64_t o = 1, in = 1;
    for (int32_t i = 0; i < a; i++)
        o *= t->shape[i];          /* cannot overflow: numel succeeded */
    for (int32_t i = a + 1; i < t->ndim; i++)
        in *= t->shape[i];
    *outer = o;
    *inner = in;
    return QCAL_OK;
}

/* Per-channel quantize when each channel's contiguous run (inner) is short: the
 * parameters are expanded once over one slab of W = channels * inner positions and every
 * slab (outer index) runs a per-position kernel, instead of one kernel call per `inner`
 * elements. Same arithmetic per element (inv = 1.0f / scale[c]). Returns false (nothing
 * written) if the parameter rows cannot be allocated or W is very large. */
static bool quant_short_rows(const float *x, int64_t outer, int64_t channels, int64_t inner,
                             const float *scales, const int32_t *zps, qcal_dtype dtype,
                             uint8_t *dst, int nt)
{
    int64_t w = channels * inner;
    if (w > ((int64_t)1 << 22))
        return false;
    /* Short slabs are grouped: the parameter rows repeat `rep` times (>= ~1024 positions)
     * so one kernel call covers rep slabs. */
    int64_t rep = w >= 1024 ? 1 : (1024 + w - 1) / w;
    if (rep > outer)
        rep = outer;
    int64_t pw = rep * w;
    float *p = qcal_malloc((size_t)pw * 3 * sizeof(float));
    int32_t *z = qcal_malloc((size_t)pw * sizeof(int32_t));
    if (!p || !z) {
        free(p);
        free(z);
        return false;
    }
    int64_t qlo, qhi;
    dtype_limits(dtype, &qlo, &qhi);
    float *inv = p, *lo = p + pw, *hi = p + 2 * pw;
    for (int64_t k = 0; k < pw; k++) {
        int64_t c = (k % w) / inner;
        inv[k] = 1.0f / scales[c];
        lo[k] = (float)(qlo - zps[c]);
        hi[k] = (float)(qhi - zps[c]);
        z[k] = zps[c];
    }
    qcal_f32_quantize_prow8_fn f = qcal_quantize_dsp_get()->quantize_prow8;
    (void)nt;
    /* x is (outer, W); groups of rep slabs are independent. */
    int64_t groups = (outer + rep - 1) / rep;
#if QCAL_HAVE_OPENMP
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
#endif
    for (int64_t g = 0; g < groups; g++) {
        int64_t o = g * rep, cnt = outer - o < rep ? outer - o : rep;
        f(x + o * w, cnt * w, inv, lo, hi, z, dst + o * w);
    }
    free(p);
    free(z);
    return true;
}

static void quantize_per_channel(const float *x, int64_t outer, int64_t channels, int64_t inner,
                                 const float *scales, const int32_t *zero_points,
                                 qcal_dtype dtype, void *dst)
{
    int64_t rows = outer * channels;
    const qcal_quantize_dsp *dsp = qcal_quantize_dsp_get();
    size_t esz = qcal_dtype_size(dtype);
    uint8_t *d = dst;
    int nt = qcal_threads_for(rows * inner);
    (void)nt;
    if (inner < 16 && dtype != QCAL_QINT32 &&
        quant_short_rows(x, outer, channels, inner, scales, zero_points, dtype, d, nt))
        return;
    /* x is (outer, C, inner); each (o, c) row of inner elements uses channel c. Per
     * channel inv_scale = 1.0f / scale[c], as ATen's quantize_val. */
#if QCAL_HAVE_OPENMP
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
#endif
    for (int64_t r = 0; r < rows; r++) {
        int64_t c = r % channels;
        quant_call(dsp, dtype, x + r * inner, inner, 1.0f / scales[c], zero_points[c],
                   d + (size_t)(r * inner) * esz);
    }
}

/* FP8 quantize (codes != NULL: x -> codes) or dequantize (codes -> y) of (outer, C, inner)
 * with channel c's scale (quant/float8_dsp.h has the arithmetic): rows of `inner` elements,
 * long rows cut into blocks, in parallel above the threading threshold (elementwise: the
 * result does not depend on the thread count). */
static void float8_run(const float *x, const uint8_t *qin, int64_t outer, int64_t channels,
                       int64_t inner, const qcal_qparams *qp, uint8_t *codes, float *y)
{
    const qcal_float8_dsp *k = qcal_float8_dsp_get();
    const int fmt = qp->dtype == QCAL_FLOAT8_E4M3FN ? QCAL_F8_E4M3FN : QCAL_F8_E5M2;
    const int64_t block = 1 << 16;
    int64_t bpr = (inner + block - 1) / block, items = outer * channels * bpr;
    int nt = qcal_threads_for(outer * channels * inner);
    (void)nt;
    /* codes of a tensor larger than half the L3 with non-temporal stores (no
     * read-for-ownership of lines that will not stay cached; values identical) */
    const bool stream = qcal_cpu_stream_stores(outer * channels * inner * 5);
#if QCAL_HAVE_OPENMP
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
#endif
    for (int64_t it = 0; it < items; it++) {
        int64_t r = it / bpr, b = it % bpr;
        int64_t off = r * inner + b * block;
        int64_t m = inner - b * block < block ? inner - b * block : block;
        float s = qcal_qparams_scale_at(qp, r % channels);
        if (codes)
            k->quantize(x + off, m, s, fmt, codes + off, stream);
        else
            k->dequantize(qin + off, m, s, fmt, y + off);
    }
}

/* Validates the arguments shared by quantize and dequantize: tensor t (src or dst),
 * qparams (integer zero-points), the channel split for per-channel values. */
static qcal_status check_args(const char *what, const qcal_tensor *t, const qcal_qparams *qp,
                              int64_t *outer, int64_t *inner)
{
    qcal_status st = qcal_qparams_check(qp, what, true, false);
    if (st != QCAL_OK)
        return st;
    if (qp->qscheme == QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS)
        return qcal_error(QCAL_ERR_UNSUPPORTED,
                          "%s: per_channel_affine_float_qparams is not supported (integer "
                          "zero-points only)", what);
    int64_t n;
    if ((st = qcal_tensor_numel(t, &n)) != QCAL_OK)
        return st;
    if (qcal_qscheme_is_per_channel(qp->qscheme)) {
        if ((st = split_axis(t, qp->axis, qp->channels, outer, inner)) != QCAL_OK)
            return st;
    } else {
        *outer = 1;
        *inner = n;
    }
    if (n > 0 && !t->data)
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s: tensor data is NULL", what);
    return QCAL_OK;
}

qcal_status qcal_quantize(const qcal_tensor *src, const qcal_qparams *qp, void *dst)
{
    if (!src || !dst)
        return qcal_error(QCAL_ERR_INVALID_ARG, "quantize: source or destination is NULL");
    int64_t outer = 0, inner = 0;
    qcal_status st = check_args("quantize", src, qp, &outer, &inner);
    if (st != QCAL_OK)
        return st;
    if (qcal_dtype_is_float8(qp->dtype))
        float8_run(src->data, NULL, outer, qcal_qscheme_is_per_channel(qp->qscheme) ? qp->channels : 1,
                   inner, qp, dst, NULL);
    else if (qcal_qscheme_is_per_channel(qp->qscheme))
        quantize_per_channel(src->data, outer, qp->channels, inner, qp->scales,
                             qp->zero_points, qp->dtype, dst);
    else
        quantize_per_tensor(src->data, inner, qp->scale, qp->zero_point, qp->dtype, dst);
    return QCAL_OK;
}

/* ---- dequantize ---------------------------------------------------------------- */

static void deq_block(const void *src, qcal_dtype dtype, int64_t off, int64_t n, float scale,
                      int32_t zp, float *dst)
{
    const qcal_quantize_dsp *d = qcal_quantize_dsp_get();
    switch (dtype) {
    case QCAL_QUINT8: d->dequantize_u8(src, off, n, scale, zp, dst); return;
    case QCAL_QINT8: d->dequantize_i8(src, off, n, scale, zp, dst); return;
    case QCAL_QINT32: d->dequantize_i32(src, off, n, scale, zp, dst); return;
    case QCAL_FLOAT8_E4M3FN:
    case QCAL_FLOAT8_E5M2: return;   /* float8_run */
    }
}

static void dequantize_per_tensor(const void *src, qcal_dtype dtype, float scale,
                                  int32_t zero_point, int64_t n, float *dst)
{
    int nt = qcal_threads_for(n);
    (void)nt;
    const int64_t block = 1 << 16;
    int64_t nblocks = (n + block - 1) / block;
#if QCAL_HAVE_OPENMP
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
#endif
    for (int64_t b = 0; b < nblocks; b++) {
        int64_t s = b * block, len = n - s < block ? n - s : block;
        deq_block(src, dtype, s, len, scale, zero_point, dst + s);
    }
}

/* Dequantize of one slab with per-position scale/zero-point rows (short channel runs);
 * same arithmetic as deq_block. */
static void deq_prow(const void *src, qcal_dtype dtype, int64_t off, int64_t w,
                     const float *sc, const int32_t *zp, float *dst)
{
    switch (dtype) {
    case QCAL_QUINT8: {
        const uint8_t *q = (const uint8_t *)src + off;
        for (int64_t i = 0; i < w; i++)
            dst[i] = (float)((int32_t)q[i] - zp[i]) * sc[i];
        break;
    }
    case QCAL_QINT8: {
        const int8_t *q = (const int8_t *)src + off;
        for (int64_t i = 0; i < w; i++)
            dst[i] = (float)((int32_t)q[i] - zp[i]) * sc[i];
        break;
    }
    case QCAL_QINT32: {
        const int32_t *q = (const int32_t *)src + off;
        for (int64_t i = 0; i < w; i++)
            dst[i] = (float)((int64_t)q[i] - zp[i]) * sc[i];
        break;
    }
    case QCAL_FLOAT8_E4M3FN:
    case QCAL_FLOAT8_E5M2: break;   /* float8_run */
    }
}

/* Per-channel dequantize with short channel runs (see quant_short_rows). */
static bool deq_short_rows(const void *src, qcal_dtype dtype, int64_t outer, int64_t channels,
                           int64_t inner, const float *scales, const int32_t *zps, float *dst,
                           int nt)
{
    int64_t w = channels * inner;
    if (w > ((int64_t)1 << 22))
        return false;
    float *sc = qcal_malloc((size_t)w * sizeof(float));
    int32_t *z = qcal_malloc((size_t)w * sizeof(int32_t));
    if (!sc || !z) {
        free(sc);
        free(z);
        return false;
    }
    for (int64_t c = 0; c < channels; c++)
        for (int64_t i = 0; i < inner; i++) {
            sc[c * inner + i] = scales[c];
            z[c * inner + i] = zps[c];
        }
    (void)nt;
#if QCAL_HAVE_OPENMP
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
#endif
    for (int64_t o = 0; o < outer; o++)
        deq_prow(src, dtype, o * w, w, sc, z, dst + o * w);
    free(sc);
    free(z);
    return true;
}

static void dequantize_per_channel(const void *src, qcal_dtype dtype, int64_t outer,
                                   int64_t channels, int64_t inner, const float *scales,
                                   const int32_t *zero_points, float *dst)
{
    int64_t rows = outer * channels;
    int nt = qcal_threads_for(rows * inner);
    (void)nt;
    if (inner < 16 && deq_short_rows(src, dtype, outer, channels, inner, scales, zero_points,
                                     dst, nt))
        return;
#if QCAL_HAVE_OPENMP
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
#endif
    for (int64_t r = 0; r < rows; r++) {
        int64_t c = r % channels;
        deq_block(src, dtype, r * inner, inner, scales[c], zero_points[c], dst + r * inner);
    }
}

qcal_status qcal_dequantize(const void *src, const qcal_qparams *qp, qcal_tensor_mut *dst)
{
    if (!src || !dst)
        return qcal_error(QCAL_ERR_INVALID_ARG, "dequantize: source or destination is NULL");
    int64_t outer = 0, inner = 0;
    qcal_tensor shape;
    qcal_tensor_mut_view(dst, &shape);
    qcal_status st = check_args("dequantize", &shape, qp, &outer, &inner);
    if (st != QCAL_OK)
        return st;
    if (qcal_dtype_is_float8(qp->dtype))
        float8_run(NULL, src, outer, qcal_qscheme_is_per_channel(qp->qscheme) ? qp->channels : 1,
                   inner, qp, NULL, dst->data);
    else if (qcal_qscheme_is_per_channel(qp->qscheme))
        dequantize_per_channel(src, qp->dtype, outer, qp->channels, inner, qp->scales,
                               qp->zero_points, dst->data);
    else
        dequantize_per_tensor(src, qp->dtype, qp->scale, qp->zero_point, inner, dst->data);
    return QCAL_OK;
}
