/* Observer evaluation on the demo CNN and the low-bit setting (demo_eval.h). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <qcal/calib.h>
#include <qcal/fakequant.h>
#include <qcal/model_calib.h>

#include "demo_eval.h"
#include "ex_util.h"

#define EVAL_BATCH 250
#define AUTO_SAMPLES 64   /* qcal_model_calib_options.auto_samples' default */

void lowbit_act_qconfig(qcal_qconfig *q, int bits)
{
    qcal_qconfig_default(q);
    q->dtype = QCAL_QUINT8;
    q->qscheme = QCAL_PER_TENSOR_AFFINE;
    q->custom_range = true;
    q->quant_min = 0;
    q->quant_max = ((int64_t)1 << bits) - 1;
}

void lowbit_weight_qconfig(qcal_qconfig *q, int bits)
{
    qcal_qconfig_default(q);
    q->dtype = QCAL_QINT8;
    q->qscheme = QCAL_PER_TENSOR_SYMMETRIC;
    q->custom_range = true;
    q->quant_max = ((int64_t)1 << (bits - 1)) - 1;
    q->quant_min = -q->quant_max;
}

/* ---- feeding an evaluation ------------------------------------------------------------- */

typedef struct feed_ctx {
    qcal_numeric_eval *ev;
    int pass;
} feed_ctx;

static qcal_status feed_one(feed_ctx *c, const char *name, qcal_calib_role role, const qcal_tensor *t)
{
    return c->pass ? qcal_numeric_eval_score(c->ev, name, role, t)
                   : qcal_numeric_eval_observe(c->ev, name, role, t);
}

static qcal_status feed_hook(void *user, cnn_act *a)
{
    if (a->tap == CNN_TAP_LOGITS)
        return QCAL_OK;
    qcal_tensor t;
    qcal_status st = qcal_tensor_init(&t, a->data, a->ndim, a->shape);
    return st < 0 ? st : feed_one(user, cnn_tap_name(a->tap), QCAL_CALIB_ROLE_ACTIVATION, &t);
}

qcal_status demo_eval_feed(cnn_ctx *ctx, const cnn_model *fm, const cnn_data *train, int64_t n, int batch,
                           qcal_numeric_eval *ev, int pass)
{
    feed_ctx fc = {.ev = ev, .pass = pass};
    qcal_status st = QCAL_OK;
    for (int l = 0; l < CNN_NLAYERS && st >= 0; l++) {
        qcal_tensor w;
        int64_t shape[4];
        int nd = cnn_param_shape(2 * l, shape);
        char name[64];
        snprintf(name, sizeof name, "%s.weight", cnn_layer_name(l));
        if ((st = qcal_tensor_init(&w, fm->param[2 * l], nd, shape)) >= 0)
            st = feed_one(&fc, name, QCAL_CALIB_ROLE_WEIGHT, &w);
    }
    cnn_hooks hooks = {.act = feed_hook, .user = &fc};
    for (int64_t i0 = 0; i0 < n && st >= 0; i0 += batch) {
        int bn = (int)(n - i0 < batch ? n - i0 : batch);
        const float *z;
        st = cnn_forward(ctx, fm, train->images + i0 * CNN_IMAGE_PIXELS, bn, &hooks, &z);
    }
    return st;
}

/* ---- fake-quant evaluation ------------------------------------------------------------- */

/* qparams of the four layer inputs (taps 0..3) and the four weights. */
typedef struct fq_model {
    qcal_qparams act[CNN_NLAYERS];
    qcal_qparams weight[CNN_NLAYERS];
} fq_model;

static qcal_status fq_act_hook(void *user, cnn_act *a)
{
    const fq_model *q = user;
    if (a->tap == CNN_TAP_LOGITS)   /* float logits, as the int8 net's fc2 */
        return QCAL_OK;
    qcal_tensor t;      /* in place: the same buffer as the source and the destination */
    qcal_tensor_mut d;
    qcal_status st = qcal_tensor_init(&t, a->data, a->ndim, a->shape);
    if (st >= 0)
        st = qcal_tensor_mut_init(&d, a->data, a->ndim, a->shape);
    return st < 0 ? st : qcal_fakequant_forward(&t, &q->act[a->tap], &d, NULL);
}

static qcal_status fq_weight_hook(void *user, cnn_weight *w)
{
    const fq_model *q = user;
    qcal_tensor src;
    qcal_tensor_mut dst;
    qcal_status st = qcal_tensor_init(&src, w->src, w->ndim, w->shape);
    if (st >= 0)
        st = qcal_tensor_mut_init(&dst, w->dst, w->ndim, w->shape);
    if (st >= 0)
        st = qcal_fakequant_forward(&src, &q->weight[w->layer], &dst, NULL);
    w->used = st >= 0;
    return st;
}

/* Top-1 and agreement of the float model with fake-quant at the layer inputs and weights. */
static qcal_status eval_fq(cnn_ctx *ctx, const cnn_model *fm, const cnn_data *test, const uint8_t *fpred,
                           const fq_model *q, const char *phase, lowbit_row *r)
{
    cnn_hooks hooks = {.act = fq_act_hook, .weight = fq_weight_hook, .user = (void *)q};
    int64_t right = 0, same = 0;
    for (int64_t i0 = 0; i0 < test->n; i0 += EVAL_BATCH) {
        int bn = (int)(test->n - i0 < EVAL_BATCH ? test->n - i0 : EVAL_BATCH);
        const float *z;
        qcal_status st = cnn_forward(ctx, fm, test->images + i0 * CNN_IMAGE_PIXELS, bn, &hooks, &z);
        if (st < 0)
            return st;
        for (int i = 0; i < bn; i++) {
            int p = 0;
            for (int k = 1; k < CNN_CLASSES; k++)
                if (z[i * CNN_CLASSES + k] > z[i * CNN_CLASSES + p])
                    p = k;
            right += p == test->labels[i0 + i];
            same += p == fpred[i0 + i];
        }
        cnn_progress_stderr(NULL, phase, i0 + bn, test->n, 100.0 * (double)right / (double)(i0 + bn));
    }
    r->top1 = 100.0 * (double)right / (double)test->n;
    r->agree = 100.0 * (double)same / (double)test->n;
    return QCAL_OK;
}

/* The fake-quant model against float on the first n images of data, as observer auto judges
 * its whole-model candidates at the outputs (qcal/model_calib.h): the images whose top-1 is
 * float's, and the logits' SQNR. */
static qcal_status out_score(cnn_ctx *ctx, const cnn_model *fm, const cnn_data *data, int64_t n,
                             const fq_model *q, int64_t *agree, double *db)
{
    cnn_hooks hooks = {.act = fq_act_hook, .weight = fq_weight_hook, .user = (void *)q};
    float ref[EVAL_BATCH * CNN_CLASSES];
    double ss_f = 0.0, ss_e = 0.0;
    *agree = 0;
    if (n > data->n)
        n = data->n;
    for (int64_t i0 = 0; i0 < n; i0 += EVAL_BATCH) {
        int bn = (int)(n - i0 < EVAL_BATCH ? n - i0 : EVAL_BATCH);
        const float *z;
        qcal_status st = cnn_forward(ctx, fm, data->images + i0 * CNN_IMAGE_PIXELS, bn, NULL, &z);
        if (st < 0)
            return st;
        memcpy(ref, z, (size_t)bn * CNN_CLASSES * sizeof *ref);
        if ((st = cnn_forward(ctx, fm, data->images + i0 * CNN_IMAGE_PIXELS, bn, &hooks, &z)) < 0)
            return st;
        for (int i = 0; i < bn * CNN_CLASSES; i++) {
            ss_f += (double)ref[i] * ref[i];
            ss_e += ((double)ref[i] - z[i]) * ((double)ref[i] - z[i]);
        }
        for (int i = 0; i < bn; i++) {
            int pf = 0, pq = 0;
            for (int k = 1; k < CNN_CLASSES; k++) {
                pf = ref[i * CNN_CLASSES + k] > ref[i * CNN_CLASSES + pf] ? k : pf;
                pq = z[i * CNN_CLASSES + k] > z[i * CNN_CLASSES + pq] ? k : pq;
            }
            *agree += pf == pq;
        }
    }
    *db = ss_e > 0.0 ? 10.0 * log10(ss_f / ss_e) : INFINITY;
    return QCAL_OK;
}

/* A per-tensor candidate's qparams as a value (the setting has per-tensor kinds only). */
static qcal_status cand_qparams(const qcal_numeric_eval_candidate *c, qcal_qparams *qp)
{
    if (c->channels != 1)
        return qcal_set_error(QCAL_ERR_UNSUPPORTED, "the low-bit setting takes per-tensor observers only");
    *qp = (qcal_qparams){
        .dtype = c->dtype,
        .qscheme = c->qscheme,
        .quant_min = c->quant_min,
        .quant_max = c->quant_max,
        .channels = 1,
        .scale = c->scale[0],
        .zero_point = c->zero_point[0],
        .zero_point_float = (float)c->zero_point[0],
    };
    return qcal_qparams_validate(qp);
}

/* Slot of a tensor in fq_model / lowbit_result.tensor (0..3 inputs, 4..7 weights), or -1. */
static int tensor_slot(const char *name, qcal_calib_role role)
{
    for (int l = 0; l < CNN_NLAYERS; l++) {
        char w[64];
        snprintf(w, sizeof w, "%s.weight", cnn_layer_name(l));
        if (role == QCAL_CALIB_ROLE_ACTIVATION && !strcmp(name, cnn_layer_name(l)))
            return l;
        if (role == QCAL_CALIB_ROLE_WEIGHT && !strcmp(name, w))
            return CNN_NLAYERS + l;
    }
    return -1;
}

static qcal_qparams *model_slot(fq_model *q, int slot)
{
    return slot < CNN_NLAYERS ? &q->act[slot] : &q->weight[slot - CNN_NLAYERS];
}

typedef struct session_ctx {
    qcal_calib_session *s;
    int64_t step;
} session_ctx;

static qcal_status session_hook(void *user, cnn_act *a)
{
    session_ctx *c = user;
    if (a->tap == CNN_TAP_LOGITS)
        return QCAL_OK;
    qcal_tensor t;
    qcal_status st = qcal_tensor_init(&t, a->data, a->ndim, a->shape);
    return st < 0 ? st : qcal_calib_session_observe(c->s, cnn_tap_name(a->tap), QCAL_CALIB_ROLE_ACTIVATION,
                                                    c->step, &t);
}

/* Calibrates the per-layer choice the way a user does: a session with the rules file that
 * qcal_numeric_eval_write_rules wrote, fed the same data; its table must hold the
 * recommended candidates' qparams (checked). q's values point into *table. */
static qcal_status calibrate_rules(cnn_ctx *ctx, const cnn_model *fm, const cnn_data *train, int64_t n, int batch,
                                   const char *rules_path, const fq_model *want, qcal_calib_table **table,
                                   fq_model *q)
{
    qcal_calib_rules *rules = NULL;
    session_ctx sc = {0};
    qcal_status st = qcal_calib_rules_load_file(rules_path, &rules);
    qcal_calib_session_options so;
    qcal_calib_session_options_default(&so);
    so.rules = rules;
    if (st >= 0)
        st = qcal_calib_session_create(&so, &sc.s);
    for (int l = 0; l < CNN_NLAYERS && st >= 0; l++) {
        qcal_tensor w;
        int64_t shape[4];
        int nd = cnn_param_shape(2 * l, shape);
        char name[64];
        snprintf(name, sizeof name, "%s.weight", cnn_layer_name(l));
        if ((st = qcal_tensor_init(&w, fm->param[2 * l], nd, shape)) >= 0)
            st = qcal_calib_session_observe(sc.s, name, QCAL_CALIB_ROLE_WEIGHT, 0, &w);
    }
    cnn_hooks hooks = {.act = session_hook, .user = &sc};
    for (int64_t i0 = 0; i0 < n && st >= 0; i0 += batch, sc.step++) {
        int bn = (int)(n - i0 < batch ? n - i0 : batch);
        const float *z;
        st = cnn_forward(ctx, fm, train->images + i0 * CNN_IMAGE_PIXELS, bn, &hooks, &z);
    }
    if (st >= 0)
        st = qcal_calib_session_table(sc.s, table);
    int64_t ne = 0;
    if (st >= 0)
        st = qcal_calib_table_count(*table, &ne);
    for (int64_t i = 0; i < ne && st >= 0; i++) {
        const qcal_calib_entry *e;
        if ((st = qcal_calib_table_entry(*table, i, &e)) < 0)
            break;
        int slot = tensor_slot(e->fqn, e->role);
        if (slot < 0)
            continue;
        const qcal_qparams *w = slot < CNN_NLAYERS ? &want->act[slot] : &want->weight[slot - CNN_NLAYERS];
        *model_slot(q, slot) = e->qparams;
        if (e->qparams.scale != w->scale || e->qparams.zero_point != w->zero_point ||
            e->qparams.quant_min != w->quant_min || e->qparams.quant_max != w->quant_max)
            st = qcal_set_error(QCAL_ERR_STATE, "%s: the rules file gave scale %.9g zero-point %d, the evaluation "
                                "recommended scale %.9g zero-point %d", e->fqn, (double)e->qparams.scale,
                                (int)e->qparams.zero_point, (double)w->scale, (int)w->zero_point);
    }
    if (st >= 0 && ne != LOWBIT_NTENSORS)
        st = qcal_set_error(QCAL_ERR_STATE, "the rules session holds %lld tensors, expected %d", (long long)ne,
                            LOWBIT_NTENSORS);
    qcal_calib_session_destroy(&sc.s);
    qcal_calib_rules_destroy(&rules);
    return st;
}

qcal_status lowbit_run(cnn_ctx *ctx, const cnn_model *fm, const cnn_data *train, int64_t n_calib, int batch,
                       const cnn_data *test, const uint8_t *fpred, int n_kinds,
                       const qcal_observer_kind *kinds, int bits, const char *out_dir, lowbit_result *out)
{
    memset(out, 0, sizeof *out);
    if (bits < 2 || bits > 8)
        return qcal_set_error(QCAL_ERR_INVALID_ARG, "low-bit setting: %d bits is outside [2, 8]", bits);
    out->bits = bits;
    qcal_numeric_eval_options opt;
    qcal_numeric_eval_options_default(&opt);
    lowbit_act_qconfig(&opt.activation_q, bits);
    lowbit_weight_qconfig(&opt.weight_q, bits);
    out->n_kinds = n_kinds;
    for (int k = 0; k < n_kinds; k++) {
        opt.kinds |= 1u << kinds[k];
        out->kinds[k] = kinds[k];
    }
    qcal_numeric_eval *ev = NULL;
    qcal_calib_table *table = NULL;
    double t0 = cnn_now();
    qcal_status st = qcal_numeric_eval_create(&opt, &ev);
    if (st >= 0)
        st = demo_eval_feed(ctx, fm, train, n_calib, batch, ev, 0);
    if (st >= 0)
        st = qcal_numeric_eval_finish(ev);
    if (st >= 0)
        st = demo_eval_feed(ctx, fm, train, n_calib, batch, ev, 1);
    int64_t nt = 0;
    if (st >= 0)
        st = qcal_numeric_eval_count(ev, &nt);
    if (st >= 0 && nt != LOWBIT_NTENSORS)
        st = qcal_set_error(QCAL_ERR_STATE, "the evaluation holds %lld tensors, expected %d", (long long)nt,
                            LOWBIT_NTENSORS);
    /* Every kind's qparams per tensor, and the recommendation. */
    fq_model single[QCAL_OBSERVER_KIND_COUNT], rec, from_rules;
    memset(single, 0, sizeof single);
    memset(&rec, 0, sizeof rec);
    memset(&from_rules, 0, sizeof from_rules);
    for (int64_t i = 0; i < nt && st >= 0; i++) {
        qcal_numeric_eval_tensor t;
        if ((st = qcal_numeric_eval_result(ev, i, &t)) < 0)
            break;
        int slot = tensor_slot(t.name, t.role);
        if (slot < 0) {
            st = qcal_set_error(QCAL_ERR_STATE, "unexpected tensor '%s' in the evaluation", t.name);
            break;
        }
        out->tensor[slot] = slot < CNN_NLAYERS ? cnn_layer_name(slot) : cnn_param_name(2 * (slot - CNN_NLAYERS));
        out->choice[slot] = t.candidates[t.recommended].kind;
        out->choice_sqnr_db[slot] = t.candidates[t.recommended].sqnr_db;
        if ((st = cand_qparams(&t.candidates[t.recommended], model_slot(&rec, slot))) < 0)
            break;
        for (int k = 0; k < n_kinds && st >= 0; k++) {
            int j = 0;
            while (j < t.ncandidates && t.candidates[j].kind != kinds[k])
                j++;
            st = j < t.ncandidates ? cand_qparams(&t.candidates[j], model_slot(&single[k], slot))
                                   : qcal_set_error(QCAL_ERR_STATE, "'%s' has no %s candidate", t.name,
                                                    qcal_observer_kind_name(kinds[k]));
        }
    }
    /* What a user of qcal evaluate gets: the table, the rules file, the report. */
    char path[4400];
    snprintf(path, sizeof path, "%s/evaluate_%dbit.txt", out_dir, bits);
    if (st >= 0)
        st = qcal_numeric_eval_write_results(ev, QCAL_NUMERIC_EVAL_TABLE, path);
    snprintf(path, sizeof path, "%s/report_%dbit.html", out_dir, bits);
    qcal_numeric_eval_report_options ro;
    qcal_numeric_eval_report_options_default(&ro);
    char title[128];
    snprintf(title, sizeof title, "qcal-demo: %d-bit activations and per-tensor weights", bits);
    ro.title = title;
    if (st >= 0)
        st = qcal_numeric_eval_write_report(ev, &ro, path);
    char rules_path[4400];
    snprintf(rules_path, sizeof rules_path, "%s/rules_%dbit.txt", out_dir, bits);
    if (st >= 0)
        st = qcal_numeric_eval_write_rules(ev, rules_path);
    if (st >= 0)
        st = calibrate_rules(ctx, fm, train, n_calib, batch, rules_path, &rec, &table, &from_rules);
    out->calib_s = cnn_now() - t0;
    t0 = cnn_now();
    for (int k = 0; k < n_kinds && st >= 0; k++) {
        char phase[64];
        snprintf(phase, sizeof phase, "%d-bit %s", bits, qcal_observer_kind_name(kinds[k]));
        st = eval_fq(ctx, fm, test, fpred, &single[k], phase, &out->single[k]);
    }
    if (st >= 0)
        st = eval_fq(ctx, fm, test, fpred, &from_rules, "low-bit per-layer best", &out->per_layer);
    /* --observer auto: the same evaluation restricted to its candidates (they commute, so the
     * choice is a function of the data alone); measured as its own row. */
    uint32_t auto_kinds = QCAL_MODEL_CALIB_AUTO_KINDS & opt.kinds;
    out->autorow.top1 = -1;
    if (st >= 0 && auto_kinds) {
        fq_model aut;
        memset(&aut, 0, sizeof aut);
        st = qcal_numeric_eval_restrict(ev, auto_kinds);
        for (int64_t i = 0; i < nt && st >= 0; i++) {
            qcal_numeric_eval_tensor t;
            if ((st = qcal_numeric_eval_result(ev, i, &t)) < 0)
                break;
            int slot = tensor_slot(t.name, t.role);
            out->auto_choice[slot] = t.candidates[t.recommended].kind;
            out->auto_same += out->auto_choice[slot] == out->choice[slot];
            st = cand_qparams(&t.candidates[t.recommended], model_slot(&aut, slot));
        }
        /* Then at the outputs, as qcal_model_calib does: that choice and each of its kinds
         * on every tensor; on the first AUTO_SAMPLES calibration images the most top-1
         * agreements with float win, then the highest logits SQNR (ties to the earlier: the
         * per-tensor choice, then kinds[] order). */
        double best = -INFINITY;
        int64_t best_agree = 0, n_auto = n_calib < AUTO_SAMPLES ? n_calib : AUTO_SAMPLES;
        out->auto_at_outputs = -1;
        if (st >= 0)
            st = out_score(ctx, fm, train, n_auto, &aut, &best_agree, &best);
        out->auto_sqnr_db[0] = best;
        out->auto_agree[0] = best_agree;
        out->auto_n = n_auto;
        for (int k = 0; k < n_kinds && st >= 0; k++) {
            out->auto_sqnr_db[k + 1] = NAN;
            out->auto_agree[k + 1] = -1;
            if (!(auto_kinds >> kinds[k] & 1u))
                continue;
            double db;
            int64_t ag;
            st = out_score(ctx, fm, train, n_auto, &single[k], &ag, &db);
            out->auto_sqnr_db[k + 1] = db;
            out->auto_agree[k + 1] = ag;
            if (st >= 0 && (ag > best_agree || (ag == best_agree && db > best))) {
                best = db;
                best_agree = ag;
                out->auto_at_outputs = k;
            }
        }
        if (st >= 0 && out->auto_at_outputs >= 0) {
            out->autorow = out->single[out->auto_at_outputs];
            out->auto_same = 0;
            for (int slot = 0; slot < LOWBIT_NTENSORS; slot++) {
                out->auto_choice[slot] = kinds[out->auto_at_outputs];
                out->auto_same += out->auto_choice[slot] == out->choice[slot];
            }
        } else if (st >= 0) {
            st = eval_fq(ctx, fm, test, fpred, &aut, "low-bit auto", &out->autorow);
        }
    }
    out->eval_s = cnn_now() - t0;
    for (int k = 1; k < n_kinds; k++) {
        if (out->single[k].top1 > out->single[out->best].top1)
            out->best = k;
        if (out->single[k].top1 < out->single[out->worst].top1)
            out->worst = k;
    }
    qcal_calib_table_destroy(&table);
    qcal_numeric_eval_destroy(&ev);
    return st;
}
