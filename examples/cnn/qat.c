/* QAT for the demo CNN with qcal_fake_quantize objects; see qat.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "qat.h"

/* ---- Hooks --------------------------------------------------------------------------- */

static qcal_status fq_act(void *user, cnn_act *a)
{
    cnn_fq_set *s = user;
    qcal_tensor t;
    qcal_status st = qcal_tensor_init(&t, a->data, a->ndim, a->shape);
    if (st != QCAL_OK)
        return st;
    return qcal_fake_quantize_forward(s->act[a->tap], &t, a->data);
}

static qcal_status fq_act_backward(void *user, cnn_tap tap, float *grad, int64_t numel)
{
    cnn_fq_set *s = user;
    return qcal_fake_quantize_backward(s->act[tap], grad, numel, grad);
}

static qcal_status fq_weight(void *user, cnn_weight *w)
{
    cnn_fq_set *s = user;
    qcal_tensor t;
    /* The view is read only here: the FakeQuantize writes dst, never src. */
    qcal_status st = qcal_tensor_init(&t, (float *)(uintptr_t)w->src, w->ndim, w->shape);
    if (st != QCAL_OK)
        return st;
    if ((st = qcal_fake_quantize_forward(s->weight[w->layer], &t, w->dst)) != QCAL_OK)
        return st;
    w->used = true;
    return QCAL_OK;
}

static qcal_status fq_weight_backward(void *user, cnn_layer layer, float *grad, int64_t numel)
{
    cnn_fq_set *s = user;
    return qcal_fake_quantize_backward(s->weight[layer], grad, numel, grad);
}

qcal_status cnn_fq_create(cnn_fq_set **out)
{
    if (!out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "cnn_fq_create: NULL out");
    cnn_fq_set *s = qcal_calloc(1, sizeof *s);
    if (!s)
        return QCAL_ERR_NO_MEMORY;
    qcal_status st = QCAL_OK;
    qcal_fake_quantize_config acfg, wcfg;
    qcal_fake_quantize_config_default(&acfg, QCAL_FQ_ACTIVATION);
    qcal_fake_quantize_config_default(&wcfg, QCAL_FQ_WEIGHT_PER_CHANNEL);
    for (int t = 0; t < CNN_NTAPS && st == QCAL_OK; t++)
        st = qcal_fake_quantize_create(&acfg, &s->act[t]);
    for (int l = 0; l < CNN_NLAYERS && st == QCAL_OK; l++)
        st = qcal_fake_quantize_create(&wcfg, &s->weight[l]);
    if (st != QCAL_OK) {
        cnn_fq_destroy(&s);
        return st;
    }
    s->hooks.act = fq_act;
    s->hooks.act_backward = fq_act_backward;
    s->hooks.weight = fq_weight;
    s->hooks.weight_backward = fq_weight_backward;
    s->hooks.user = s;
    *out = s;
    return QCAL_OK;
}

void cnn_fq_destroy(cnn_fq_set **set)
{
    if (!set || !*set)
        return;
    for (int t = 0; t < CNN_NTAPS; t++)
        qcal_fake_quantize_destroy(&(*set)->act[t]);
    for (int l = 0; l < CNN_NLAYERS; l++)
        qcal_fake_quantize_destroy(&(*set)->weight[l]);
    free(*set);
    *set = NULL;
}

static qcal_status each(cnn_fq_set *s, qcal_status (*fn)(qcal_fake_quantize *, bool), bool on)
{
    for (int t = 0; t < CNN_NTAPS; t++) {
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
        return qcal_error(QCAL_ERR_INVALID_ARG, "cnn_fq_enable: NULL set");
    qcal_status st = each(s, qcal_fake_quantize_enable_observer, observer);
    return st != QCAL_OK ? st : each(s, qcal_fake_quantize_enable_fake_quant, fake_quant);
}

static qcal_status freeze_one(qcal_fake_quantize *fq, bool unused)
{
    (void)unused;
    return qcal_fake_quantize_freeze(fq);
}

qcal_status cnn_fq_freeze(cnn_fq_set *s)
{
    if (!s)
        return qcal_error(QCAL_ERR_INVALID_ARG, "cnn_fq_freeze: NULL set");
    return each(s, freeze_one, true);
}

/* ---- The comparison ---------------------------------------------------------------- */

cnn_qat_opts cnn_qat_opts_default(void)
{
    cnn_qat_opts o = {
        .float_opts = cnn_train_opts_default(),
        .weights = NULL,
        .calib_batches = 32,
        .qat_steps = 469,
        .qat_batch = 128,
        .qat_lr = 2e-4f,
        .qat_freeze_step = 350,
        .qat_seed = 7,
    };
    return o;
}

static uint64_t mix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double agree(const uint8_t *a, const uint8_t *b, int64_t n)
{
    int64_t same = 0;
    for (int64_t i = 0; i < n; i++)
        same += a[i] == b[i];
    return 100.0 * (double)same / (double)n;
}

qcal_status cnn_qat_run(cnn_ctx *ctx, const cnn_data *train, const cnn_data *test, const cnn_qat_opts *o,
                        cnn_progress_fn progress, void *pu, cnn_qat_result *out)
{
    if (!ctx || !train || !test || !o || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "cnn_qat_run: NULL argument");
    if (o->calib_batches < 1 || o->qat_steps < 0 || o->qat_batch < 1 || !(o->qat_lr >= 0.0f) ||
        o->qat_freeze_step < 0 || train->n < 1 || test->n < 1)
        return qcal_error(QCAL_ERR_INVALID_ARG,
                          "cnn_qat_run: calib_batches %d, qat_steps %d, qat_batch %d, qat_lr %g, freeze step %d, "
                          "%lld training and %lld test images", o->calib_batches, o->qat_steps, o->qat_batch,
                          (double)o->qat_lr, o->qat_freeze_step, (long long)train->n, (long long)test->n);
    cnn_qat_result r = {.test_images = test->n};
    cnn_model *fm = NULL, *qm = NULL;
    cnn_fq_set *ptq = NULL, *qat = NULL;
    uint8_t *pf = qcal_malloc((size_t)test->n), *pq = qcal_malloc((size_t)test->n);
    int batch = o->qat_batch > o->float_opts.batch ? o->qat_batch : o->float_opts.batch;
    uint8_t *bx = qcal_malloc((size_t)batch * CNN_IMAGE_PIXELS), *by = qcal_malloc((size_t)batch);
    qcal_status st = pf && pq && bx && by ? QCAL_OK : QCAL_ERR_NO_MEMORY;
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
    if (st == QCAL_OK && (st = cnn_fq_create(&ptq)) == QCAL_OK)
        st = cnn_fq_enable(ptq, true, false);
    for (int b = 0; st == QCAL_OK && b < o->calib_batches; b++) {
        int64_t i0 = ((int64_t)b * o->float_opts.batch) % train->n;
        int bn = (int)(train->n - i0 < o->float_opts.batch ? train->n - i0 : o->float_opts.batch);
        if (bn > batch)
            bn = batch;
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

    /* 3. QAT: a copy of the float weights, fresh FakeQuantize objects (observer and
     * fake-quant on, as prepare_qat), Adam from zero state, learning rate qat_lr decayed
     * to 0 on a cosine; observers frozen after qat_freeze_step steps. Batches are drawn
     * with replacement from the training set by a generator seeded with qat_seed. */
    t0 = cnn_now();
    if (st == QCAL_OK && (st = cnn_model_create(0, &qm)) == QCAL_OK) {
        cnn_model_copy(qm, fm);
        st = cnn_fq_create(&qat);
    }
    if (st == QCAL_OK)
        cnn_ctx_reset_optimizer(ctx);
    uint64_t seed = o->qat_seed;
    double run_loss = 0.0;
    for (int step = 0; st == QCAL_OK && step < o->qat_steps; step++) {
        if (step == o->qat_freeze_step)
            st = cnn_fq_freeze(qat);
        for (int i = 0; st == QCAL_OK && i < o->qat_batch; i++) {
            int64_t k = (int64_t)(mix64(&seed) % (uint64_t)train->n);
            memcpy(bx + (size_t)i * CNN_IMAGE_PIXELS, train->images + k * CNN_IMAGE_PIXELS, CNN_IMAGE_PIXELS);
            by[i] = train->labels[k];
        }
        /* Cosine decay from qat_lr to 0 over the QAT steps. */
        float lr = (float)(0.5 * (double)o->qat_lr * (1.0 + cos(3.14159265358979323846 * step / o->qat_steps)));
        float loss = 0.0f;
        if (st == QCAL_OK)
            st = cnn_train_step(ctx, qm, bx, by, o->qat_batch, &qat->hooks, lr, &loss);
        run_loss = step == 0 ? loss : 0.98 * run_loss + 0.02 * loss;
        if (progress && st == QCAL_OK)
            progress(pu, "qat", step + 1, o->qat_steps, run_loss);
    }
    if (st == QCAL_OK)
        st = cnn_fq_freeze(qat);
    r.qat_train_s = cnn_now() - t0;
    if (st == QCAL_OK && (st = cnn_evaluate(ctx, qm, test, &qat->hooks, &right, pq, progress, pu)) == QCAL_OK) {
        r.qat_acc = 100.0 * (double)right / (double)test->n;
        r.qat_agree = agree(pf, pq, test->n);
    }

    cnn_fq_destroy(&ptq);
    cnn_fq_destroy(&qat);
    cnn_model_destroy(&fm);
    cnn_model_destroy(&qm);
    free(pf);
    free(pq);
    free(bx);
    free(by);
    if (st == QCAL_OK)
        *out = r;
    return st;
}
