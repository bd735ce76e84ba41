/* The weights of the Q/DQ plan (onnx/qdq_shared.h): each observed and quantized by the weight
 * quantizer (qcal/weights.h), read where it lies in the model's file mapping; with a lazy
 * plan (qcal_onnx_qdq_save_file) a float32 weight of a symmetric scheme is planned by size and
 * computed when the save's pass reaches it. */
#include <stdlib.h>
#include <string.h>

#include "onnx/qdq_shared.h"
#include "qcal/weights.h"

/* Appends *w to the plan's weights (the array doubles at powers of two); *out gets its index.
 * On failure the plan is unchanged and w's buffers are still the caller's. */
static qcal_status wplan_push(plan *p, const wplan *w, int64_t *out)
{
    if ((p->nw & (p->nw - 1)) == 0) {
        wplan *nw = realloc(p->w, (size_t)(p->nw ? p->nw * 2 : 8) * sizeof *nw);
        if (!nw)
            return OOM();
        p->w = nw;
    }
    p->w[p->nw] = *w;
    *out = p->nw++;
    return QCAL_OK;
}

/* Elements [first, first + count) of a float32 initializer's raw data (ctx): in place, or
 * a copy in scratch (onnx_raw_view). */
static qcal_status raw_read(void *ctx, int64_t first, int64_t count, void *scratch, const float **out)
{
    _Static_assert(ONNX_VIEW_SLACK <= QCAL_WEIGHTS_SCRATCH_SLACK, "a reader's scratch holds a view");
    return onnx_raw_view(ctx, (size_t)first * 4, (size_t)count * 4, scratch, out);
}

/* The observation of weight w->t (w->axis, w->dtype, w->numel set, shape checked) by the
 * weight quantizer (qcal/weights.h): opt->weight_observer and opt->weight_qscheme (qint8;
 * per-tensor schemes with minmax over the whole weight) or per-channel symmetric in the FP8
 * dtype of an FP8 node (scale = channel amax / largest), into w->channels, scales, zps,
 * per_tensor; the codes (ort) into w->codes (codes_into when given, numel bytes, else a new
 * buffer); tensorrt's float32 copy of a weight that is not float32 into w->f32. A float32
 * raw initializer is read in blocks where it lies (a file mapping's pages), anything else
 * converted whole. init: the weight's TensorProto. On failure w's buffers stay NULL
 * (codes_into is the caller's). */
static qcal_status weight_compute(plan *p, wplan *w, const Onnx__TensorProto *init, uint8_t *codes_into)
{
    const int64_t numel = w->numel;
    const qcal_dtype dtype = w->dtype;
    const bool f32raw = init->data_type == QCAL_ONNX_FLOAT && init->raw_data.len == (size_t)numel * 4;
    qcal_weights_options wo;
    qcal_weights_options_default(&wo);
    wo.observer = p->opt->weight_observer;
    wo.q.dtype = dtype;
    wo.q.qscheme = qcal_dtype_is_float8(dtype) ? QCAL_PER_CHANNEL_SYMMETRIC : p->opt->weight_qscheme;
    wo.axis = w->axis;
    wo.serial = p->serial;
    const bool per_tensor = !qcal_qscheme_is_per_channel(wo.q.qscheme);
    float *conv = NULL;
    qcal_tensor x;
    memset(&x, 0, sizeof x);
    x.ndim = (int32_t)init->n_dims;
    for (size_t k = 0; k < init->n_dims; k++)
        x.shape[k] = init->dims[k];
    if (f32raw) {
        /* one buffer for every weight's reads (the quantizer touches a block's worth of it,
         * or the whole weight for an observer that needs it whole): its pages fault in once */
        const size_t need = qcal_weights_scratch_bytes(&wo, &x);
        if (p->scratch_cap < need) {
            free(p->scratch);
            p->scratch = malloc(need);
            p->scratch_cap = p->scratch ? need : 0;
            if (!p->scratch)
                return OOM();
        }
        wo.scratch = p->scratch;
        wo.scratch_bytes = p->scratch_cap;
    } else {
        int64_t nn;
        qcal_status st = onnx_tensor_to_float(init, &conv, &nn);
        if (st != QCAL_OK)
            return st;
        x.data = conv;
    }
    const int64_t channels = per_tensor ? 1 : init->dims[w->axis];
    float *scales = malloc((size_t)channels * sizeof *scales);
    int32_t *zp32 = malloc((size_t)channels * sizeof *zp32);
    int8_t *zps = calloc((size_t)channels, sizeof *zps);
    uint8_t *codes = p->opt->profile != QCAL_ONNX_PROFILE_ORT ? NULL
                     : codes_into                                ? codes_into
                                                                 : malloc((size_t)numel);
    const qcal_weights_reader rd = { raw_read, (void *)init };
    qcal_status st = !scales || !zp32 || !zps || (p->opt->profile == QCAL_ONNX_PROFILE_ORT && !codes)
                         ? OOM() : qcal_weights_quantize(&wo, &x, f32raw ? &rd : NULL, scales, zp32, codes);
    if (st == QCAL_NO_DATA)
        st = QCAL_OK;
    for (int64_t c = 0; st == QCAL_OK && c < channels; c++)
        zps[c] = (int8_t)zp32[c];   /* qint8 (FP8: 0) */
    free(zp32);
    /* tensorrt: the float32 weight Q reads when the initializer is not float32 */
    float *f32 = p->opt->profile == QCAL_ONNX_PROFILE_TENSORRT && init->data_type != QCAL_ONNX_FLOAT
                     ? conv : NULL;
    if (st != QCAL_OK) {
        st = qcal_error(st, "weight '%s': %s", p->t[w->t].name, qcal_last_error());
        free(conv);
        if (codes != codes_into)
            free(codes);
        free(scales);
        free(zps);
        return st;
    }
    w->channels = channels;
    w->scales = scales;
    w->zps = zps;
    w->per_tensor = per_tensor;
    w->codes = codes;
    w->f32 = f32;
    if (!f32)
        free(conv);
    return QCAL_OK;
}

/* Appends *x (size bytes) to *arr of *n elements (doubling at powers of two). */
bool qdq_push_rec(void **arr, int64_t *n, const void *x, size_t size)
{
    if ((*n & (*n - 1)) == 0) {
        void *a = realloc(*arr, (size_t)(*n ? *n * 2 : 8) * size);
        if (!a)
            return false;
        *arr = a;
    }
    memcpy((char *)*arr + (size_t)*n * size, x, size);
    ++*n;
    return true;
}

/* The weight of node n at tensor t (wplan *out, shared by the nodes reading t alike): with
 * p->lazy, a float32 weight whose zero-points are zero gets its scale initializer's size
 * (one per channel, or one) and is lazy (lazy_w: its values when the save reaches them);
 * any other is observed now. */
static qcal_status plan_weight_read(plan *p, const Onnx__NodeProto *n, int64_t t, int32_t axis,
                                    qcal_dtype dtype, int64_t *out)
{
    for (int64_t i = 0; i < p->nw; i++)
        if (p->w[i].t == t) {
            if (p->w[i].axis != axis || p->w[i].dtype != dtype)
                return QCAL_ERR_MISMATCH;   /* caller records the skip */
            *out = i;
            return QCAL_OK;
        }
    Onnx__TensorProto *init = p->t[t].init;
    int64_t numel;
    if (!onnx_tensor_numel(init, &numel))
        return qcal_error(QCAL_ERR_FORMAT, "weight '%s' has an invalid shape", p->t[t].name);
    if (numel == 0)
        return qcal_error(QCAL_ERR_FORMAT, "weight '%s' of node '%s' (%s) has no elements (a zero-sized dimension)",
                          p->t[t].name, n->name ? n->name : "", n->op_type);
    if (init->n_dims > QCAL_MAX_DIMS || (int64_t)init->n_dims <= axis)
        return qcal_error(QCAL_ERR_UNSUPPORTED, "weight '%s' has %zu dimensions", p->t[t].name, init->n_dims);
    wplan w = { .t = t, .axis = axis, .dtype = dtype, .numel = numel, .lazy = -1 };
    const qcal_qscheme qs = qcal_dtype_is_float8(dtype) ? QCAL_PER_CHANNEL_SYMMETRIC : p->opt->weight_qscheme;
    qcal_status st;
    if (p->lazy && init->data_type == QCAL_ONNX_FLOAT && init->raw_data.len == (size_t)numel * 4 &&
        (qs == QCAL_PER_CHANNEL_SYMMETRIC || qs == QCAL_PER_TENSOR_SYMMETRIC)) {
        /* symmetric qint8 and FP8 zero-points are 0 whatever the data (checked in qdq_lazy_run) */
        w.per_tensor = qs == QCAL_PER_TENSOR_SYMMETRIC;
        w.channels = w.per_tensor ? 1 : init->dims[axis];
        w.scales = calloc((size_t)w.channels, sizeof *w.scales);
        w.zps = calloc((size_t)w.channels, sizeof *w.zps);
        /* ort: the codes' buffer, the quantized initializer's data once the rewrite takes it */
        if (p->opt->profile == QCAL_ONNX_PROFILE_ORT)
            w.codes = calloc((size_t)numel, 1);
        /* src is shallow: the data, dims and name stay alive (p->dropped) */
        lazy_w l = { .w = p->nw, .src = *init };
        w.lazy = p->nlw;
        st = !w.scales || !w.zps || (p->opt->profile == QCAL_ONNX_PROFILE_ORT && !w.codes) ||
                     !qdq_push_rec((void **)&p->lw, &p->nlw, &l, sizeof l)
                 ? OOM() : QCAL_OK;
    } else {
        st = weight_compute(p, &w, init, NULL);
    }
    if (st == QCAL_OK)
        st = wplan_push(p, &w, out);
    if (st != QCAL_OK) {
        if (w.lazy >= 0 && w.lazy < p->nlw)
            p->nlw--;
        free(w.scales), free(w.zps), free(w.codes), free(w.f32);
        return st;
    }
    return QCAL_OK;
}

/* Lazy weight l observed now (weight_compute): its scales into its wplan's and, once the
 * rewrite made it, its scale initializer; (ort) its codes into its buffer (the wplan's
 * before the rewrite takes it, then the quantized initializer's data). The weight's pages
 * of the file mapping are let go after. */
qcal_status qdq_lazy_run(plan *p, lazy_w *l)
{
    wplan *w = &p->w[l->w];
    wplan c = { .t = w->t, .axis = w->axis, .dtype = w->dtype, .numel = w->numel, .lazy = -1 };
    uint8_t *into = l->codes_dst ? l->codes_dst : w->codes;
    qcal_status st = weight_compute(p, &c, &l->src, into);
    if (c.codes == into)
        c.codes = NULL;   /* written in place */
    if (st == QCAL_OK && (c.channels != w->channels || c.per_tensor != w->per_tensor))
        st = qcal_error(QCAL_ERR_STATE, "weight '%s': %lld scales observed, %lld planned",
                        p->t[w->t].name, (long long)c.channels, (long long)w->channels);
    for (int64_t k = 0; st == QCAL_OK && k < c.channels; k++)
        if (c.zps[k] != 0)
            st = qcal_error(QCAL_ERR_STATE, "weight '%s': zero-point %d of a symmetric scheme",
                            p->t[w->t].name, c.zps[k]);
    if (st == QCAL_OK) {
        memcpy(w->scales, c.scales, (size_t)c.channels * sizeof *c.scales);
        if (l->scale_dst)
            memcpy(l->scale_dst, c.scales, (size_t)c.channels * sizeof *c.scales);
    }
    free(c.scales), free(c.zps), free(c.codes), free(c.f32);
    onnx_raw_drop(p->m, &l->src);
    return st;
}

/* plan_weight_read, then the weight's pages of the file mapping are let go (onnx_raw_drop). */
qcal_status qdq_plan_weight(plan *p, const Onnx__NodeProto *n, int64_t t, int32_t axis,
                            qcal_dtype dtype, int64_t *out)
{
    qcal_status st = plan_weight_read(p, n, t, axis, dtype, out);
    onnx_raw_drop(p->m, p->t[t].init);
    return st;
}

