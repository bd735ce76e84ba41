/* The Q/DQ pass's entry points (qcal/onnx.h): plan, report, rewrite (qcal_onnx_qdq), and
 * qcal_onnx_qdq_save_file, whose lazy weights are computed by a pass on a thread of its own beside
 * the save (onnx/save.h). The plan and the rewrite: onnx/qdq_shared.h. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "onnx/qdq_shared.h"
#include "onnx/save.h"

/* Hands r to *rep on success (rep not NULL), else frees it; returns st. */
static qcal_status report_out(qcal_status st, qcal_onnx_qdq_report *r, qcal_onnx_qdq_report *rep)
{
    if (st != QCAL_OK || !rep)
        qcal_onnx_qdq_report_free(r);
    else
        *rep = *r;
    return st;
}

/* qcal_onnx_qdq; with keep (qcal_onnx_qdq_save_file), the main graph's plan is given to *keep on
 * success (its lazy weights still to compute: qdq_lazy_job) instead of freed. */
static qcal_status qdq_run(qcal_onnx_model *m, const qcal_calib_table *table, const qcal_onnx_qdq_options *opt,
                           qcal_onnx_qdq_report *rep, plan **keep)
{
    qcal_onnx_qdq_options def;
    qcal_onnx_qdq_options_default(&def);
    if (!opt)
        opt = &def;
    if (!table)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_onnx_qdq: NULL table");
    qcal_status st = qdq_check_opts(m, opt);
    if (st != QCAL_OK)
        return st;
    int64_t opset = onnx_model_opset(m->proto);
    if (opset < 13)
        return qcal_error(QCAL_ERR_UNSUPPORTED,
                          "the model's default-domain opset is %lld; Q/DQ insertion needs opset >= 13 (per-channel QuantizeLinear/DequantizeLinear; qcal_onnx_upgrade raises opsets 9-12)",
                          (long long)opset);
    plan *pm = malloc(sizeof *pm);
    if (!pm)
        return OOM();
    plan *const p = pm;
    subplans sub = { 0 };
    st = qdq_plan_build(p, m, table, opt, keep && !opt->float_weights);
    if (st == QCAL_OK)
        st = qdq_collect_subplans(p, p, p->g, NULL, 0, &sub);
    qcal_onnx_qdq_report r;
    memset(&r, 0, sizeof r);
    onnx_map seen = { 0 };
    for (size_t k = 0; st == QCAL_OK && k <= sub.n; k++) {
        plan *q = k ? sub.p[k - 1] : p;
        p->fp8 |= q->fp8;
        for (int64_t i = 0; i < q->nlist; i++) {
            int64_t t = qdq_tensor_index(q, q->list[i]);
            if (!q->t[t].missing || onnx_map_get(&seen, q->t[t].name))
                continue;
            char *s = qcal_strdup(q->t[t].name);
            if (!s || !onnx_push((void ***)&r.missing, (size_t *)&r.n_missing, s) ||
                !onnx_map_put(&seen, s, 0)) {
                if (s && (r.n_missing == 0 || r.missing[r.n_missing - 1] != s))
                    free(s);
                st = OOM();
                break;
            }
        }
    }
    onnx_map_free(&seen);
    if (st == QCAL_OK && p->fp8) {
        /* FP8 QuantizeLinear / DequantizeLinear: opset 19, float8 types: IR version 9. */
        if (opset < 19)
            st = qcal_error(QCAL_ERR_UNSUPPORTED,
                            "the table has FP8 entries: FP8 QuantizeLinear/DequantizeLinear need "
                            "opset >= 19, the model's default-domain opset is %lld (raise it first: "
                            "qcal_onnx_upgrade(m, 19, ...); 'qcal qdq' does it itself)",
                            (long long)opset);
    }
    if (st == QCAL_OK && opt->strict && r.n_missing) {
        size_t len = 64;
        for (int64_t i = 0; i < r.n_missing; i++)
            len += strlen(r.missing[i]) + 4;
        char *msg = malloc(len);
        if (msg) {
            msg[0] = '\0';
            for (int64_t i = 0; i < r.n_missing; i++) {
                strcat(msg, i ? ", '" : "'");
                strcat(msg, r.missing[i]);
                strcat(msg, "'");
            }
        }
        st = qcal_error(QCAL_ERR_NOT_FOUND, "%lld tensor%s the profile quantizes %s not in the table (--strict): %s",
                        (long long)r.n_missing, r.n_missing == 1 ? "" : "s",
                        r.n_missing == 1 ? "is" : "are", msg ? msg : "(out of memory)");
        free(msg);
    }
    /* the names of the main graph's ops about to be quantized (before the rewrite moves
     * nodes); nameless ops are not listed */
    for (size_t i = 0; st == QCAL_OK && i < p->g->n_node; i++) {
        const char *nm = p->g->node[i]->name;
        if (!p->np[i].quant || !nm || !nm[0])
            continue;
        char *d = qcal_strdup(nm);
        if (!d || !onnx_push((void ***)&r.quantized, (size_t *)&r.n_quantized, d)) {
            free(d);
            st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
        }
    }
    if (st == QCAL_OK)
        st = qdq_apply(p, &r);
    for (size_t k = 0; st == QCAL_OK && k < sub.n; k++) {
        qcal_onnx_qdq_report rs;
        memset(&rs, 0, sizeof rs);
        st = qdq_apply(sub.p[k], &rs);
        r.ops += rs.ops;
        r.tensors += rs.tensors;
        r.weights += rs.weights;
        r.biases += rs.biases;
    }
    if (st == QCAL_OK)
        st = qdq_drop_outer_weights(&sub);
    if (st == QCAL_OK && p->fp8 && (!m->proto->has_ir_version || m->proto->ir_version < 9)) {
        m->proto->has_ir_version = 1;
        m->proto->ir_version = 9;
    }
    for (size_t k = 0; st == QCAL_OK && k <= sub.n; k++) {
        plan *q = k ? sub.p[k - 1] : p;
        for (int64_t i = 0; st == QCAL_OK && i < q->nskipped; i++) {
            if (!onnx_push((void ***)&r.skipped, (size_t *)&r.n_skipped, q->skipped[i]))
                st = OOM();
            else
                q->skipped[i] = NULL;
        }
    }
    qdq_subplans_free(&sub);
    if (st == QCAL_OK && keep) {
        *keep = p;
    } else {
        qdq_plan_free(p);
        free(p);
    }
    return report_out(st, &r, rep);
}

qcal_status qcal_onnx_qdq(qcal_onnx_model *m, const qcal_calib_table *table, const qcal_onnx_qdq_options *opt,
                          qcal_onnx_qdq_report *rep)
{
    return qdq_run(m, table, opt, rep, NULL);
}

/* The pass of qcal_onnx_qdq_save_file: the lazy weights computed in plan order (the order of
 * their first readers, which is the order the rewrite appends their initializers), each
 * with its lazy biases, on a thread beside the save; the writer's fill of a lazy
 * initializer waits for its weight. */
typedef struct lazy_pass {
    plan *p;
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool started;
    int64_t done;         /* lazy weights finished, in order (under mu) */
    bool ended;           /* no more will finish (under mu) */
    qcal_status st;       /* the pass's status, final once ended */
    char msg[1024];       /* its message */
} lazy_pass;

/* Runs lazy weights (and their biases) k = 0, 1, ... until one fails. */
static void lazy_pass_run(lazy_pass *d, bool locked)
{
    plan *p = d->p;
    for (int64_t k = 0; k < p->nlw; k++) {
        qcal_status st = p->lw[k].w >= 0 ? qdq_lazy_job(p, k) : QCAL_OK;
        if (st != QCAL_OK)
            snprintf(d->msg, sizeof d->msg, "%s", qcal_last_error());
        if (locked)
            pthread_mutex_lock(&d->mu);
        d->st = st;
        if (st == QCAL_OK)
            d->done = k + 1;
        if (locked) {
            pthread_cond_broadcast(&d->cv);
            pthread_mutex_unlock(&d->mu);
        }
        if (st != QCAL_OK)
            break;
    }
    if (locked)
        pthread_mutex_lock(&d->mu);
    d->ended = true;
    if (locked) {
        pthread_cond_broadcast(&d->cv);
        pthread_mutex_unlock(&d->mu);
    }
}

static void *lazy_main(void *arg)
{
    lazy_pass_run(arg, true);
    return NULL;
}

/* onnx_lazy's fill for every initializer of lazy weight ctx (its scales, codes and biases):
 * waits until the pass has computed it. */
static qcal_status lazy_fill(void *ctx, const Onnx__TensorProto *t)
{
    (void)t;
    const lazy_w *l = ctx;
    lazy_pass *d = l->pass;
    const int64_t k = l - d->p->lw;
    bool ok;
    if (d->started) {
        pthread_mutex_lock(&d->mu);
        while (d->done <= k && !d->ended)
            pthread_cond_wait(&d->cv, &d->mu);
        ok = d->done > k;
        pthread_mutex_unlock(&d->mu);
    } else {
        ok = d->done > k;   /* the pass ran on this thread before the save */
    }
    return ok ? QCAL_OK : qcal_error(d->st, "%s", d->msg);
}

/* The lazy initializers of plan p for the writer (*out, *n), each filled by lazy_fill. */
static qcal_status lazy_list(plan *p, lazy_pass *d, onnx_lazy **out, size_t *n)
{
    onnx_lazy *z = malloc((size_t)(2 * p->nlw + 2 * p->nlb + 1) * sizeof *z);
    if (!z)
        return OOM();
    size_t k = 0;
    for (int64_t i = 0; i < p->nlw; i++) {
        lazy_w *l = &p->lw[i];
        l->pass = d;
        if (l->w < 0)
            continue;
        if (!l->scale_t || (p->opt->profile == QCAL_ONNX_PROFILE_ORT && !l->codes_t)) {
            free(z);
            return qcal_error(QCAL_ERR_STATE, "lazy weight '%s' has no initializer", p->t[p->w[l->w].t].name);
        }
        z[k++] = (onnx_lazy){ l->scale_t, lazy_fill, l };
        if (l->codes_t)
            z[k++] = (onnx_lazy){ l->codes_t, lazy_fill, l };
    }
    for (int64_t i = 0; i < p->nlb; i++) {
        lazy_b *l = &p->lb[i];
        if (l->b < 0)
            continue;
        if (!l->codes_t || !l->scales_t) {
            free(z);
            return qcal_error(QCAL_ERR_STATE, "lazy bias '%s' has no initializer", p->t[p->b[l->b].t].name);
        }
        z[k++] = (onnx_lazy){ l->codes_t, lazy_fill, &p->lw[l->lw] };
        z[k++] = (onnx_lazy){ l->scales_t, lazy_fill, &p->lw[l->lw] };
    }
    *out = z;
    *n = k;
    return QCAL_OK;
}

qcal_status qcal_onnx_qdq_save_file(qcal_onnx_model *m, const qcal_calib_table *table, const qcal_onnx_qdq_options *opt,
                                    const qcal_onnx_save_options *save, const char *path, qcal_onnx_qdq_report *rep)
{
    if (!m || !path)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_onnx_qdq_save_file: NULL argument");
    qcal_onnx_qdq_options def;   /* here: the kept plan points at the options until the end */
    qcal_onnx_qdq_options_default(&def);
    if (!opt)
        opt = &def;
    qcal_onnx_qdq_report r;
    plan *p = NULL;
    qcal_status st = qdq_run(m, table, opt, &r, &p);
    if (st != QCAL_OK)
        return st;
    lazy_pass d;
    memset(&d, 0, sizeof d);
    d.p = p;
    onnx_lazy *lazy = NULL;
    size_t n_lazy = 0;
    st = lazy_list(p, &d, &lazy, &n_lazy);
    if (st == QCAL_OK && n_lazy) {
        /* The pass runs beside the save with every signal blocked (they stay the caller's
         * threads' business); where no thread can be made it runs here first. */
        p->serial = true;   /* one thread: the save runs beside it */
        if (pthread_mutex_init(&d.mu, NULL) == 0) {
            if (pthread_cond_init(&d.cv, NULL) == 0) {
                sigset_t all, old;
                sigfillset(&all);
                pthread_sigmask(SIG_SETMASK, &all, &old);
                d.started = pthread_create(&d.th, NULL, lazy_main, &d) == 0;
                pthread_sigmask(SIG_SETMASK, &old, NULL);
                if (!d.started)
                    pthread_cond_destroy(&d.cv);
            }
            if (!d.started)
                pthread_mutex_destroy(&d.mu);
        }
        if (!d.started) {
            p->serial = false;
            lazy_pass_run(&d, false);
            if (d.st != QCAL_OK)
                st = qcal_error(d.st, "%s", d.msg);
        }
    }
    if (st == QCAL_OK)
        st = onnx_model_save_lazy(m, save, path, lazy, n_lazy);
    if (d.started) {
        pthread_join(d.th, NULL);   /* on every path: the pass ends whatever the save did */
        pthread_cond_destroy(&d.cv);
        pthread_mutex_destroy(&d.mu);
    }
    /* A weight that failed is the failure, whatever the save said (an output error means a
     * whole model: every weight computed). */
    if (d.st != QCAL_OK)
        st = qcal_error(d.st, "%s", d.msg);
    free(lazy);
    qdq_plan_free(p);
    free(p);
    return report_out(st, &r, rep);
}

qcal_status qcal_onnx_qdq_session(qcal_onnx_model *m, qcal_calib_session *s, const qcal_onnx_qdq_options *opt,
                                  qcal_onnx_qdq_report *rep)
{
    if (!s)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_onnx_qdq_session: NULL session");
    qcal_calib_table *t = NULL;
    qcal_status st = qcal_calib_session_table(s, &t);
    if (st == QCAL_OK)
        st = qcal_onnx_qdq(m, t, opt, rep);
    qcal_calib_table_destroy(&t);
    return st;
}

void qcal_onnx_qdq_report_free(qcal_onnx_qdq_report *rep)
{
    if (!rep)
        return;
    for (int64_t i = 0; i < rep->n_missing; i++)
        free(rep->missing[i]);
    for (int64_t i = 0; i < rep->n_skipped; i++)
        free(rep->skipped[i]);
    for (int64_t i = 0; i < rep->n_quantized; i++)
        free(rep->quantized[i]);
    free(rep->missing);
    free(rep->skipped);
    free(rep->quantized);
    memset(rep, 0, sizeof *rep);
}
