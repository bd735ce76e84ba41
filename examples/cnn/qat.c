/* QAT for the demo CNN with qcal_fakequant_module objects; see qat.h. */
#define _POSIX_C_SOURCE 200809L   /* POSIX calls (mkdir, fileno, clock_gettime) under -std=c11 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ex_util.h"
#include "qat.h"

/* ---- Hooks --------------------------------------------------------------------------- */

/* A tap without a FakeQuantize (the logits when quantize_logits is false) stays float:
 * identity forward and backward. */
static qcal_status fq_act(void *user, cnn_act *a)
{
    cnn_fq_set *s = user;
    qcal_fakequant_module *fq = s->act[a->tap];
    if (!fq)
        return QCAL_OK;
    qcal_tensor t;        /* in place: the activation is both the source and the destination */
    qcal_tensor_mut y;
    qcal_status st = qcal_tensor_init(&t, a->data, a->ndim, a->shape);
    if (st == QCAL_OK)
        st = qcal_tensor_mut_init(&y, a->data, a->ndim, a->shape);
    if (st != QCAL_OK)
        return st;
    bool observing = false, frozen = true;
    if (s->dp && a->training &&
        (st = qcal_fakequant_module_status(fq, &observing, NULL, &frozen, NULL)) != QCAL_OK)
        return st;
    if (!s->dp || !a->training || !observing || frozen)
        return qcal_fakequant_module_forward(fq, &t, &y);
    /* Data-parallel: the observer steps on the whole batch (every rank's slice). The
     * activation observers are min/max kinds, which see a batch only through its min and
     * max, so the two-value batch [lo, hi] of the whole batch's range gives exactly the step
     * the whole batch gives, on every rank; the slice is then fake-quantized with the
     * resulting qparams, observer off. */
    float r[2], scratch[2];
    if ((st = s->dp->range(s->dp->user, &t, &r[0], &r[1])) != QCAL_OK)
        return st;
    qcal_tensor rt;
    qcal_tensor_mut sv;
    int64_t two = 2;
    if ((st = qcal_tensor_init(&rt, r, 1, &two)) != QCAL_OK ||
        (st = qcal_tensor_mut_init(&sv, scratch, 1, &two)) != QCAL_OK ||
        (st = qcal_fakequant_module_forward(fq, &rt, &sv)) != QCAL_OK ||
        (st = qcal_fakequant_module_enable_observer(fq, false)) != QCAL_OK)
        return st;
    st = qcal_fakequant_module_forward(fq, &t, &y);
    qcal_status st2 = qcal_fakequant_module_enable_observer(fq, true);
    return st != QCAL_OK ? st : st2;
}

/* Data-parallel: the slice's gradients and loss become the whole batch's. */
static qcal_status fq_grads(void *user, float *const *grad, float *loss)
{
    cnn_fq_set *s = user;
    if (!s->dp)
        return QCAL_OK;
    return s->dp->grads(s->dp->user, grad, loss, s->dp_n, s->dp_total);
}

/* The FakeQuantize backward in place on a flat gradient of numel floats. */
static qcal_status fq_backward_in_place(qcal_fakequant_module *fq, float *grad, int64_t numel)
{
    qcal_tensor g;
    qcal_tensor_mut gx;
    qcal_status st = qcal_tensor_init(&g, grad, 1, &numel);
    if (st == QCAL_OK)
        st = qcal_tensor_mut_init(&gx, grad, 1, &numel);
    return st != QCAL_OK ? st : qcal_fakequant_module_backward(fq, &g, &gx);
}

static qcal_status fq_act_backward(void *user, cnn_tap tap, float *grad, int64_t numel)
{
    cnn_fq_set *s = user;
    if (!s->act[tap])
        return QCAL_OK;
    return fq_backward_in_place(s->act[tap], grad, numel);
}

static qcal_status fq_weight(void *user, cnn_weight *w)
{
    cnn_fq_set *s = user;
    qcal_tensor t;        /* the FakeQuantize reads src and writes dst */
    qcal_tensor_mut d;
    qcal_status st = qcal_tensor_init(&t, w->src, w->ndim, w->shape);
    if (st == QCAL_OK)
        st = qcal_tensor_mut_init(&d, w->dst, w->ndim, w->shape);
    if (st != QCAL_OK)
        return st;
    if ((st = qcal_fakequant_module_forward(s->weight[w->layer], &t, &d)) != QCAL_OK)
        return st;
    w->used = true;
    return QCAL_OK;
}

static qcal_status fq_weight_backward(void *user, cnn_layer layer, float *grad, int64_t numel)
{
    cnn_fq_set *s = user;
    return fq_backward_in_place(s->weight[layer], grad, numel);
}

cnn_fq_opts cnn_fq_opts_default(void)
{
    cnn_fq_opts o = {.act_preset = QCAL_FAKEQUANT_PRESET_ACTIVATION, .quantize_logits = true};
    return o;
}

qcal_status cnn_fq_create(const cnn_fq_opts *opts, cnn_fq_set **out)
{
    if (!out)
        return qcal_set_error(QCAL_ERR_INVALID_ARG, "cnn_fq_create: NULL out");
    cnn_fq_opts o = opts ? *opts : cnn_fq_opts_default();
    if (o.act_preset != QCAL_FAKEQUANT_PRESET_ACTIVATION && o.act_preset != QCAL_FAKEQUANT_PRESET_ACTIVATION_FULL_RANGE)
        return qcal_set_error(QCAL_ERR_INVALID_ARG,
                              "cnn_fq_create: activation preset %d is not QCAL_FAKEQUANT_PRESET_ACTIVATION (%d) or "
                              "QCAL_FAKEQUANT_PRESET_ACTIVATION_FULL_RANGE (%d)", (int)o.act_preset, (int)QCAL_FAKEQUANT_PRESET_ACTIVATION,
                              (int)QCAL_FAKEQUANT_PRESET_ACTIVATION_FULL_RANGE);
    cnn_fq_set *s = ex_calloc(1, sizeof *s);
    if (!s)
        return QCAL_ERR_NO_MEMORY;
    qcal_status st = QCAL_OK;
    qcal_fakequant_module_config acfg, wcfg;
    qcal_fakequant_module_config_default(&acfg, o.act_preset);
    qcal_fakequant_module_config_default(&wcfg, QCAL_FAKEQUANT_PRESET_WEIGHT_PER_CHANNEL);
    for (int t = 0; t < CNN_NTAPS && st == QCAL_OK; t++)
        if (t != CNN_TAP_LOGITS || o.quantize_logits)
            st = qcal_fakequant_module_create(&acfg, &s->act[t]);
    for (int l = 0; l < CNN_NLAYERS && st == QCAL_OK; l++)
        st = qcal_fakequant_module_create(&wcfg, &s->weight[l]);
    if (st != QCAL_OK) {
        cnn_fq_destroy(&s);
        return st;
    }
    s->hooks.act = fq_act;
    s->hooks.act_backward = fq_act_backward;
    s->hooks.weight = fq_weight;
    s->hooks.weight_backward = fq_weight_backward;
    s->hooks.grads = fq_grads;
    s->hooks.user = s;
    *out = s;
    return QCAL_OK;
}

void cnn_fq_destroy(cnn_fq_set **set)
{
    if (!set || !*set)
        return;
    for (int t = 0; t < CNN_NTAPS; t++)
        qcal_fakequant_module_destroy(&(*set)->act[t]);
    for (int l = 0; l < CNN_NLAYERS; l++)
        qcal_fakequant_module_destroy(&(*set)->weight[l]);
    free(*set);
    *set = NULL;
}

static qcal_status each(cnn_fq_set *s, qcal_status (*fn)(qcal_fakequant_module *, bool), bool on)
{
    for (int t = 0; t < CNN_NTAPS; t++) {
        if (!s->act[t])
            continue;
        qcal_status st = fn(s->act[t], on);
        if (st != QCAL_OK)
            return st;
    }
    for (int l = 0; l < CNN_NLAYERS; l++) {
        qcal_status st = fn(s->weight[l], on);
        if (st != QCAL_OK)
            return st;
    }
    return QCAL_OK;
}

qcal_status cnn_fq_enable(cnn_fq_set *s, bool observer, bool fake_quant)
{
    if (!s)
        return qcal_set_error(QCAL_ERR_INVALID_ARG, "cnn_fq_enable: NULL set");
    qcal_status st = each(s, qcal_fakequant_module_enable_observer, observer);
    return st != QCAL_OK ? st : each(s, qcal_fakequant_module_enable_fake_quant, fake_quant);
}

static qcal_status freeze_one(qcal_fakequant_module *fq, bool unused)
{
    (void)unused;
    return qcal_fakequant_module_freeze(fq);
}

qcal_status cnn_fq_freeze(cnn_fq_set *s)
{
    if (!s)
        return qcal_set_error(QCAL_ERR_INVALID_ARG, "cnn_fq_freeze: NULL set");
    return each(s, freeze_one, true);
}

/* ---- Qparams export ------------------------------------------------------------------ */

void cnn_fq_qparams_free(cnn_fq_qparams *q)
{
    if (!q)
        return;
    for (int l = 0; l < CNN_NLAYERS; l++) {
        free(q->weight_scale[l]);
        free(q->weight_zero_point[l]);
        q->weight_scale[l] = NULL;
        q->weight_zero_point[l] = NULL;
    }
}

/* Qparams of one object into scale/zp (cap values); QCAL_ERR_STATE before its first forward
 * (the object would report its placeholder scale 1, zero-point 0). */
static qcal_status export_one(const qcal_fakequant_module *fq, const char *what, int64_t cap, float *scale,
                              int32_t *zp)
{
    int64_t steps = 0, n = 0;
    qcal_status st = qcal_fakequant_module_status(fq, NULL, NULL, NULL, &steps);
    if (st != QCAL_OK)
        return st;
    if (steps == 0)
        return qcal_set_error(QCAL_ERR_STATE, "cnn_fq_export: the fake-quant of %s has not run a forward, "
                              "its qparams are not calibrated", what);
    qcal_qparams qp = {0};
    if ((st = qcal_fakequant_module_qparams(fq, &qp)) != QCAL_OK)
        return st;
    n = qp.channels;
    if (n != cap) {
        qcal_qparams_free(&qp);
        return qcal_set_error(QCAL_ERR_MISMATCH, "cnn_fq_export: the fake-quant of %s has %lld channels, expected %lld",
                              what, (long long)n, (long long)cap);
    }
    for (int64_t c = 0; c < n; c++) {
        scale[c] = qcal_qparams_scale_at(&qp, c);
        zp[c] = qcal_qparams_zero_point_at(&qp, c);
    }
    qcal_qparams_free(&qp);
    return QCAL_OK;
}

qcal_status cnn_fq_export(const cnn_fq_set *s, cnn_fq_qparams *out)
{
    if (!s || !out)
        return qcal_set_error(QCAL_ERR_INVALID_ARG, "cnn_fq_export: NULL argument");
    cnn_fq_qparams q;
    memset(&q, 0, sizeof q);
    qcal_status st = QCAL_OK;
    for (int t = 0; t < CNN_NTAPS && st == QCAL_OK; t++) {
        q.act_quantized[t] = s->act[t] != NULL;
        if (s->act[t])
            st = export_one(s->act[t], cnn_tap_name(t), 1, &q.act_scale[t], &q.act_zero_point[t]);
    }
    for (int l = 0; l < CNN_NLAYERS && st == QCAL_OK; l++) {
        int64_t shape[4];
        cnn_param_shape(2 * l, shape);
        q.weight_channels[l] = shape[0];
        q.weight_scale[l] = ex_malloc((size_t)shape[0] * sizeof(float));
        q.weight_zero_point[l] = ex_malloc((size_t)shape[0] * sizeof(int32_t));
        if (!q.weight_scale[l] || !q.weight_zero_point[l]) {
            st = QCAL_ERR_NO_MEMORY;
            break;
        }
        char what[64];
        snprintf(what, sizeof what, "%s.weight", cnn_layer_name(l));
        st = export_one(s->weight[l], what, shape[0], q.weight_scale[l], q.weight_zero_point[l]);
    }
    if (st != QCAL_OK) {
        cnn_fq_qparams_free(&q);
        return st;
    }
    *out = q;
    return QCAL_OK;
}

/* ---- QAT fine-tuning ----------------------------------------------------------------- */

cnn_qat_schedule cnn_qat_schedule_default(void)
{
    cnn_qat_schedule s = {.steps = 469, .batch = 128, .lr = 2e-4f, .freeze_step = 350, .seed = 7};
    return s;
}

static qcal_status schedule_check(const char *fn, const cnn_qat_schedule *s, const cnn_data *train)
{
    if (s->steps < 0 || s->batch < 1 || !(s->lr >= 0.0f && isfinite(s->lr)) || s->freeze_step < 0 || train->n < 1)
        return qcal_set_error(QCAL_ERR_INVALID_ARG,
                              "%s: QAT steps %d, batch %d, lr %g, freeze step %d, %lld training images", fn,
                              s->steps, s->batch, (double)s->lr, s->freeze_step, (long long)train->n);
    if (s->dp && (s->dp->size < 1 || s->dp->rank < 0 || s->dp->rank >= s->dp->size ||
                  s->batch < s->dp->size || !s->dp->grads || !s->dp->range))
        return qcal_set_error(QCAL_ERR_INVALID_ARG, "%s: data-parallel rank %d of %d with batch %d", fn,
                              s->dp->rank, s->dp->size, s->batch);
    return QCAL_OK;
}

static uint64_t mix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A copy of the float weights, fresh FakeQuantize objects (observer and fake-quant on, as
 * prepare_qat), Adam from zero state, learning rate lr decayed to 0 on a cosine; observers
 * frozen after freeze_step steps. Batches are drawn with replacement from the training set
 * by a generator seeded with seed. */
qcal_status cnn_qat_finetune(cnn_ctx *ctx, const cnn_model *fm, const cnn_data *train, const cnn_fq_opts *opts,
                             const cnn_qat_schedule *s, cnn_progress_fn progress, void *pu, cnn_model **model_out,
                             cnn_fq_set **set_out)
{
    if (!ctx || !fm || !train || !s || !model_out || !set_out)
        return qcal_set_error(QCAL_ERR_INVALID_ARG, "cnn_qat_finetune: NULL argument");
    qcal_status st = schedule_check("cnn_qat_finetune", s, train);
    if (st != QCAL_OK)
        return st;
    cnn_model *qm = NULL;
    cnn_fq_set *set = NULL;
    uint8_t *bx = ex_malloc((size_t)s->batch * CNN_IMAGE_PIXELS), *by = ex_malloc((size_t)s->batch);
    st = bx && by ? cnn_model_create(0, &qm) : QCAL_ERR_NO_MEMORY;
    if (st == QCAL_OK) {
        cnn_model_copy(qm, fm);
        st = cnn_fq_create(opts, &set);
    }
    if (st == QCAL_OK)
        cnn_ctx_reset_optimizer(ctx);
    /* Data-parallel: every rank draws the same batches and trains on its rows of each. */
    int row0 = 0, rows = s->batch;
    if (st == QCAL_OK && s->dp) {
        row0 = (int)((int64_t)s->dp->rank * s->batch / s->dp->size);
        rows = (int)((int64_t)(s->dp->rank + 1) * s->batch / s->dp->size) - row0;
        set->dp = s->dp;
        set->dp_n = rows;
        set->dp_total = s->batch;
    }
    uint64_t seed = s->seed;
    double run_loss = 0.0;
    for (int step = 0; st == QCAL_OK && step < s->steps; step++) {
        if (step == s->freeze_step)
            st = cnn_fq_freeze(set);
        for (int i = 0; st == QCAL_OK && i < s->batch; i++) {
            int64_t k = (int64_t)(mix64(&seed) % (uint64_t)train->n);
            memcpy(bx + (size_t)i * CNN_IMAGE_PIXELS, train->images + k * CNN_IMAGE_PIXELS, CNN_IMAGE_PIXELS);
            by[i] = train->labels[k];
        }
        /* Cosine decay from lr to 0 over the steps. */
        float lr = (float)(0.5 * (double)s->lr * (1.0 + cos(3.14159265358979323846 * step / s->steps)));
        float loss = 0.0f;
        if (st == QCAL_OK)
            st = cnn_train_step(ctx, qm, bx + (size_t)row0 * CNN_IMAGE_PIXELS, by + row0, rows, &set->hooks, lr,
                                &loss);
        run_loss = step == 0 ? loss : 0.98 * run_loss + 0.02 * loss;
        if (progress && st == QCAL_OK)
            progress(pu, "qat", step + 1, s->steps, run_loss);
    }
    /* Frozen qparams: an int8 model quantizes the final weights with the weight fake-quants'
     * scales, exactly as the last training steps fake-quantized them. */
    if (st == QCAL_OK)
        st = cnn_fq_freeze(set);
    if (set)
        set->dp = NULL;   /* evaluation runs whole batches on each rank */
    free(bx);
    free(by);
    if (st != QCAL_OK) {
        cnn_fq_destroy(&set);
        cnn_model_destroy(&qm);
        return st;
    }
    *model_out = qm;
    *set_out = set;
    return QCAL_OK;
}

/* ---- The comparison ---------------------------------------------------------------- */

cnn_qat_opts cnn_qat_opts_default(void)
{
    cnn_qat_opts o = {
        .float_opts = cnn_train_opts_default(),
        .weights = NULL,
        .calib_batches = 32,
        .fq = cnn_fq_opts_default(),
        .qat = cnn_qat_schedule_default(),
    };
    return o;
}

static double agree(const uint8_t *a, const uint8_t *b, int64_t n)
{
    int64_t same = 0;
    for (int64_t i = 0; i < n; i++)
        same += a[i] == b[i];
    return 100.0 * (double)same / (double)n;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* Digest of a trained QAT model: its parameters and the frozen qparams (data-parallel ranks
 * compare it). */
static qcal_status qat_digest(const cnn_model *m, const cnn_fq_set *set, uint64_t *out)
{
    cnn_fq_qparams q;
    qcal_status st = cnn_fq_export(set, &q);
    if (st != QCAL_OK)
        return st;
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < CNN_NPARAMS; i++)
        h = fnv(h, m->param[i], (size_t)cnn_param_numel(i) * sizeof(float));
    h = fnv(h, q.act_scale, sizeof q.act_scale);
    h = fnv(h, q.act_zero_point, sizeof q.act_zero_point);
    for (int l = 0; l < CNN_NLAYERS; l++) {
        h = fnv(h, q.weight_scale[l], (size_t)q.weight_channels[l] * sizeof(float));
        h = fnv(h, q.weight_zero_point[l], (size_t)q.weight_channels[l] * sizeof(int32_t));
    }
    cnn_fq_qparams_free(&q);
    *out = h;
    return QCAL_OK;
}

qcal_status cnn_qat_run(cnn_ctx *ctx, const cnn_data *train, const cnn_data *test, const cnn_qat_opts *o,
                        cnn_progress_fn progress, void *pu, cnn_qat_result *out)
{
    if (!ctx || !train || !test || !o || !out)
        return qcal_set_error(QCAL_ERR_INVALID_ARG, "cnn_qat_run: NULL argument");
    if (o->calib_batches < 1 || test->n < 1)
        return qcal_set_error(QCAL_ERR_INVALID_ARG, "cnn_qat_run: calib_batches %d, %lld test images",
                              o->calib_batches, (long long)test->n);
    qcal_status st = schedule_check("cnn_qat_run", &o->qat, train);
    if (st != QCAL_OK)
        return st;
    cnn_qat_result r = {.test_images = test->n};
    cnn_model *fm = NULL, *qm = NULL;
    cnn_fq_set *ptq = NULL, *qat = NULL;
    uint8_t *pf = ex_malloc((size_t)test->n), *pq = ex_malloc((size_t)test->n);
    st = pf && pq ? QCAL_OK : QCAL_ERR_NO_MEMORY;
    int64_t right = 0;
    double t0 = cnn_now();

    /* 1. Float model and its accuracy. */
    if (st == QCAL_OK) {
        if (o->weights)
            st = cnn_model_load(o->weights, &fm);
        else
            st = cnn_load_or_train(ctx, train, &o->float_opts, progress, pu, &fm, &r.float_trained);
    }
    r.float_train_s = r.float_trained ? cnn_now() - t0 : 0.0;
    t0 = cnn_now();
    if (st == QCAL_OK && (st = cnn_evaluate(ctx, fm, test, NULL, &right, pf, progress, pu)) == QCAL_OK)
        r.float_acc = 100.0 * (double)right / (double)test->n;
    r.eval_float_s = cnn_now() - t0;

    /* 2. Post-training fake-quant: observers on, fake-quant off over calibration batches
     * (the first calib_batches * batch training images), then frozen with fake-quant on. */
    t0 = cnn_now();
    if (st == QCAL_OK && (st = cnn_fq_create(&o->fq, &ptq)) == QCAL_OK)
        st = cnn_fq_enable(ptq, true, false);
    for (int b = 0; st == QCAL_OK && b < o->calib_batches; b++) {
        int64_t i0 = ((int64_t)b * o->float_opts.batch) % train->n;
        int bn = (int)(train->n - i0 < o->float_opts.batch ? train->n - i0 : o->float_opts.batch);
        const float *z;
        st = cnn_forward(ctx, fm, train->images + i0 * CNN_IMAGE_PIXELS, bn, &ptq->hooks, &z);
    }
    if (st == QCAL_OK && (st = cnn_fq_enable(ptq, false, true)) == QCAL_OK)
        st = cnn_fq_freeze(ptq);
    r.calib_s = cnn_now() - t0;
    if (st == QCAL_OK && (st = cnn_evaluate(ctx, fm, test, &ptq->hooks, &right, pq, progress, pu)) == QCAL_OK) {
        r.ptq_acc = 100.0 * (double)right / (double)test->n;
        r.ptq_agree = agree(pf, pq, test->n);
    }

    /* 3. QAT from the float weights, frozen evaluation. */
    t0 = cnn_now();
    if (st == QCAL_OK)
        st = cnn_qat_finetune(ctx, fm, train, &o->fq, &o->qat, progress, pu, &qm, &qat);
    r.qat_train_s = cnn_now() - t0;
    if (st == QCAL_OK)
        st = qat_digest(qm, qat, &r.qat_digest);
    if (st == QCAL_OK && (st = cnn_evaluate(ctx, qm, test, &qat->hooks, &right, pq, progress, pu)) == QCAL_OK) {
        r.qat_acc = 100.0 * (double)right / (double)test->n;
        r.qat_agree = agree(pf, pq, test->n);
    }
    r.qat_int8_acc = -1.0;
#if CNN_HAVE_DNNL
    /* The int8 net needs every tap but the logits fake-quantized on the full quint8 range. */
    if (st == QCAL_OK && o->fq.act_preset == QCAL_FAKEQUANT_PRESET_ACTIVATION_FULL_RANGE)
        st = cnn_qat_int8_accuracy(qm, qat, test, &r.qat_int8_acc);
#endif

    cnn_fq_destroy(&ptq);
    cnn_fq_destroy(&qat);
    cnn_model_destroy(&fm);
    cnn_model_destroy(&qm);
    free(pf);
    free(pq);
    if (st == QCAL_OK)
        *out = r;
    return st;
}
