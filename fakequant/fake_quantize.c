/* The FakeQuantize object: an observer plus a fake-quant, as torch.ao.quantization's
 * FakeQuantize (non-fused, PyTorch 1.13) and, in learnable mode, _LearnableFakeQuantize.
 *
 * forward(x):
 *   observer enabled and not frozen: observe x, qparams <- observer (scale, zero-point;
 *     learnable: copied into the float parameters, as static_enabled does);
 *   learnable with the observer off: scale clamped to >= eps (PyTorch's
 *     `scale.data.clamp_(min=eps)`; this is qcal's guard against LSQ scales going
 *     negative or to zero: an optimiser step may leave any value, the next forward fixes it;
 *     NaN scales are reset to eps as well);
 *   fake-quant enabled: y = fake-quant(x) with the mask recorded (learnable: symmetric
 *     qschemes zero the zero-point first, as PyTorch); otherwise y = x.
 * backward(grad): mask applied; learnable with the observer off (parameter learning) also
 *   accumulates grad_scale / grad_zero_point, using the qparams of the forward.
 * freeze_after = N: after the N-th forward the observer is disabled for good. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "qcal/atomic_file.h"
#include "fakequant/fakequant_impl.h"
#include "qcal/qparams.h"

struct qcal_fakequant_module {
    qcal_fakequant_module_config cfg;
    qcal_observer *obs;
    int64_t qmin, qmax;
    bool per_channel, symmetric;
    bool observer_enabled, fake_quant_enabled, frozen;
    int64_t steps;
    /* qparams: nch values. Learnable: scale / zp_param are the learned parameters. */
    int64_t nch;
    float *scale;
    float *zp_param;      /* float zero-points (learnable parameters; integer values else) */
    float *grad_scale, *grad_zp;
    /* Last forward, for backward. */
    bool have_last, last_fq, last_learning;
    int64_t last_n;
    qcal_tensor last_shape;   /* data unused */
    float last_grad_factor;
    float *last_scale, *last_zp;   /* qparams the forward used (nch) */
    uint8_t *mask;
    float *xcopy;             /* learnable: x of the last forward */
    int64_t buf_cap;          /* capacity of mask / xcopy in elements */
};

void qcal_fakequant_module_config_default(qcal_fakequant_module_config *cfg, qcal_fakequant_preset preset)
{
    memset(cfg, 0, sizeof *cfg);
    switch (preset) {
    case QCAL_FAKEQUANT_PRESET_WEIGHT_PER_CHANNEL:
        qcal_observer_config_default(&cfg->observer,
                                     QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX);
        cfg->observer.q.dtype = QCAL_QINT8;
        cfg->observer.q.qscheme = QCAL_PER_CHANNEL_SYMMETRIC;
        cfg->observer.axis = 0;
        break;
    case QCAL_FAKEQUANT_PRESET_WEIGHT_PER_TENSOR:
        qcal_observer_config_default(&cfg->observer, QCAL_OBSERVER_MOVING_AVERAGE_MINMAX);
        cfg->observer.q.dtype = QCAL_QINT8;
        cfg->observer.q.qscheme = QCAL_PER_TENSOR_SYMMETRIC;
        break;
    case QCAL_FAKEQUANT_PRESET_ACTIVATION_FULL_RANGE:
        qcal_observer_config_default(&cfg->observer, QCAL_OBSERVER_MOVING_AVERAGE_MINMAX);
        break;
    case QCAL_FAKEQUANT_PRESET_ACTIVATION:
    default:
        qcal_observer_config_default(&cfg->observer, QCAL_OBSERVER_MOVING_AVERAGE_MINMAX);
        cfg->observer.q.reduce_range = true;
        break;
    }
    cfg->learnable = false;
    cfg->use_grad_scaling = false;
    cfg->init_scale = 1.0f;
    cfg->init_zero_point = 0.0f;
    cfg->channels = 0;
    cfg->freeze_after = 0;
}

void qcal_fakequant_module_destroy(qcal_fakequant_module **fq)
{
    if (!fq || !*fq)
        return;
    qcal_fakequant_module *f = *fq;
    qcal_observer_destroy(&f->obs);
    free(f->scale);
    free(f->zp_param);
    free(f->grad_scale);
    free(f->grad_zp);
    free(f->last_scale);
    free(f->last_zp);
    free(f->mask);
    free(f->xcopy);
    free(f);
    *fq = NULL;
}

/* (Re)sizes the per-channel arrays to n, filling parameters with the initial values. */
static qcal_status resize_params(qcal_fakequant_module *f, int64_t n)
{
    if (n == f->nch && f->scale)
        return QCAL_OK;
    float *a[6] = { NULL };
    for (int i = 0; i < 6; i++) {
        a[i] = qcal_calloc((size_t)n, sizeof(float));
        if (!a[i]) {
            for (int j = 0; j < i; j++)
                free(a[j]);
            return QCAL_ERR_NO_MEMORY;
        }
    }
    for (int64_t c = 0; c < n; c++) {
        a[0][c] = f->cfg.learnable ? f->cfg.init_scale : 1.0f;
        a[1][c] = f->cfg.learnable ? f->cfg.init_zero_point : 0.0f;
    }
    free(f->scale); free(f->zp_param); free(f->grad_scale); free(f->grad_zp);
    free(f->last_scale); free(f->last_zp);
    f->scale = a[0]; f->zp_param = a[1]; f->grad_scale = a[2]; f->grad_zp = a[3];
    f->last_scale = a[4]; f->last_zp = a[5];
    f->nch = n;
    return QCAL_OK;
}

static qcal_status validate_config(const qcal_fakequant_module_config *cfg, int64_t *qmin,
                                   int64_t *qmax)
{
    qcal_status st = qcal_observer_config_validate(&cfg->observer);
    if (st != QCAL_OK)
        return st;
    if (cfg->observer.q.qscheme == QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS)
        return qcal_error(QCAL_ERR_UNSUPPORTED,
                          "fake-quantize objects do not support "
                          "per_channel_affine_float_qparams");
    st = qcal_qconfig_range(&cfg->observer.q, qmin, qmax);
    if (st == QCAL_OK)
        st = qcal_fq_check_range(*qmin, *qmax);
    if (st != QCAL_OK)
        return st;
    if (cfg->learnable && qcal_dtype_is_float8(cfg->observer.q.dtype))
        return qcal_error(QCAL_ERR_UNSUPPORTED, "%s has no learnable (LSQ) fake-quantize",
                          qcal_dtype_name(cfg->observer.q.dtype));
    if (cfg->learnable) {
        if (!(cfg->init_scale > 0.0f && isfinite(cfg->init_scale)))
            return qcal_error(QCAL_ERR_INVALID_ARG, "init_scale %g must be > 0 and finite",
                              (double)cfg->init_scale);
        if (!isfinite(cfg->init_zero_point))
            return qcal_error(QCAL_ERR_INVALID_ARG, "init_zero_point %g is not finite",
                              (double)cfg->init_zero_point);
        if (cfg->use_grad_scaling && *qmax < 1)
            return qcal_error(QCAL_ERR_INVALID_ARG,
                              "use_grad_scaling needs quant_max >= 1 (got %lld)",
                              (long long)*qmax);
    }
    if (cfg->channels < 0 || cfg->channels > (int64_t)1 << 31)
        return qcal_error(QCAL_ERR_INVALID_ARG, "channels %lld is out of range [0, 2^31]",
                          (long long)cfg->channels);
    if (cfg->freeze_after < 0)
        return qcal_error(QCAL_ERR_INVALID_ARG, "freeze_after %lld is negative",
                          (long long)cfg->freeze_after);
    return QCAL_OK;
}

qcal_status qcal_fakequant_module_create(const qcal_fakequant_module_config *cfg,
                                      qcal_fakequant_module **out)
{
    if (!cfg || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "config or output is NULL");
    int64_t qmin, qmax;
    qcal_status st = validate_config(cfg, &qmin, &qmax);
    if (st != QCAL_OK)
        return st;
    qcal_fakequant_module *f = qcal_calloc(1, sizeof *f);
    if (!f)
        return QCAL_ERR_NO_MEMORY;
    f->cfg = *cfg;
    f->qmin = qmin;
    f->qmax = qmax;
    f->per_channel = qcal_qscheme_is_per_channel(cfg->observer.q.qscheme);
    f->symmetric = cfg->observer.q.qscheme == QCAL_PER_TENSOR_SYMMETRIC ||
                   cfg->observer.q.qscheme == QCAL_PER_CHANNEL_SYMMETRIC;
    f->observer_enabled = true;
    f->fake_quant_enabled = true;
    st = qcal_observer_create(&cfg->observer, &f->obs);
    if (st != QCAL_OK)
        goto fail;
    st = resize_params(f, cfg->channels > 0 ? cfg->channels : 1);
    if (st != QCAL_OK)
        goto fail;
    *out = f;
    return QCAL_OK;
fail:
    qcal_fakequant_module_destroy(&f);
    return st;
}

static qcal_status ensure_buffers(qcal_fakequant_module *f, int64_t n)
{
    if (n <= f->buf_cap)
        return QCAL_OK;
    uint8_t *m = qcal_malloc((size_t)n);
    float *xc = NULL;
    if (m && f->cfg.learnable)
        xc = qcal_malloc((size_t)n * sizeof *xc);
    if (!m || (f->cfg.learnable && !xc)) {
        free(m);
        free(xc);
        return QCAL_ERR_NO_MEMORY;
    }
    free(f->mask);
    free(f->xcopy);
    f->mask = m;
    f->xcopy = xc;
    f->buf_cap = n;
    return QCAL_OK;
}

/* A qparams view over the object's arrays (scale, float zero-points, integer zero-points zi,
 * which may be NULL for the learnable calls), for its current channel count. */
static void module_view(const qcal_fakequant_module *fq, const float *scale, const float *zpf,
                        const int32_t *zi, qcal_qparams *v)
{
    memset(v, 0, sizeof *v);
    v->dtype = fq->cfg.observer.q.dtype;
    v->quant_min = fq->qmin;
    v->quant_max = fq->qmax;
    if (fq->per_channel) {
        v->qscheme = QCAL_PER_CHANNEL_AFFINE;
        v->axis = fq->cfg.observer.axis;
        v->channels = fq->nch;
        v->scales = scale;
        v->zero_points = zi;
        v->zero_points_float = zpf;
    } else {
        v->qscheme = QCAL_PER_TENSOR_AFFINE;
        v->channels = 1;
        v->scale = scale[0];
        v->zero_point = zi ? zi[0] : 0;
        v->zero_point_float = zpf[0];
    }
}

/* Observer qparams into the object's arrays (resized to the observer's channel count). */
static qcal_status take_observer_qparams(qcal_fakequant_module *f)
{
    int64_t ch = 1;
    qcal_status st = qcal_observer_channels(f->obs, &ch);
    if (st != QCAL_OK)
        return st;
    if (ch < 1)
        ch = 1;
    (void)ch;
    qcal_qparams qp = {0};
    st = qcal_observer_qparams(f->obs, &qp);
    if (st >= 0)
        st = resize_params(f, qp.channels);
    if (st >= 0) {
        for (int64_t c = 0; c < qp.channels; c++) {
            f->scale[c] = qcal_qparams_scale_at(&qp, c);
            f->zp_param[c] = (float)qcal_qparams_zero_point_at(&qp, c);
        }
        st = QCAL_OK;
    }
    qcal_qparams_free(&qp);
    return st;
}

qcal_status qcal_fakequant_module_forward(qcal_fakequant_module *fq, const qcal_tensor *x,
                                          qcal_tensor_mut *yv)
{
    if (!fq || !x || !yv)
        return qcal_error(QCAL_ERR_INVALID_ARG, "object, tensor or output is NULL");
    int64_t n;
    qcal_status st = qcal_tensor_numel(x, &n);
    if (st != QCAL_OK)
        return st;
    if (n == 0)
        return qcal_error(QCAL_ERR_EMPTY, "cannot fake-quantize an empty tensor");
    if (!x->data)
        return qcal_error(QCAL_ERR_INVALID_ARG, "tensor data is NULL");
    st = qcal_fq_check_dst("fakequant module forward", yv, n, "output");
    if (st != QCAL_OK)
        return st;
    float *y = yv->data;
    int64_t outer = 1, ch = 1, inner = n;
    if (fq->per_channel) {
        st = qcal_fq_split(x, fq->cfg.observer.axis, &outer, &ch, &inner);
        if (st != QCAL_OK)
            return st;
    }
    bool observe = fq->observer_enabled && !fq->frozen;
    /* Parameters must match the channel count when they will not come from the observer. */
    if (fq->per_channel && fq->fake_quant_enabled && !observe && fq->nch != ch) {
        if (fq->cfg.learnable && fq->steps == 0 && fq->cfg.channels == 0) {
            st = resize_params(fq, ch);
            if (st != QCAL_OK)
                return st;
        } else {
            return qcal_error(QCAL_ERR_MISMATCH,
                              "tensor has %lld channels on axis %d but the fake-quantize "
                              "holds %lld qparams",
                              (long long)ch, (int)fq->cfg.observer.axis, (long long)fq->nch);
        }
    }
    st = ensure_buffers(fq, n);
    if (st != QCAL_OK)
        return st;
    if (observe) {
        st = qcal_observer_update(fq->obs, x);
        if (st != QCAL_OK)
            return st;
        st = take_observer_qparams(fq);
        if (st != QCAL_OK)
            return st;
    } else if (fq->cfg.learnable) {
        float eps = fq->cfg.observer.q.eps;
        for (int64_t c = 0; c < fq->nch; c++)
            if (!(fq->scale[c] >= eps))   /* also catches NaN */
                fq->scale[c] = eps;
        for (int64_t c = 0; c < fq->nch; c++)
            if (!isfinite(fq->zp_param[c]))
                return qcal_error(QCAL_ERR_NONFINITE, "learned zero_point[%lld] is %g",
                                  (long long)c, (double)fq->zp_param[c]);
    }
    if (fq->per_channel && fq->nch != ch)
        return qcal_error(QCAL_ERR_MISMATCH,
                          "tensor has %lld channels on axis %d but the observer gave %lld",
                          (long long)ch, (int)fq->cfg.observer.axis, (long long)fq->nch);
    fq->last_fq = fq->fake_quant_enabled;
    fq->last_learning = fq->cfg.learnable && !observe;
    if (fq->fake_quant_enabled) {
        if (fq->cfg.learnable && fq->symmetric)
            for (int64_t c = 0; c < fq->nch; c++)
                fq->zp_param[c] = 0.0f;
        for (int64_t c = 0; c < fq->nch; c++) {
            fq->last_scale[c] = fq->scale[c];
            fq->last_zp[c] = fq->zp_param[c];
        }
        if (fq->cfg.learnable) {
            memcpy(fq->xcopy, x->data, (size_t)n * sizeof(float));   /* before y may alias */
            double g = 1.0;
            if (fq->cfg.use_grad_scaling) {
                st = qcal_fakequant_grad_factor(n, fq->qmax, &g);
                if (st != QCAL_OK)
                    return st;
            }
            fq->last_grad_factor = (float)g;
            qcal_qparams v;
            module_view(fq, fq->scale, fq->zp_param, NULL, &v);
            st = qcal_fakequant_learnable_forward(x, &v, yv, fq->mask);
        } else {
            int32_t zp1 = 0, *zp = &zp1;
            if (fq->per_channel && !(zp = qcal_malloc((size_t)fq->nch * sizeof *zp)))
                return QCAL_ERR_NO_MEMORY;
            for (int64_t c = 0; c < fq->nch; c++)
                zp[c] = (int32_t)fq->zp_param[c];
            qcal_qparams v;
            module_view(fq, fq->scale, fq->zp_param, zp, &v);
            st = qcal_fakequant_forward(x, &v, yv, fq->mask);
            if (zp != &zp1)
                free(zp);
        }
        if (st != QCAL_OK)
            return st;
    } else if (y != x->data) {
        memmove(y, x->data, (size_t)n * sizeof(float));
    }
    fq->have_last = true;
    fq->last_n = n;
    fq->last_shape = *x;
    fq->steps++;
    if (fq->cfg.freeze_after > 0 && fq->steps >= fq->cfg.freeze_after)
        fq->frozen = true;
    return QCAL_OK;
}

qcal_status qcal_fakequant_module_backward(qcal_fakequant_module *fq, const qcal_tensor *grad_y,
                                           qcal_tensor_mut *grad_x)
{
    if (!fq || !grad_y || !grad_x)
        return qcal_error(QCAL_ERR_INVALID_ARG, "object or gradient is NULL");
    if (!fq->have_last)
        return qcal_error(QCAL_ERR_STATE, "backward called without a forward");
    int64_t n;
    qcal_status st = qcal_tensor_numel(grad_y, &n);
    if (st != QCAL_OK)
        return st;
    if (n != fq->last_n)
        return qcal_error(QCAL_ERR_MISMATCH, "backward over %lld elements, forward had %lld",
                          (long long)n, (long long)fq->last_n);
    if (!grad_y->data)
        return qcal_error(QCAL_ERR_INVALID_ARG, "fakequant module backward: grad_y data is NULL");
    st = qcal_fq_check_dst("fakequant module backward", grad_x, n, "grad_x");
    if (st != QCAL_OK)
        return st;
    if (!fq->last_fq) {
        if (grad_x->data != grad_y->data)
            memmove(grad_x->data, grad_y->data, (size_t)n * sizeof(float));
        return QCAL_OK;
    }
    qcal_tensor gy;
    qcal_tensor_mut gx;
    int64_t shape1 = n;
    qcal_tensor_init(&gy, grad_y->data, 1, &shape1);
    qcal_tensor_mut_init(&gx, grad_x->data, 1, &shape1);
    if (!fq->cfg.learnable)
        return qcal_fakequant_backward(&gy, fq->mask, &gx);
    qcal_tensor t = fq->last_shape;
    t.data = fq->xcopy;
    qcal_qparams v;
    module_view(fq, fq->last_scale, fq->last_zp, NULL, &v);
    float g1[2], *gs = g1;
    if (fq->per_channel && !(gs = qcal_malloc((size_t)fq->nch * 2 * sizeof *gs)))
        return QCAL_ERR_NO_MEMORY;
    st = qcal_fakequant_learnable_backward(&t, &gy, &v, fq->last_grad_factor, &gx, gs,
                                           gs + v.channels);
    if (st == QCAL_OK && fq->last_learning)
        for (int64_t c = 0; c < v.channels; c++) {
            fq->grad_scale[c] += gs[c];
            fq->grad_zp[c] += gs[v.channels + c];
        }
    if (gs != g1)
        free(gs);
    return st;
}

qcal_status qcal_fakequant_module_enable_observer(qcal_fakequant_module *fq, bool enabled)
{
    if (!fq)
        return qcal_error(QCAL_ERR_INVALID_ARG, "object is NULL");
    if (enabled && fq->frozen)
        return qcal_error(QCAL_ERR_STATE, "the fake-quantize is frozen (after %lld steps)",
                          (long long)fq->steps);
    fq->observer_enabled = enabled;
    return QCAL_OK;
}

qcal_status qcal_fakequant_module_enable_fake_quant(qcal_fakequant_module *fq, bool enabled)
{
    if (!fq)
        return qcal_error(QCAL_ERR_INVALID_ARG, "object is NULL");
    fq->fake_quant_enabled = enabled;
    return QCAL_OK;
}

qcal_status qcal_fakequant_module_freeze(qcal_fakequant_module *fq)
{
    if (!fq)
        return qcal_error(QCAL_ERR_INVALID_ARG, "object is NULL");
    fq->frozen = true;
    fq->observer_enabled = false;
    return QCAL_OK;
}

qcal_status qcal_fakequant_module_status(const qcal_fakequant_module *fq, bool *observer_enabled,
                                      bool *fake_quant_enabled, bool *frozen, int64_t *steps)
{
    if (!fq)
        return qcal_error(QCAL_ERR_INVALID_ARG, "object is NULL");
    if (observer_enabled)
        *observer_enabled = fq->observer_enabled && !fq->frozen;
    if (fake_quant_enabled)
        *fake_quant_enabled = fq->fake_quant_enabled;
    if (frozen)
        *frozen = fq->frozen;
    if (steps)
        *steps = fq->steps;
    return QCAL_OK;
}

qcal_status qcal_fakequant_module_qparams(const qcal_fakequant_module *fq, qcal_qparams *out)
{
    if (!fq || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "object or output is NULL");
    qcal_qparams v;
    float *s, *zf;
    int32_t *z;
    qcal_status st = qcal_qparams_alloc(&v, fq->cfg.observer.q.dtype,
                                        fq->per_channel ? QCAL_PER_CHANNEL_AFFINE
                                                        : QCAL_PER_TENSOR_AFFINE,
                                        fq->cfg.observer.axis, fq->qmin, fq->qmax,
                                        fq->per_channel ? fq->nch : 1, &s, &z, &zf);
    if (st != QCAL_OK)
        return st;
    if (!fq->per_channel) {
        s = &v.scale;
        z = &v.zero_point;
        zf = &v.zero_point_float;
    }
    for (int64_t c = 0; c < v.channels; c++) {
        s[c] = fq->scale[c];
        zf[c] = fq->zp_param[c];
        z[c] = (int32_t)(fq->cfg.learnable
                             ? qcal_fq_round_zero_point(fq->zp_param[c], fq->qmin, fq->qmax)
                             : (int64_t)fq->zp_param[c]);
    }
    *out = v;
    return QCAL_OK;
}

qcal_status qcal_fakequant_module_params(qcal_fakequant_module *fq, float **scale, float **zero_point,
                                      float **grad_scale, float **grad_zero_point, int64_t *n)
{
    if (!fq)
        return qcal_error(QCAL_ERR_INVALID_ARG, "object is NULL");
    if (!fq->cfg.learnable)
        return qcal_error(QCAL_ERR_STATE, "the fake-quantize is not learnable");
    if (fq->per_channel && fq->steps == 0 && fq->cfg.channels == 0)
        return qcal_error(QCAL_ERR_STATE,
                          "per-channel parameters are sized by the first forward "
                          "(or set config.channels)");
    if (scale)
        *scale = fq->scale;
    if (zero_point)
        *zero_point = fq->zp_param;
    if (grad_scale)
        *grad_scale = fq->grad_scale;
    if (grad_zero_point)
        *grad_zero_point = fq->grad_zp;
    if (n)
        *n = fq->nch;
    return QCAL_OK;
}

qcal_status qcal_fakequant_module_zero_grad(qcal_fakequant_module *fq)
{
    if (!fq)
        return qcal_error(QCAL_ERR_INVALID_ARG, "object is NULL");
    if (!fq->cfg.learnable)
        return qcal_error(QCAL_ERR_STATE, "the fake-quantize is not learnable");
    memset(fq->grad_scale, 0, (size_t)fq->nch * sizeof(float));
    memset(fq->grad_zp, 0, (size_t)fq->nch * sizeof(float));
    return QCAL_OK;
}

qcal_status qcal_fakequant_module_observer(const qcal_fakequant_module *fq, const qcal_observer **obs)
{
    if (!fq || !obs)
        return qcal_error(QCAL_ERR_INVALID_ARG, "object or output is NULL");
    *obs = fq->obs;
    return QCAL_OK;
}

/* ---- state blob ----
 * "QCFQ" u32 version, u32 flags (bit0 learnable, bit1 use_grad_scaling, bit2 observer
 * enabled, bit3 fake-quant enabled, bit4 frozen), f32 init_scale, f32 init_zero_point,
 * u64 channels, u64 freeze_after, u64 steps, u64 nch, f32 scale[nch], f32 zp[nch],
 * f32 grad_scale[nch], f32 grad_zp[nch], u64 observer blob length, observer blob. */
#define FQ_MAGIC 0x51464351u /* "QCFQ" */
#define FQ_VERSION 1u
#define FQ_MAX_CHANNELS ((uint64_t)1 << 31)

qcal_status qcal_fakequant_module_save(const qcal_fakequant_module *fq, void **buf, size_t *len)
{
    if (!fq || !buf || !len)
        return qcal_error(QCAL_ERR_INVALID_ARG, "object or outputs are NULL");
    void *ob = NULL;
    size_t olen = 0;
    qcal_status st = qcal_observer_save(fq->obs, &ob, &olen);
    if (st != QCAL_OK)
        return st;
    qcal_buf b = { 0 };
    uint32_t flags = (fq->cfg.learnable ? 1u : 0u) | (fq->cfg.use_grad_scaling ? 2u : 0u) |
                     (fq->observer_enabled ? 4u : 0u) | (fq->fake_quant_enabled ? 8u : 0u) |
                     (fq->frozen ? 16u : 0u);
    qcal_buf_u32(&b, FQ_MAGIC);
    qcal_buf_u32(&b, FQ_VERSION);
    qcal_buf_u32(&b, flags);
    qcal_buf_f32(&b, fq->cfg.init_scale);
    qcal_buf_f32(&b, fq->cfg.init_zero_point);
    qcal_buf_u64(&b, (uint64_t)fq->cfg.channels);
    qcal_buf_u64(&b, (uint64_t)fq->cfg.freeze_after);
    qcal_buf_u64(&b, (uint64_t)fq->steps);
    qcal_buf_u64(&b, (uint64_t)fq->nch);
    qcal_buf_append(&b, fq->scale, (size_t)fq->nch * 4);
    qcal_buf_append(&b, fq->zp_param, (size_t)fq->nch * 4);
    qcal_buf_append(&b, fq->grad_scale, (size_t)fq->nch * 4);
    qcal_buf_append(&b, fq->grad_zp, (size_t)fq->nch * 4);
    qcal_buf_u64(&b, (uint64_t)olen);
    qcal_buf_append(&b, ob, olen);
    qcal_free(ob);
    if (b.failed) {
        qcal_buf_free(&b);
        return qcal_error(QCAL_ERR_NO_MEMORY, "cannot allocate the fake-quantize state buffer");
    }
    *buf = b.data;
    *len = b.len;
    return QCAL_OK;
}

qcal_status qcal_fakequant_module_load(const void *buf, size_t len, qcal_fakequant_module **out)
{
    if (!buf || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "buffer or output is NULL");
    qcal_cursor cur = { .p = buf, .left = len };
    uint32_t magic, version, flags;
    if (!qcal_cur_u32(&cur, &magic) || magic != FQ_MAGIC)
        return qcal_error(QCAL_ERR_FORMAT, "not a qcal fake-quantize state (bad magic)");
    if (!qcal_cur_u32(&cur, &version) || version != FQ_VERSION)
        return qcal_error(QCAL_ERR_FORMAT, "fake-quantize state version %u is not supported",
                          (unsigned)version);
    float init_s, init_z;
    uint64_t channels, freeze_after, steps, nch, olen;
    if (!qcal_cur_u32(&cur, &flags) || !qcal_cur_f32(&cur, &init_s) ||
        !qcal_cur_f32(&cur, &init_z) || !qcal_cur_u64(&cur, &channels) ||
        !qcal_cur_u64(&cur, &freeze_after) || !qcal_cur_u64(&cur, &steps) ||
        !qcal_cur_u64(&cur, &nch))
        return qcal_error(QCAL_ERR_FORMAT, "fake-quantize state is truncated in its header");
    if (flags > 31)
        return qcal_error(QCAL_ERR_FORMAT, "fake-quantize state has unknown flags 0x%x",
                          (unsigned)flags);
    if (nch < 1 || nch > FQ_MAX_CHANNELS || channels > FQ_MAX_CHANNELS ||
        freeze_after > INT64_MAX || steps > INT64_MAX)
        return qcal_error(QCAL_ERR_FORMAT,
                          "fake-quantize state has impossible counts (channels %llu, "
                          "qparams %llu)",
                          (unsigned long long)channels, (unsigned long long)nch);
    if (cur.left < nch * 16 + 8)
        return qcal_error(QCAL_ERR_FORMAT, "fake-quantize state is truncated (%zu bytes left "
                          "for %llu qparams)", cur.left, (unsigned long long)nch);
    const uint8_t *arrays = cur.p;
    cur.p += nch * 16;
    cur.left -= nch * 16;
    if (!qcal_cur_u64(&cur, &olen) || olen != cur.left)
        return qcal_error(QCAL_ERR_FORMAT,
                          "fake-quantize state: observer blob length %llu, %zu bytes left",
                          (unsigned long long)olen, cur.left);
    qcal_observer *obs = NULL;
    qcal_status st = qcal_observer_load(cur.p, cur.left, &obs);
    if (st != QCAL_OK) {
        /* qcal_error formats into the buffer qcal_last_error() returns: copy the cause. */
        char cause[1024];
        snprintf(cause, sizeof cause, "%s", qcal_last_error());
        return st == QCAL_ERR_NO_MEMORY ? st
                                        : qcal_error(QCAL_ERR_FORMAT,
                                                     "fake-quantize state: bad observer: %s",
                                                     cause);
    }
    qcal_fakequant_module_config cfg;
    qcal_fakequant_module_config_default(&cfg, QCAL_FAKEQUANT_PRESET_ACTIVATION);
    cfg.observer = *qcal_observer_get_config(obs);
    cfg.learnable = flags & 1u;
    cfg.use_grad_scaling = (flags & 2u) != 0;
    cfg.init_scale = init_s;
    cfg.init_zero_point = init_z;
    cfg.channels = (int64_t)channels;
    cfg.freeze_after = (int64_t)freeze_after;
    qcal_fakequant_module *f = NULL;
    st = qcal_fakequant_module_create(&cfg, &f);
    if (st != QCAL_OK) {
        char cause[1024];
        snprintf(cause, sizeof cause, "%s", qcal_last_error());
        qcal_observer_destroy(&obs);
        return st == QCAL_ERR_NO_MEMORY ? st
                                        : qcal_error(QCAL_ERR_FORMAT,
                                                     "fake-quantize state has an invalid "
                                                     "config: %s", cause);
    }
    qcal_observer_destroy(&f->obs);
    f->obs = obs;
    st = resize_params(f, (int64_t)nch);
    if (st != QCAL_OK)
        goto fail;
    memcpy(f->scale, arrays, nch * 4);
    memcpy(f->zp_param, arrays + nch * 4, nch * 4);
    memcpy(f->grad_scale, arrays + nch * 8, nch * 4);
    memcpy(f->grad_zp, arrays + nch * 12, nch * 4);
    for (uint64_t c = 0; c < nch; c++) {
        bool ok = isfinite(f->scale[c]) && isfinite(f->zp_param[c]);
        if (!cfg.learnable)
            ok = ok && f->scale[c] > 0.0f && f->zp_param[c] == nearbyintf(f->zp_param[c]) &&
                 f->zp_param[c] >= (float)f->qmin && f->zp_param[c] <= (float)f->qmax;
        if (!ok) {
            st = qcal_error(QCAL_ERR_FORMAT,
                            "fake-quantize state: qparams of channel %llu are invalid "
                            "(scale %g, zero-point %g)",
                            (unsigned long long)c, (double)f->scale[c],
                            (double)f->zp_param[c]);
            goto fail;
        }
    }
    f->observer_enabled = (flags & 4u) != 0;
    f->fake_quant_enabled = (flags & 8u) != 0;
    f->frozen = (flags & 16u) != 0;
    f->steps = (int64_t)steps;
    *out = f;
    return QCAL_OK;
fail:
    qcal_fakequant_module_destroy(&f);
    return st;
}

qcal_status qcal_fakequant_module_save_file(const qcal_fakequant_module *fq, const char *path)
{
    if (!fq || !path)
        return qcal_error(QCAL_ERR_INVALID_ARG, "object or path is NULL");
    void *buf = NULL;
    size_t len = 0;
    qcal_status st = qcal_fakequant_module_save(fq, &buf, &len);
    if (st != QCAL_OK)
        return st;
    qcal_atomic_file af;
    st = qcal_atomic_file_open(&af, path);
    if (st == QCAL_OK) {
        if (fwrite(buf, 1, len, af.fp) != len) {
            int e = errno ? errno : EIO;
            qcal_atomic_file_abort(&af);
            st = qcal_error(QCAL_ERR_IO, "cannot write '%s': %s", path, strerror(e));
        } else {
            st = qcal_atomic_file_commit(&af);
        }
    }
    qcal_free(buf);
    return st;
}

qcal_status qcal_fakequant_module_load_file(const char *path, qcal_fakequant_module **out)
{
    if (!path || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "path or output is NULL");
    FILE *f = fopen(path, "rb");
    if (!f)
        return qcal_error(QCAL_ERR_IO, "cannot open '%s'", path);
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return qcal_error(QCAL_ERR_IO, "cannot seek '%s'", path);
    }
    long len = ftell(f);
    if (len < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return qcal_error(QCAL_ERR_IO, "cannot size '%s'", path);
    }
    void *buf = qcal_malloc((size_t)len);
    if (!buf) {
        fclose(f);
        return QCAL_ERR_NO_MEMORY;
    }
    size_t got = fread(buf, 1, (size_t)len, f);
    fclose(f);
    qcal_status st;
    if (got != (size_t)len)
        st = qcal_error(QCAL_ERR_IO, "cannot read '%s'", path);
    else
        st = qcal_fakequant_module_load(buf, (size_t)len, out);
    free(buf);
    return st;
}
