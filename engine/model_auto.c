/* Observer choice at the model's outputs (qcal/model_calib.h, observer_auto): the whole-model
 * candidates built from one evaluation's observers, each quantized into a real QDQ model and
 * run in the engine against the float model on a few samples; the candidate whose argmax agrees
 * with float's on the most samples wins, then the one of highest output SQNR.
 *
 * Why whole-model candidates and not only the per-tensor choice: a tensor's own SQNR is a
 * mean-squared-error criterion, and clipping that lowers one tensor's error can cost more at
 * the outputs than it saves (measured on PP-OCRv4 recognition: the per-tensor choice, mse on
 * most tensors, read fewer lines than histogram everywhere; docs/accuracy.md). Every kind was
 * observed on every tensor in the first pass, so each candidate's table costs no run over the
 * data, only its QDQ model's runs on the samples kept. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "engine/engine_internal.h"
#include "qcal/calib.h"

qcal_status engine_auto_keep(const qcal_engine_value *v, int64_t n, engine_auto_run *out)
{
    memset(out, 0, sizeof *out);
    out->v = calloc((size_t)n + 1, sizeof *out->v);
    if (!out->v)
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory keeping a sample for observer_auto");
    out->n = n;
    for (int64_t i = 0; i < n; i++) {
        out->v[i] = v[i];
        out->v[i].name = NULL;
        out->v[i].data = NULL;
        char *name = v[i].name ? qcal_strdup(v[i].name) : NULL;
        void *data = malloc(v[i].nbytes ? v[i].nbytes : 1);
        out->v[i].name = name;
        out->v[i].data = data;
        if ((v[i].name && !name) || !data) {
            engine_auto_run_free(out);
            return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory keeping a sample for observer_auto");
        }
        if (v[i].nbytes)
            memcpy(data, v[i].data, v[i].nbytes);
    }
    return QCAL_OK;
}

void engine_auto_run_free(engine_auto_run *r)
{
    for (int64_t i = 0; r->v && i < r->n; i++) {
        free((char *)r->v[i].name);
        free((void *)r->v[i].data);
    }
    free(r->v);
    memset(r, 0, sizeof *r);
}

/* The table of one candidate: every tensor's observer of kind `kind`, or (kind < 0) of the
 * kind its per-tensor SQNR recommends, merged into a session of default options as
 * model_calib.c's choice merges them into the caller's. */
static qcal_status candidate_table(const qcal_numeric_eval *ev, int kind, const char *profile,
                                   qcal_calib_table **out)
{
    qcal_calib_session *s = NULL;
    qcal_status st = qcal_calib_session_create(NULL, &s);
    int64_t n = 0;
    if (st >= 0)
        st = qcal_numeric_eval_count(ev, &n);
    for (int64_t i = 0; i < n && st >= 0; i++) {
        qcal_numeric_eval_tensor t;
        const qcal_observer *obs = NULL;
        if ((st = qcal_numeric_eval_result(ev, i, &t)) < 0)
            break;
        qcal_observer_kind k = kind < 0 ? t.candidates[t.recommended].kind : (qcal_observer_kind)kind;
        if ((st = qcal_numeric_eval_observer(ev, i, k, &obs)) >= 0)
            st = qcal_calib_session_merge_observer(s, t.name, t.role, obs, t.count + t.nonfinite);
    }
    if (st >= 0)
        st = qcal_calib_session_table(s, out);
    if (st >= 0 && (st = qcal_calib_table_set_profile(*out, profile)) < 0)
        qcal_calib_table_destroy(out);
    qcal_calib_session_destroy(&s);
    return st;
}

static qcal_status session_of(qcal_engine *e, const qcal_onnx_model *m, int threads,
                              qcal_engine_session **out)
{
    void *buf = NULL;
    size_t len = 0;
    qcal_status st = qcal_onnx_model_serialize(m, &buf, &len);
    if (st < 0)
        return st;
    qcal_engine_session_options so;
    qcal_engine_session_options_default(&so);
    so.optimization = 99;   /* as `qcal compare` runs both: the QDQ model on int8 kernels */
    so.threads = threads;
    st = qcal_engine_session_create(e, buf, len, &so, out);
    qcal_free(buf);
    return st;
}

/* One sample's outputs against float's: sum of f^2 and (f - q)^2 over the finite pairs of
 * every float output (the SQNR `qcal compare` prints over all outputs together), the
 * positions (every axis but the last, of outputs whose last axis is longer than 1) and
 * whether the argmax over the last axis agrees at every one of them (compare's exact
 * agreement: a line read whole, an image classified alike). */
static qcal_status fold(const qcal_engine_outputs *fo, const qcal_engine_outputs *qo, double *ss_f,
                        double *ss_e, int64_t *positions, bool *all_agree)
{
    *positions = 0;
    *all_agree = true;
    int64_t n = qcal_engine_outputs_count(fo);
    if (qcal_engine_outputs_count(qo) != n)
        return qcal_error(QCAL_ERR_MISMATCH, "observer_auto: the QDQ model has %lld outputs, the "
                          "float model %lld", (long long)qcal_engine_outputs_count(qo), (long long)n);
    for (int64_t i = 0; i < n; i++) {
        qcal_engine_value f, q;
        qcal_status st = qcal_engine_outputs_at(fo, i, &f);
        if (st < 0 || (st = qcal_engine_outputs_at(qo, i, &q)) < 0)
            return st;
        if (f.elem_type != QCAL_ONNX_FLOAT || q.elem_type != QCAL_ONNX_FLOAT)
            continue;
        if (f.nbytes != q.nbytes)
            return qcal_error(QCAL_ERR_MISMATCH, "observer_auto: output '%s' of the QDQ model "
                              "differs in shape from float's", f.name);
        const float *a = f.data, *b = q.data;
        int64_t numel = (int64_t)(f.nbytes / sizeof(float));
        int64_t last = f.ndim >= 1 ? f.dims[f.ndim - 1] : 1;
        for (int64_t p = 0; last > 1 && p < numel / last; p++) {
            *all_agree = *all_agree &&
                         engine_argmax_f32(a + p * last, last) == engine_argmax_f32(b + p * last, last);
            (*positions)++;
        }
        for (size_t j = 0; j < f.nbytes / sizeof(float); j++) {
            double x = a[j], y = b[j];
            if (!isfinite(x) || !isfinite(y))
                continue;
            *ss_f += x * x;
            *ss_e += (x - y) * (x - y);
        }
    }
    return QCAL_OK;
}

static double sqnr_db(double ss_f, double ss_e)
{
    if (ss_e == 0.0)
        return ss_f == 0.0 ? NAN : INFINITY;
    return 10.0 * log10(ss_f / ss_e);
}

qcal_status engine_auto_choose(qcal_engine *e, const void *model, size_t len,
                               const qcal_onnx_qdq_options *qopt, int threads,
                               const qcal_numeric_eval *ev, const engine_auto_run *runs,
                               int64_t n_runs, int32_t *choice, double *sqnr, int64_t *agree)
{
    /* Candidates in a fixed order, ties to the earlier: the per-tensor choice, then each kind
     * everywhere, simplest first (qcal_numeric_eval_simplicity). */
    int order[QCAL_OBSERVER_KIND_COUNT + 1];
    int n_c = 0;
    order[n_c++] = -1;
    for (int rank = 0; rank < QCAL_OBSERVER_KIND_COUNT; rank++)
        for (int k = 0; k < QCAL_OBSERVER_KIND_COUNT; k++)
            if ((QCAL_MODEL_CALIB_AUTO_KINDS >> k & 1u) &&
                qcal_numeric_eval_simplicity((qcal_observer_kind)k) == rank)
                order[n_c++] = k;
    for (int k = 0; k <= QCAL_OBSERVER_KIND_COUNT; k++) {
        sqnr[k] = NAN;
        agree[k] = -1;
    }
    qcal_onnx_model *m = NULL;
    qcal_engine_session *fs = NULL;
    qcal_engine_outputs **ref = calloc((size_t)n_runs + 1, sizeof *ref);
    qcal_status st = ref ? qcal_onnx_model_parse(model, len, &m)
                         : qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    if (st >= 0)
        st = session_of(e, m, threads, &fs);
    qcal_onnx_model_destroy(&m);
    /* The float model's outputs once, kept for every candidate (a few samples). */
    for (int64_t r = 0; r < n_runs && st >= 0; r++)
        st = qcal_engine_session_run(fs, runs[r].v, runs[r].n, NULL, 0, &ref[r]);
    qcal_engine_session_destroy(&fs);
    double best = -INFINITY;
    int64_t best_agree = -1;
    int32_t best_c = -1;
    bool any_positions = false;
    for (int c = 0; c < n_c && st >= 0; c++) {
        qcal_calib_table *t = NULL;
        qcal_engine_session *qs = NULL;
        qcal_onnx_qdq_report rep;
        memset(&rep, 0, sizeof rep);
        if ((st = candidate_table(ev, order[c], qcal_onnx_profile_name(qopt->profile), &t)) >= 0 &&
            (st = qcal_onnx_model_parse(model, len, &m)) >= 0 &&
            (st = qcal_onnx_qdq(m, t, qopt, &rep)) >= 0)
            st = session_of(e, m, threads, &qs);
        qcal_onnx_qdq_report_free(&rep);
        qcal_onnx_model_destroy(&m);
        qcal_calib_table_destroy(&t);
        double ss_f = 0.0, ss_e = 0.0;
        int64_t n_agree = 0;
        /* One sample per run, in data order: the sums, and so the choice, are a function of
         * the samples alone. */
        for (int64_t r = 0; r < n_runs && st >= 0; r++) {
            qcal_engine_outputs *qo = NULL;
            int64_t pos = 0;
            bool all = true;
            if ((st = qcal_engine_session_run(qs, runs[r].v, runs[r].n, NULL, 0, &qo)) >= 0)
                st = fold(ref[r], qo, &ss_f, &ss_e, &pos, &all);
            qcal_engine_outputs_free(&qo);
            n_agree += pos && all;
            any_positions = any_positions || pos;
        }
        qcal_engine_session_destroy(&qs);
        if (st < 0)
            break;
        double v = sqnr_db(ss_f, ss_e);
        sqnr[order[c] + 1] = v;
        agree[order[c] + 1] = n_agree;
        /* The samples whose argmax agrees with float's everywhere first (none has positions:
         * 0 for all), then the SQNR: on the demo CNN's 3-bit setting the logits' SQNR ranks
         * the candidates nearly opposite to their accuracy (docs/accuracy.md). */
        double key = isnan(v) ? -INFINITY : v;
        if (c == 0 || n_agree > best_agree || (n_agree == best_agree && key > best)) {
            best = key;
            best_agree = n_agree;
            best_c = order[c];
        }
    }
    if (!any_positions)
        for (int k = 0; k <= QCAL_OBSERVER_KIND_COUNT; k++)
            agree[k] = -1;
    for (int64_t r = 0; ref && r < n_runs; r++)
        qcal_engine_outputs_free(&ref[r]);
    free(ref);
    if (st < 0)
        return qcal_error(st, "observer_auto at the outputs: %s", qcal_last_error());
    *choice = best_c;
    return QCAL_OK;
}
