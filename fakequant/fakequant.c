/* Fake-quant forward / straight-through backward kernels, per tensor and per channel, with
 * the arithmetic of PyTorch 1.13's ATen CPU kernels (QuantizedOpKernels.cpp,
 * fake_quantize_tensor_cachemask_kernel and fake_quant_per_channel_cachemask_cpu):
 *
 *   inv_scale = 1.0f / scale;                        float division
 *   q = zero_point + nearbyint(x * inv_scale);       ATen: int64 + float -> the add is in
 *                                                    float; round half to even (nearbyintf
 *                                                    under the default rounding mode)
 *   mask = quant_min <= q && q <= quant_max;          false for NaN
 *   y = (clamp(q, quant_min, quant_max) - zero_point) * scale
 *
 * ATen computes y in double ((double)(int64) * (double)scale, rounded to float on store);
 * with |q - zero_point| <= 2^25 that product is exact in double, so one float multiply
 * gives the same bits. ATen casts q to int64 before clamping: NaN, +-Inf and |q| >= 2^63
 * become INT64_MIN and come out as quant_min (so NaN and +Inf -> quant_min). qcal follows
 * the NaN policy of qcal/fakequant.h: it clamps in float (-Inf -> quant_min, +Inf / huge ->
 * quant_max) and maps NaN to the zero-point (y = +0.0, as quantize + dequantize gives);
 * the mask is 0 for all of them, as in 1.13.
 *
 * Backward: ATen returns dY * mask (mask promoted to 0.0f / 1.0f), so a masked-out negative
 * gradient becomes -0.0f and a NaN gradient stays NaN; qcal multiplies the same way.
 *
 * SIMD: AVX2 and AVX-512 versions do the same float operations in the same order
 * (vroundps / vrndscaleps with round-to-nearest-even; NaN lanes are zeroed before the
 * multiply by the scale as the C reference does), so every ISA gives identical bits.
 *
 * Stores: a pass whose bytes (inputs + outputs) exceed half the L3 writes its outputs
 * with non-temporal stores (vmovntps, after peeling to the 64 / 32-byte vector alignment;
 * an output aligned differently from the first keeps plain stores; in-place outputs keep
 * plain stores since their lines are already cached), then sfence. A plain store first
 * reads the line (read-for-ownership): fused forward+backward moves 24 instead of 16 bytes
 * per element that way. Streaming changes no value. Smaller tensors keep plain stores so
 * their outputs stay in cache for the next layer (the threshold: qcal_cpu_stream_stores,
 * core/cpu.h). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "fakequant/fakequant_impl.h"
#include "quant/float8_dsp.h"
#include "qcal/qparams.h"
#include "qcal_config.h"


/* Elements per OpenMP work item: large enough to amortise scheduling, small enough to
 * balance two cores on a 16M tensor. */
#define FQ_BLOCK 65536

/* The element kernels live in the kernel layer: fakequant/fakequant_dsp.h (C reference in
 * fakequant_c.c, AVX2 / AVX-512 in fakequant_avx2.c / fakequant_avx512.c). */

/* One element-wise pass over rows x inner elements (row r uses runs[r % nruns]), one
 * OpenMP work item per block of at most FQ_BLOCK elements of a row. Elements are
 * independent, so the result does not depend on the thread count or on which thread takes
 * which block: blocks are handed out dynamically, so a thread slowed by other load on its
 * core does not hold up the pass. */
typedef enum fq_pass { FQ_FWD, FQ_FUSED, FQ_BWD } fq_pass;

typedef struct fq_job {
    fq_pass pass;
    const float *x, *gy;        /* FQ_FWD: x; FQ_FUSED: x, gy; FQ_BWD: gy */
    const uint8_t *mask_in;     /* FQ_BWD */
    const qcal_fq_run *runs;    /* FQ_FWD, FQ_FUSED */
    int64_t nruns;
    float *dst, *gx;            /* FQ_FWD: dst; FQ_FUSED: dst, gx; FQ_BWD: gx */
    uint8_t *mask;              /* FQ_FWD, may be NULL */
    int f8;                     /* -1: integer dtypes; else the qcal_f8_fmt (FP8 kernels,
                                 * which use the runs' scale only) */
} fq_job;

static void fq_blocks(const fq_job *j, int64_t rows, int64_t inner)
{
    const qcal_fakequant_dsp *k = qcal_fakequant_dsp_get();
    const qcal_float8_dsp *k8 = qcal_float8_dsp_get();
    int64_t bpr = (inner + FQ_BLOCK - 1) / FQ_BLOCK;
    int64_t items = rows * bpr;
    int64_t n = rows * inner;
    int nt = qcal_threads_for(n);
    /* Bytes the pass moves (inputs + outputs; n * 17 cannot overflow: n floats exist). */
    int64_t per = j->pass == FQ_FWD ? 8 + (j->mask ? 1 : 0) : j->pass == FQ_FUSED ? 16 : 9;
    const bool stream = qcal_cpu_stream_stores(n * per);
    /* Work items taken per grab: ~FQ_BLOCK elements, so short rows (per channel) still
     * give each thread long runs of memory to stream through. */
    int chunk = (int)(FQ_BLOCK / (inner < FQ_BLOCK ? inner : FQ_BLOCK));
    (void)chunk;
#if QCAL_HAVE_OPENMP
#pragma omp parallel for schedule(dynamic, chunk) num_threads(nt) if (nt > 1)
#endif
    for (int64_t it = 0; it < items; it++) {
        int64_t r = it / bpr, b = it % bpr;
        int64_t off = r * inner + b * FQ_BLOCK;
        int64_t m = inner - b * FQ_BLOCK < FQ_BLOCK ? inner - b * FQ_BLOCK : FQ_BLOCK;
        const qcal_fq_run *p = j->runs ? &j->runs[r % j->nruns] : NULL;
        if (j->f8 >= 0 && j->pass == FQ_FWD) {
            k8->fakequant(j->x + off, m, p->scale, j->f8, j->dst + off,
                          j->mask ? j->mask + off : NULL, stream);
            continue;
        }
        if (j->f8 >= 0 && j->pass == FQ_FUSED) {
            k8->fakequant_fused(j->x + off, j->gy + off, m, p->scale, j->f8, j->dst + off,
                                j->gx + off, stream);
            continue;
        }
        switch (j->pass) {
        case FQ_FWD:
            k->fakequant(j->x + off, m, p, j->dst + off, j->mask ? j->mask + off : NULL, stream);
            break;
        case FQ_FUSED:
            k->fakequant_fused(j->x + off, j->gy + off, m, p, j->dst + off, j->gx + off, stream);
            break;
        case FQ_BWD:
            k->fakequant_backward(j->gy + off, j->mask_in + off, m, j->gx + off, stream);
            break;
        }
    }
    (void)nt;
}

/* ----------------------------------------------------------------------------------- */
/* Shared checks */

qcal_status qcal_fq_check_range(int64_t quant_min, int64_t quant_max)
{
    const int64_t lim = QCAL_FAKEQUANT_QRANGE_LIMIT;
    if (quant_min > quant_max)
        return qcal_error(QCAL_ERR_INVALID_ARG, "quant_min %lld is greater than quant_max %lld",
                          (long long)quant_min, (long long)quant_max);
    if (quant_min < -lim || quant_max > lim)
        return qcal_error(QCAL_ERR_UNSUPPORTED,
                          "quantization range [%lld, %lld] exceeds [-%lld, %lld] (integers "
                          "must stay exact in float)",
                          (long long)quant_min, (long long)quant_max, (long long)lim,
                          (long long)lim);
    return QCAL_OK;
}

qcal_status qcal_fq_check_qparams(float scale, int64_t zero_point, int64_t quant_min,
                                  int64_t quant_max, int64_t channel)
{
    char where[48] = "";
    if (channel >= 0)
        snprintf(where, sizeof where, " (channel %lld)", (long long)channel);
    if (!(scale > 0.0f && isfinite(scale)))
        return qcal_error(QCAL_ERR_INVALID_ARG, "scale %g%s must be > 0 and finite",
                          (double)scale, where);
    if (zero_point < quant_min || zero_point > quant_max)
        return qcal_error(QCAL_ERR_INVALID_ARG,
                          "zero_point %lld%s is outside [quant_min %lld, quant_max %lld]",
                          (long long)zero_point, where, (long long)quant_min,
                          (long long)quant_max);
    return QCAL_OK;
}

void qcal_fq_run_init(qcal_fq_run *r, float scale, int64_t zero_point, int64_t quant_min,
                      int64_t quant_max)
{
    r->scale = scale;
    r->inv_scale = 1.0f / scale;
    r->zp = (float)zero_point;
    r->qmin = (float)quant_min;
    r->qmax = (float)quant_max;
}

qcal_status qcal_fq_split(const qcal_tensor *t, int32_t axis, int64_t *outer,
                          int64_t *channels, int64_t *inner)
{
    if (!t)
        return qcal_error(QCAL_ERR_INVALID_ARG, "tensor is NULL");
    int64_t n;
    qcal_status st = qcal_tensor_numel(t, &n);
    if (st != QCAL_OK)
        return st;
    if (n == 0)
        return qcal_error(QCAL_ERR_EMPTY, "cannot fake-quantize an empty tensor");
    if (!t->data)
        return qcal_error(QCAL_ERR_INVALID_ARG, "tensor data is NULL");
    if (t->ndim < 1)
        return qcal_error(QCAL_ERR_INVALID_ARG, "per-channel fake-quant needs ndim >= 1, got 0");
    int32_t ax;
    st = qcal_tensor_axis(t, axis, &ax);
    if (st != QCAL_OK)
        return st;
    int64_t o = 1, in = 1;
    for (int32_t d = 0; d < ax; d++)
        o *= t->shape[d];   /* cannot overflow: the full product was checked */
    for (int32_t d = ax + 1; d < t->ndim; d++)
        in *= t->shape[d];
    *outer = o;
    *channels = t->shape[ax];
    *inner = in;
    return QCAL_OK;
}

static qcal_status check_n(int64_t n, const void *a, const void *b)
{
    if (n < 0)
        return qcal_error(QCAL_ERR_INVALID_ARG, "element count %lld is negative", (long long)n);
    if (n == 0)
        return qcal_error(QCAL_ERR_EMPTY, "cannot fake-quantize an empty tensor");
    if (!a || !b)
        return qcal_error(QCAL_ERR_INVALID_ARG, "input or output buffer is NULL");
    return QCAL_OK;
}

/* ----------------------------------------------------------------------------------- */
/* Per tensor */

static qcal_status fq_per_tensor(const float *src, int64_t n, float scale,
                                      int32_t zero_point, int64_t quant_min, int64_t quant_max,
                                      float *dst, uint8_t *mask)
{
    qcal_status st = check_n(n, src, dst);
    if (st == QCAL_OK)
        st = qcal_fq_check_range(quant_min, quant_max);
    if (st == QCAL_OK)
        st = qcal_fq_check_qparams(scale, zero_point, quant_min, quant_max, -1);
    if (st != QCAL_OK)
        return st;
    qcal_fq_run p;
    qcal_fq_run_init(&p, scale, zero_point, quant_min, quant_max);
    fq_job j = { .f8 = -1, .pass = FQ_FWD, .x = src, .runs = &p, .nruns = 1, .dst = dst, .mask = mask };
    fq_blocks(&j, 1, n);
    return QCAL_OK;
}

static qcal_status fq_backward(const float *grad_y, const uint8_t *mask, int64_t n,
                                    float *grad_x)
{
    qcal_status st = check_n(n, grad_y, grad_x);
    if (st != QCAL_OK)
        return st;
    if (!mask)
        return qcal_error(QCAL_ERR_INVALID_ARG, "mask is NULL");
    fq_job j = { .f8 = -1, .pass = FQ_BWD, .gy = grad_y, .mask_in = mask, .gx = grad_x };
    fq_blocks(&j, 1, n);
    return QCAL_OK;
}

static qcal_status fq_per_tensor_fused(const float *src, const float *grad_y, int64_t n,
                                            float scale, int32_t zero_point, int64_t quant_min,
                                            int64_t quant_max, float *dst, float *grad_x)
{
    qcal_status st = check_n(n, src, dst);
    if (st == QCAL_OK && (!grad_y || !grad_x))
        st = qcal_error(QCAL_ERR_INVALID_ARG, "gradient buffer is NULL");
    if (st == QCAL_OK)
        st = qcal_fq_check_range(quant_min, quant_max);
    if (st == QCAL_OK)
        st = qcal_fq_check_qparams(scale, zero_point, quant_min, quant_max, -1);
    if (st != QCAL_OK)
        return st;
    qcal_fq_run p;
    qcal_fq_run_init(&p, scale, zero_point, quant_min, quant_max);
    fq_job j = { .f8 = -1, .pass = FQ_FUSED, .x = src, .gy = grad_y, .runs = &p, .nruns = 1, .dst = dst,
                 .gx = grad_x };
    fq_blocks(&j, 1, n);
    return QCAL_OK;
}

/* ----------------------------------------------------------------------------------- */
/* Per channel: src is (outer, C, inner) around the axis; each (row, block) work item is one
 * contiguous run with one channel's parameters. */

static qcal_status per_channel_prepare(const qcal_tensor *src, int32_t axis,
                                       const float *scale, const int32_t *zero_point,
                                       int64_t quant_min, int64_t quant_max, int64_t *outer,
                                       int64_t *ch, int64_t *inner, qcal_fq_run **runs)
{
    qcal_status st = qcal_fq_split(src, axis, outer, ch, inner);
    if (st != QCAL_OK)
        return st;
    if (!scale || !zero_point)
        return qcal_error(QCAL_ERR_INVALID_ARG, "per-channel scale or zero_point is NULL");
    st = qcal_fq_check_range(quant_min, quant_max);
    if (st != QCAL_OK)
        return st;
    for (int64_t c = 0; c < *ch; c++) {
        st = qcal_fq_check_qparams(scale[c], zero_point[c], quant_min, quant_max, c);
        if (st != QCAL_OK)
            return st;
    }
    qcal_fq_run *r = qcal_malloc((size_t)*ch * sizeof *r);
    if (!r)
        return QCAL_ERR_NO_MEMORY;
    for (int64_t c = 0; c < *ch; c++)
        qcal_fq_run_init(&r[c], scale[c], zero_point[c], quant_min, quant_max);
    *runs = r;
    return QCAL_OK;
}

static qcal_status fq_per_channel(const qcal_tensor *src, int32_t axis, const float *scale,
                                       const int32_t *zero_point, int64_t quant_min,
                                       int64_t quant_max, float *dst, uint8_t *mask)
{
    if (!dst)
        return qcal_error(QCAL_ERR_INVALID_ARG, "output buffer is NULL");
    int64_t outer, ch, inner;
    qcal_fq_run *runs = NULL;
    qcal_status st = per_channel_prepare(src, axis, scale, zero_point, quant_min, quant_max,
                                         &outer, &ch, &inner, &runs);
    if (st != QCAL_OK)
        return st;
    fq_job j = { .f8 = -1, .pass = FQ_FWD, .x = src->data, .runs = runs, .nruns = ch, .dst = dst,
                 .mask = mask };
    fq_blocks(&j, outer * ch, inner);
    free(runs);
    return QCAL_OK;
}

static qcal_status fq_per_channel_fused(const qcal_tensor *src, const float *grad_y,
                                             int32_t axis, const float *scale,
                                             const int32_t *zero_point, int64_t quant_min,
                                             int64_t quant_max, float *dst, float *grad_x)
{
    if (!dst || !grad_y || !grad_x)
        return qcal_error(QCAL_ERR_INVALID_ARG, "output or gradient buffer is NULL");
    int64_t outer, ch, inner;
    qcal_fq_run *runs = NULL;
    qcal_status st = per_channel_prepare(src, axis, scale, zero_point, quant_min, quant_max,
                                         &outer, &ch, &inner, &runs);
    if (st != QCAL_OK)
        return st;
    fq_job j = { .f8 = -1, .pass = FQ_FUSED, .x = src->data, .gy = grad_y, .runs = runs, .nruns = ch,
                 .dst = dst, .gx = grad_x };
    fq_blocks(&j, outer * ch, inner);
    free(runs);
    return QCAL_OK;
}

/* ----------------------------------------------------------------------------------- */
/* FP8 (float8_e4m3fn, float8_e5m2; quant/float8_dsp.h has the contract): y = value(code of
 * x / scale) * scale, mask = the unsaturated rounding stays finite within +-largest. One
 * pass per tensor, per tensor or per channel (each row of `inner` elements one channel's
 * scale); the zero-points are 0 (checked by qcal_qparams_check). */

static qcal_status fq_float8(const qcal_tensor *src, const float *grad_y,
                             const qcal_qparams *qp, float *dst, float *grad_x, uint8_t *mask)
{
    int64_t outer = 1, ch = 1, inner, n;
    qcal_status st = qcal_tensor_numel(src, &n);
    if (st != QCAL_OK)
        return st;
    inner = n;
    bool pc = qcal_qscheme_is_per_channel(qp->qscheme);
    if (pc && (st = qcal_fq_split(src, qp->axis, &outer, &ch, &inner)) != QCAL_OK)
        return st;
    qcal_fq_run one, *runs = &one;
    if (pc) {
        runs = qcal_malloc((size_t)ch * sizeof *runs);
        if (!runs)
            return QCAL_ERR_NO_MEMORY;
    }
    for (int64_t c = 0; c < ch; c++)
        qcal_fq_run_init(&runs[c], qcal_qparams_scale_at(qp, c), 0, qp->quant_min,
                         qp->quant_max);
    fq_job j = { .f8 = qp->dtype == QCAL_FLOAT8_E4M3FN ? QCAL_F8_E4M3FN : QCAL_F8_E5M2,
                 .pass = grad_y ? FQ_FUSED : FQ_FWD, .x = src->data, .gy = grad_y,
                 .runs = runs, .nruns = ch, .dst = dst, .gx = grad_x, .mask = mask };
    fq_blocks(&j, outer * ch, inner);
    if (pc)
        free(runs);
    return QCAL_OK;
}

/* ----------------------------------------------------------------------------------- */
/* Public entry points: one call per operation, per-tensor and per-channel alike. */

qcal_status qcal_fq_check_args(const char *what, const qcal_tensor *src, const qcal_qparams *qp,
                               bool learnable, int64_t *n)
{
    if (!src)
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s: source tensor is NULL", what);
    qcal_status st = qcal_qparams_check(qp, what, !learnable, learnable);
    if (st != QCAL_OK)
        return st;
    if (learnable && qcal_dtype_is_float8(qp->dtype))
        return qcal_error(QCAL_ERR_UNSUPPORTED, "%s: %s has no learnable (LSQ) fake-quant",
                          what, qcal_dtype_name(qp->dtype));
    if (!learnable && qp->qscheme == QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS)
        return qcal_error(QCAL_ERR_UNSUPPORTED,
                          "%s: per_channel_affine_float_qparams needs the learnable calls "
                          "(float zero-points)", what);
    if ((st = qcal_fq_check_range(qp->quant_min, qp->quant_max)) != QCAL_OK)
        return st;
    if ((st = qcal_tensor_numel(src, n)) != QCAL_OK)
        return st;
    if (*n == 0)
        return qcal_error(QCAL_ERR_EMPTY, "cannot fake-quantize an empty tensor");
    if (!src->data)
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s: tensor data is NULL", what);
    if (qcal_qscheme_is_per_channel(qp->qscheme)) {
        int64_t outer, ch, inner;
        if ((st = qcal_fq_split(src, qp->axis, &outer, &ch, &inner)) != QCAL_OK)
            return st;
        if (ch != qp->channels)
            return qcal_error(QCAL_ERR_MISMATCH,
                              "%s: %lld channels in the qparams, axis %d has %lld", what,
                              (long long)qp->channels, (int)qp->axis, (long long)ch);
    }
    return QCAL_OK;
}

qcal_status qcal_fq_check_out(const char *what, const qcal_tensor *t, int64_t n,
                              const char *name)
{
    if (!t)
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s: %s is NULL", what, name);
    int64_t m;
    qcal_status st = qcal_tensor_numel(t, &m);
    if (st != QCAL_OK)
        return st;
    if (m != n)
        return qcal_error(QCAL_ERR_MISMATCH, "%s: %s has %lld elements, the source %lld", what,
                          name, (long long)m, (long long)n);
    if (!t->data)
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s: %s data is NULL", what, name);
    return QCAL_OK;
}

qcal_status qcal_fq_check_dst(const char *what, const qcal_tensor_mut *t, int64_t n,
                              const char *name)
{
    if (!t)
        return qcal_error(QCAL_ERR_INVALID_ARG, "%s: %s is NULL", what, name);
    qcal_tensor v;
    qcal_tensor_mut_view(t, &v);
    return qcal_fq_check_out(what, &v, n, name);
}

qcal_status qcal_fakequant_forward(const qcal_tensor *src, const qcal_qparams *qp,
                                   qcal_tensor_mut *dst, uint8_t *mask)
{
    int64_t n = 0;
    qcal_status st = qcal_fq_check_args("fakequant", src, qp, false, &n);
    if (st == QCAL_OK)
        st = qcal_fq_check_dst("fakequant", dst, n, "destination");
    if (st != QCAL_OK)
        return st;
    if (qcal_dtype_is_float8(qp->dtype))
        return fq_float8(src, NULL, qp, dst->data, NULL, mask);
    if (qcal_qscheme_is_per_channel(qp->qscheme))
        return fq_per_channel(src, qp->axis, qp->scales, qp->zero_points, qp->quant_min,
                              qp->quant_max, dst->data, mask);
    return fq_per_tensor(src->data, n, qp->scale, qp->zero_point, qp->quant_min, qp->quant_max,
                         dst->data, mask);
}

qcal_status qcal_fakequant_backward(const qcal_tensor *grad_y, const uint8_t *mask,
                                    qcal_tensor_mut *grad_x)
{
    if (!grad_y)
        return qcal_error(QCAL_ERR_INVALID_ARG, "fakequant backward: gradient is NULL");
    int64_t n;
    qcal_status st = qcal_tensor_numel(grad_y, &n);
    if (st == QCAL_OK && n > 0)
        st = qcal_fq_check_dst("fakequant backward", grad_x, n, "grad_x");
    if (st != QCAL_OK)
        return st;
    return fq_backward(grad_y->data, mask, n, grad_x ? grad_x->data : NULL);
}

qcal_status qcal_fakequant_fused(const qcal_tensor *src, const qcal_tensor *grad_y,
                                 const qcal_qparams *qp, qcal_tensor_mut *dst,
                                 qcal_tensor_mut *grad_x)
{
    int64_t n = 0;
    qcal_status st = qcal_fq_check_args("fakequant", src, qp, false, &n);
    if (st == QCAL_OK)
        st = qcal_fq_check_dst("fakequant", dst, n, "destination");
    if (st == QCAL_OK)
        st = qcal_fq_check_out("fakequant", grad_y, n, "grad_y");
    if (st == QCAL_OK)
        st = qcal_fq_check_dst("fakequant", grad_x, n, "grad_x");
    if (st != QCAL_OK)
        return st;
    if (qcal_dtype_is_float8(qp->dtype))
        return fq_float8(src, grad_y->data, qp, dst->data, grad_x->data, NULL);
    if (qcal_qscheme_is_per_channel(qp->qscheme))
        return fq_per_channel_fused(src, grad_y->data, qp->axis, qp->scales, qp->zero_points,
                                    qp->quant_min, qp->quant_max, dst->data, grad_x->data);
    return fq_per_tensor_fused(src->data, grad_y->data, n, qp->scale, qp->zero_point,
                               qp->quant_min, qp->quant_max, dst->data, grad_x->data);
}
