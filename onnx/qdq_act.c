/* Activation qparams of the Q/DQ plan (onnx/qdq_shared.h): the table's entry as the profile wants it
 * (quint8 asymmetric for ort, symmetric int8 for tensorrt, FP8), and the ort fusions that
 * move an op's output Q: a Relu or Clip after it, a MaxPool chain. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "onnx/qdq_shared.h"
#include "qcal/quantize.h"

/* The qparams of an activation from the table entry, as the profile wants them. */
static qcal_status act_qparams(plan *p, tinfo *ti, const qcal_calib_entry *e)
{
    if (qcal_dtype_is_float8(e->qparams.dtype)) {
        /* FP8 (docs/fp8.md): symmetric, zero-point 0 (a float8 zero-point of that type),
         * scale = amax / largest; per-channel activation entries: the largest amax over the
         * channels (one scale per tensor). TensorRT's FP8 Q/DQ is E4M3 only. */
        qcal_dtype d = e->qparams.dtype;
        if (p->opt->profile == QCAL_ONNX_PROFILE_TENSORRT && d != QCAL_FLOAT8_E4M3FN)
            return qcal_error(QCAL_ERR_UNSUPPORTED, "tensor '%s': the table's dtype %s; TensorRT's "
                              "FP8 Q/DQ takes float8_e4m3fn", ti->name, qcal_dtype_name(d));
        float s = e->qparams.scale;
        if (qcal_qscheme_is_per_channel(e->qparams.qscheme)) {
            float amax = 0.0f;
            for (int64_t c = 0; c < e->qparams.channels; c++) {
                float a;
                qcal_calib_entry_amax(e, c, &a);
                amax = fmaxf(amax, a);
            }
            s = fmaxf(amax / qcal_dtype_float8_max(d), FLT_EPSILON);
        }
        if (e->no_data)
            s = 1.0f;
        if (!(s > 0.0f && isfinite(s)))
            return qcal_error(QCAL_ERR_INVALID_ARG, "tensor '%s': FP8 scale %g is not positive and "
                              "finite", ti->name, (double)s);
        ti->dtype = d;
        ti->scale = s;
        ti->zp = 0;
        p->fp8 = true;
        return QCAL_OK;
    }
    if (p->opt->profile == QCAL_ONNX_PROFILE_TENSORRT) {
        /* Symmetric int8, zero-point 0: amax = max |range| over channels, scale = amax / 127. */
        float amax = 0.0f;
        for (int64_t c = 0; c < e->qparams.channels; c++) {
            float a;
            qcal_calib_entry_amax(e, c, &a);
            if (a > amax)
                amax = a;
        }
        float s = e->no_data ? 1.0f : amax / 127.0f;
        if (!(s >= FLT_EPSILON))
            s = FLT_EPSILON;
        if (!isfinite(s))
            return qcal_error(QCAL_ERR_INVALID_ARG, "tensor '%s': amax %g gives no finite scale", ti->name,
                              (double)amax);
        ti->dtype = QCAL_QINT8;
        ti->scale = s;
        ti->zp = 0;
        return QCAL_OK;
    }
    const qcal_qparams *q = &e->qparams;
    if (q->dtype != QCAL_QUINT8 && q->dtype != QCAL_QINT8)
        return qcal_error(QCAL_ERR_UNSUPPORTED, "tensor '%s': the table's dtype %s cannot be a QuantizeLinear type",
                          ti->name, qcal_dtype_name(q->dtype));
    if (!qcal_qscheme_is_per_channel(q->qscheme)) {
        ti->dtype = q->dtype;
        ti->scale = q->scale;
        ti->zp = q->zero_point;
        return QCAL_OK;
    }
    /* Per-channel activation entries: QLinearConv takes one input scale, so the channels'
     * range (min of mins, max of maxes) gives per-tensor quint8 affine qparams. */
    float lo = INFINITY, hi = -INFINITY;
    for (int64_t c = 0; c < q->channels; c++) {
        if (e->min_val[c] <= e->max_val[c]) {
            lo = fminf(lo, e->min_val[c]);
            hi = fmaxf(hi, e->max_val[c]);
        }
    }
    qcal_qconfig cfg;
    qcal_qconfig_default(&cfg);
    qcal_qparams out = { 0 };
    qcal_status st = qcal_qparams_compute(&cfg, 0, 1, &lo, &hi, &out);
    if (st < 0)
        return st;
    ti->dtype = QCAL_QUINT8;
    ti->scale = out.scale;
    ti->zp = out.zero_point;
    qcal_qparams_free(&out);
    return QCAL_OK;
}

/* Looks up a tensor's activation qparams; false (and ti->missing) when the table lacks it. */
qcal_status qdq_lookup(plan *p, int64_t t, bool *found)
{
    tinfo *ti = &p->t[t];
    *found = true;
    if (ti->assigned)
        return QCAL_OK;
    if (!ti->listed) {
        ti->listed = true;
        if (!onnx_push((void ***)&p->list, (size_t *)&p->nlist, (void *)ti->name))
            return OOM();
    }
    if (!p->table)
        return QCAL_OK;
    const qcal_calib_entry *e = NULL;
    if (qcal_calib_table_find(p->table, ti->name, QCAL_CALIB_ROLE_ACTIVATION, &e) != QCAL_OK &&
        qcal_calib_table_find(p->table, ti->name, QCAL_CALIB_ROLE_WEIGHT, &e) != QCAL_OK) {
        qcal_clear_error();
        ti->missing = true;
        *found = false;
        return QCAL_OK;
    }
    return act_qparams(p, ti, e);
}

/* The single Relu that consumes t (ort fuses it), or -1. */
int64_t qdq_fused_relu(plan *p, int64_t t)
{
    const onnx_tref *ti = &p->x.t[t];
    if (ti->graph_out || ti->sub_ref || ti->n_cons != 1)
        return -1;
    const Onnx__NodeProto *n = p->g->node[ti->cons0];
    if (strcmp(n->op_type, "Relu") || (n->domain && n->domain[0]) || n->n_output < 1 || !n->output[0][0] ||
        qdq_excluded(p, n->name) || qdq_excluded(p, n->output[0]))
        return -1;
    return ti->cons0;
}

/* Clip's bounds: constant inputs 1 and 2 (opset >= 11; an omitted one is unbounded; an
 * initializer, a Constant, or either behind Identity / Cast nodes as torch.onnx writes them)
 * or the min / max attributes (before 11); false when one is not a constant scalar. */
static bool clip_bounds(plan *p, const Onnx__NodeProto *n, float *lo, float *hi)
{
    *lo = -INFINITY;
    *hi = INFINITY;
    const Onnx__AttributeProto *a;
    if ((a = onnx_node_attr(n, "min")) && a->has_f)
        *lo = a->f;
    if ((a = onnx_node_attr(n, "max")) && a->has_f)
        *hi = a->f;
    for (size_t k = 1; k < n->n_input && k < 3; k++) {
        const char *name = n->input[k];
        if (!name[0])
            continue;
        int64_t t = qdq_const_src(p, name);
        for (int hop = 0; t < 0 && hop < 4; hop++) {
            int64_t ti = qdq_tensor_index(p, name);
            const Onnx__NodeProto *pn = ti >= 0 && p->x.t[ti].producer >= 0 ? p->g->node[p->x.t[ti].producer] : NULL;
            if (!pn || (strcmp(pn->op_type, "Cast") && strcmp(pn->op_type, "Identity")) || pn->n_input < 1)
                break;
            name = pn->input[0];
            t = qdq_const_src(p, name);
        }
        float *v = NULL;
        int64_t cnt = 0;
        if (t < 0 || onnx_tensor_to_float(p->t[t].init, &v, &cnt) != QCAL_OK || cnt != 1 || isnan(v[0])) {
            free(v);
            qcal_clear_error();
            return false;
        }
        if (k == 1)
            *lo = v[0];
        else
            *hi = v[0];
        free(v);
    }
    return *lo <= *hi;
}

/* ort: the single Clip that consumes t, when Clip is an enabled op type and its bounds are
 * constants around 0 (a uint8 / int8 Q range always holds 0, so only then can it lie inside
 * [min, max] and ONNX Runtime's ClipQuantFusion remove the Clip); its bounds in *lo, *hi.
 * Else -1. */
int64_t qdq_fused_clip(plan *p, int64_t t, float *lo, float *hi)
{
    const onnx_tref *ti = &p->x.t[t];
    if (ti->graph_out || ti->sub_ref || ti->n_cons != 1)
        return -1;
    const Onnx__NodeProto *n = p->g->node[ti->cons0];
    const op_def *d = qdq_op_of(p, n);
    if (!d || d->kind != K_ACT || n->n_input < 1 || strcmp(n->input[0], ti->name) || n->n_output < 1 ||
        !n->output[0][0] || qdq_excluded(p, n->name) || qdq_excluded(p, n->output[0]))
        return -1;
    if (!clip_bounds(p, n, lo, hi) || !(*lo <= 0.0f && *hi >= 0.0f))
        return -1;
    return ti->cons0;
}

/* The Q range of (scale, zero-point) as ONNX Runtime's ClipQuantFusion computes it, scale x
 * (q - zero-point) in float for the type's lowest and highest q, lies inside [lo, hi]. */
static bool q_range_inside(qcal_dtype d, float s, int32_t zp, float lo, float hi)
{
    int32_t qmin = d == QCAL_QUINT8 ? 0 : -128, qmax = d == QCAL_QUINT8 ? 255 : 127;
    float a = s * (float)(qmin - zp), b = s * (float)(qmax - zp);
    return a >= lo && b <= hi;
}

/* ort, a fused Clip(lo, hi): the Q after the Clip takes the Clip output's qparams when their
 * Q range lies inside [lo, hi] (ONNX Runtime then removes the Clip); otherwise that range
 * clamped to [lo, hi] gives new affine qparams of the same type (zero-point at the type's
 * lowest value when lo = 0, as the Relu output's), the scale lowered just enough for the
 * range's ends to stay inside the bounds in float arithmetic. FP8 entries are left alone (ONNX
 * Runtime has no integer kernel to fuse them into). */
qcal_status qdq_clip_qparams(tinfo *ti, float lo, float hi)
{
    if (ti->dtype != QCAL_QUINT8 && ti->dtype != QCAL_QINT8)
        return QCAL_OK;
    if (q_range_inside(ti->dtype, ti->scale, ti->zp, lo, hi))
        return QCAL_OK;
    int32_t qmin = ti->dtype == QCAL_QUINT8 ? 0 : -128, qmax = ti->dtype == QCAL_QUINT8 ? 255 : 127;
    float rlo = fmaxf(ti->scale * (float)(qmin - ti->zp), lo), rhi = fminf(ti->scale * (float)(qmax - ti->zp), hi);
    qcal_qconfig cfg;
    qcal_qconfig_default(&cfg);
    cfg.dtype = ti->dtype;
    qcal_qparams out = { 0 };
    qcal_status st = qcal_qparams_compute(&cfg, 0, 1, &rlo, &rhi, &out);
    if (st < 0)
        return st;
    float s = out.scale;
    int32_t zp = out.zero_point;
    qcal_qparams_free(&out);
    if (zp > qmin && isfinite(lo))
        s = fminf(s, lo / (float)(qmin - zp));
    if (zp < qmax && isfinite(hi))
        s = fminf(s, hi / (float)(qmax - zp));
    for (int i = 0; i < 8 && s > 0.0f && !q_range_inside(ti->dtype, s, zp, lo, hi); i++)
        s = nextafterf(s, 0.0f);
    if (!(s >= FLT_EPSILON && isfinite(s)) || !q_range_inside(ti->dtype, s, zp, lo, hi))
        return QCAL_OK;   /* a degenerate range: the table's qparams, the Clip stays */
    ti->scale = s;
    ti->zp = zp;
    return QCAL_OK;
}

/* ort: the output of the MaxPool chain that starts at t (each MaxPool the single consumer of
 * the tensor before it), else t. The output Q of the op that writes t takes that tensor's
 * table entry: max-pool commutes with per-tensor quantization, so the error the next op sees
 * is the error on the pool's output, and the pool's output (the maxima, fewer values near 0)
 * is the distribution to calibrate; the ReLU output before the pool would make KL (entropy)
 * clip the maxima (measured on the demo CNN: 1.05 instead of 2.01). Shape ops (Flatten,
 * Reshape, ...) move values without changing their distribution and are not followed. */
int64_t qdq_move_chain_end(plan *p, int64_t t)
{
    for (int guard = 0; guard < 64; guard++) {
        const onnx_tref *ti = &p->x.t[t];
        if (ti->graph_out || ti->sub_ref || ti->n_cons != 1)
            return t;
        const Onnx__NodeProto *c = NULL;
        for (size_t i = 0; i < p->g->n_node && !c; i++)
            for (size_t k = 0; k < p->g->node[i]->n_input; k++)
                if (!strcmp(p->g->node[i]->input[k], ti->name)) {
                    c = p->g->node[i];
                    break;
                }
        const op_def *d = c ? qdq_op_of(p, c) : NULL;
        if (!d || strcmp(d->op, "MaxPool") || strcmp(c->input[0], ti->name) || qdq_excluded(p, c->name) || c->n_output < 1 ||
            !c->output[0][0] || qdq_excluded(p, c->output[0]))
            return t;
        int64_t o = qdq_tensor_index(p, c->output[0]);
        if (o < 0)
            return t;
        t = o;
    }
    return t;
}
