/* Accuracy through the engine (qcal/accuracy.h, docs/accuracy.md): float and quantized
 * models run on the same data and compared at their outputs; per-op sensitivity on one
 * gated model (onnx/gate.c); the keep-float search.
 *
 * Every measurement is a pass over the data: for each run, the reference (the float model,
 * or the gated model with every gate off) runs once and each candidate after it on the
 * same inputs; each candidate's outputs are folded into its sums at once and freed, so a
 * pass holds the reference's outputs and one candidate's. Sums run sample by sample in
 * data order (doubles), the same sequence of additions whatever the batch. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/internal.h"
#include "engine/engine_internal.h"
#include "qcal/accuracy.h"
#include "qcal/dataset.h"

#define ONNX_FLOAT 1
#define ONNX_INT32 6
#define ONNX_INT64 7
#define ONNX_BOOL 9

#ifndef GATED_LEVEL
#define GATED_LEVEL 99
#endif

qcal_status qcal_accuracy_metric_parse(const char *name, qcal_accuracy_metric *out)
{
    if (!name || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "accuracy metric: NULL argument");
    if (!strcmp(name, "top1"))
        *out = QCAL_ACCURACY_TOP1;
    else if (!strcmp(name, "exact"))
        *out = QCAL_ACCURACY_EXACT;
    else
        return qcal_error(QCAL_ERR_INVALID_ARG, "unknown metric '%s' (top1, exact)", name);
    return QCAL_OK;
}

const char *qcal_accuracy_metric_name(qcal_accuracy_metric metric)
{
    return metric == QCAL_ACCURACY_EXACT ? "exact" : "top1";
}

void qcal_accuracy_options_default(qcal_accuracy_options *opt)
{
    if (!opt)
        return;
    memset(opt, 0, sizeof *opt);
    opt->batch = 8;
    opt->optimization = 99;
    opt->sensitivity_samples = 8;
    opt->others = true;
    opt->metric = QCAL_ACCURACY_TOP1;
}

/* ---- sums of one (candidate, output) ---- */

typedef struct acc_sums {
    double ss_f, ss_e, dot, ss_q;
    int64_t positions, agree, samples, exact, nonfinite;
    int64_t right_f, right_q;     /* label metric counts (positions or samples) */
    int64_t judged;               /* what right_* count over */
} acc_sums;

static double sqnr_db(double ss_f, double ss_e)
{
    if (ss_e == 0.0)
        return ss_f == 0.0 ? NAN : INFINITY;
    return 10.0 * log10(ss_f / ss_e);
}

/* ---- the runner: data, sessions, passes ---- */

typedef struct cand {
    qcal_engine_session *s;
    const uint8_t *gates;   /* n_gates bools, or NULL (no gate input) */
} cand;

typedef struct runner {
    qcal_engine *e;
    qcal_dataset *ds;
    qcal_engine_io *inputs;
    int64_t n_inputs;
    int64_t n_gates;
    int64_t n_out;
    char **out_names;
    const qcal_accuracy_options *opt;
    int64_t total;          /* samples in the data */
    int64_t runs;
    int64_t label_rows;     /* labels: rows and positions per row */
    int64_t label_pos;
    /* The float model's outputs of each run, kept across passes that run the same batches
     * (the keep-float search) while they fit in cache_budget bytes. */
    bool cache_on;
    qcal_engine_outputs **cache;
    int64_t n_cache, cap_cache;
    uint64_t cache_bytes, cache_budget;
    bool cache_full;
} runner;

static void runner_free(runner *r)
{
    for (int64_t i = 0; i < r->n_cache; i++)
        qcal_engine_outputs_free(&r->cache[i]);
    free(r->cache);
    qcal_dataset_close(&r->ds);
    if (r->inputs)
        for (int64_t i = 0; i < r->n_inputs; i++)
            free((char *)r->inputs[i].name);
    free(r->inputs);
    if (r->out_names)
        for (int64_t i = 0; i < r->n_out; i++)
            free(r->out_names[i]);
    free(r->out_names);
    memset(r, 0, sizeof *r);
}

/* Inputs and outputs from the float session; the data opened against its inputs. */
static qcal_status runner_open(runner *r, qcal_engine *e, qcal_engine_session *fs, const char *data,
                               const char *const *entries, int64_t n_entries,
                               const qcal_accuracy_options *opt)
{
    memset(r, 0, sizeof *r);
    r->e = e;
    r->opt = opt;
    r->n_inputs = qcal_engine_session_input_count(fs);
    r->n_out = qcal_engine_session_output_count(fs);
    r->inputs = calloc((size_t)(r->n_inputs ? r->n_inputs : 1), sizeof *r->inputs);
    r->out_names = calloc((size_t)(r->n_out ? r->n_out : 1), sizeof *r->out_names);
    if (!r->inputs || !r->out_names)
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    qcal_status st;
    for (int64_t i = 0; i < r->n_inputs; i++) {
        qcal_engine_io io;
        if ((st = qcal_engine_session_input(fs, i, &io)) != QCAL_OK)
            return st;
        r->inputs[i] = io;
        if (!(r->inputs[i].name = qcal_strdup(io.name)))
            return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    }
    for (int64_t i = 0; i < r->n_out; i++) {
        qcal_engine_io io;
        if ((st = qcal_engine_session_output(fs, i, &io)) != QCAL_OK)
            return st;
        if (!(r->out_names[i] = qcal_strdup(io.name)))
            return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    }
    if ((st = qcal_dataset_open(data, entries, n_entries, r->inputs, r->n_inputs, NULL, &r->ds)) != QCAL_OK)
        return st;
    int64_t files = qcal_dataset_file_count(r->ds);
    for (int64_t f = 0; f < files; f++) {
        qcal_dataset_file_info fi;
        if ((st = qcal_dataset_file_get(r->ds, f, &fi)) != QCAL_OK)
            return st;
        r->total += fi.samples;
    }
    if (opt->labels) {
        const qcal_engine_value *l = opt->labels;
        if (l->elem_type != ONNX_INT64 && l->elem_type != ONNX_INT32)
            return qcal_error(QCAL_ERR_UNSUPPORTED, "labels: int64 or int32 wanted, not %s",
                              qcal_engine_elem_name(l->elem_type));
        if (l->ndim < 1)
            return qcal_error(QCAL_ERR_MISMATCH, "labels: one row per sample wanted (a 0-d array)");
        if (opt->label_output < 0 || opt->label_output >= r->n_out)
            return qcal_error(QCAL_ERR_INVALID_ARG, "labels: output %lld of a model with %lld",
                              (long long)opt->label_output, (long long)r->n_out);
        r->label_rows = l->dims[0];
        r->label_pos = 1;
        for (int32_t d = 1; d < l->ndim; d++)
            r->label_pos *= l->dims[d];
        int64_t need = opt->max_samples > 0 && opt->max_samples < r->total ? opt->max_samples : r->total;
        if (r->label_rows < need)
            return qcal_error(QCAL_ERR_MISMATCH, "labels: %lld rows for %lld samples", (long long)r->label_rows,
                              (long long)need);
    }
    return QCAL_OK;
}

/* The outputs of a session must be the float model's, in its order. */
static qcal_status check_outputs(const runner *r, qcal_engine_session *s, const char *what)
{
    int64_t n = qcal_engine_session_output_count(s);
    if (n != r->n_out)
        return qcal_error(QCAL_ERR_MISMATCH, "%s has %lld outputs, the float model %lld", what, (long long)n,
                          (long long)r->n_out);
    for (int64_t i = 0; i < n; i++) {
        qcal_engine_io io;
        qcal_status st = qcal_engine_session_output(s, i, &io);
        if (st != QCAL_OK)
            return st;
        if (strcmp(io.name, r->out_names[i]))
            return qcal_error(QCAL_ERR_MISMATCH, "%s's output %lld is '%s', the float model's '%s'", what,
                              (long long)i, io.name, r->out_names[i]);
    }
    return QCAL_OK;
}

static qcal_status run_cand(runner *r, const cand *c, const qcal_engine_value *vals, qcal_engine_outputs **out)
{
    qcal_engine_value in[64];
    qcal_engine_value *iv = in;
    int64_t n = r->n_inputs + (c->gates ? 1 : 0);
    if (n > 64 && !(iv = malloc((size_t)n * sizeof *iv)))
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    memcpy(iv, vals, (size_t)r->n_inputs * sizeof *iv);
    if (c->gates) {
        /* the gated model's input: a bool per op, 1 byte each (qcal_onnx_gate) */
        qcal_engine_value *g = &iv[r->n_inputs];
        memset(g, 0, sizeof *g);
        g->name = QCAL_ONNX_GATES_INPUT;
        g->elem_type = ONNX_BOOL;
        g->ndim = 1;
        g->dims[0] = r->n_gates;
        g->data = c->gates;
        g->nbytes = (size_t)r->n_gates;
    }
    qcal_status st = qcal_engine_session_run(c->s, iv, n, (const char *const *)r->out_names, r->n_out, out);
    if (iv != in)
        free(iv);
    r->runs++;
    return st;
}

static int64_t label_at(const qcal_engine_value *l, int64_t i)
{
    return l->elem_type == ONNX_INT64 ? ((const int64_t *)l->data)[i] : ((const int32_t *)l->data)[i];
}

/* Folds one output of n samples (first sample index s0 in the data) into sums. */
static qcal_status fold(runner *r, int64_t o, const qcal_engine_value *f, const qcal_engine_value *q, int64_t n,
                        int64_t s0, acc_sums *c, acc_sums *ref_lab)
{
    if (f->elem_type != ONNX_FLOAT || q->elem_type != ONNX_FLOAT)
        return QCAL_OK; /* only float outputs are compared */
    if (f->ndim != q->ndim || f->nbytes != q->nbytes)
        return qcal_error(QCAL_ERR_MISMATCH, "output '%s': the quantized model's shape differs from float's",
                          r->out_names[o]);
    for (int32_t d = 0; d < f->ndim; d++)
        if (f->dims[d] != q->dims[d])
            return qcal_error(QCAL_ERR_MISMATCH, "output '%s': the quantized model's shape differs from float's",
                              r->out_names[o]);
    int64_t numel = (int64_t)(f->nbytes / sizeof(float));
    bool batched = f->ndim >= 1 && f->dims[0] == n;
    if (!batched && n != 1)
        return qcal_error(QCAL_ERR_UNSUPPORTED,
                          "output '%s' is not batched on its first axis: run one sample per run (batch 1)",
                          r->out_names[o]);
    int64_t per = n ? numel / n : 0;
    int64_t last = 1;
    if (f->ndim >= (batched ? 2 : 1))
        last = f->dims[f->ndim - 1];
    if (last < 1)
        last = 1;
    int64_t pos = last > 1 ? per / last : 0;
    const float *fv = f->data, *qv = q->data;
    const qcal_engine_value *lab = r->opt->labels;
    bool labelled = lab && o == r->opt->label_output;
    if (labelled && pos != r->label_pos)
        return qcal_error(QCAL_ERR_MISMATCH, "labels: %lld per sample, output '%s' has %lld positions",
                          (long long)r->label_pos, r->out_names[o], (long long)pos);
    for (int64_t s = 0; s < n; s++) {
        const float *a = fv + s * per, *b = qv + s * per;
        for (int64_t i = 0; i < per; i++) {
            double x = a[i], y = b[i];
            if (!isfinite(x) || !isfinite(y)) {
                c->nonfinite++;
                continue;
            }
            c->ss_f += x * x;
            c->ss_e += (x - y) * (x - y);
            c->dot += x * y;
            c->ss_q += y * y;
        }
        c->samples++;
        if (!pos)
            continue;
        bool all = true, all_f = true, all_q = true;
        for (int64_t p = 0; p < pos; p++) {
            int64_t af = engine_argmax_f32(a + p * last, last);
            int64_t aq = engine_argmax_f32(b + p * last, last);
            bool eq = af == aq;
            c->agree += eq;
            all = all && eq;
            if (labelled) {
                int64_t want = label_at(lab, (s0 + s) * pos + p);
                bool rf = af == want, rq = aq == want;
                all_f = all_f && rf;
                all_q = all_q && rq;
                if (r->opt->metric == QCAL_ACCURACY_TOP1) {
                    ref_lab->right_f += rf;
                    c->right_q += rq;
                }
            }
        }
        c->positions += pos;
        c->exact += all;
        if (labelled && r->opt->metric == QCAL_ACCURACY_EXACT) {
            ref_lab->right_f += all_f;
            c->right_q += all_q;
        }
        if (labelled)
            c->judged += r->opt->metric == QCAL_ACCURACY_EXACT ? 1 : pos;
    }
    return QCAL_OK;
}

/* Keeps a run's float outputs for later passes; false (not kept) past the budget. */
static bool cache_put(runner *r, qcal_engine_outputs *o)
{
    uint64_t bytes = 0;
    for (int64_t i = 0; i < qcal_engine_outputs_count(o); i++) {
        qcal_engine_value v;
        if (qcal_engine_outputs_at(o, i, &v) == QCAL_OK)
            bytes += v.nbytes;
    }
    if (r->cache_bytes + bytes > r->cache_budget) {
        r->cache_full = true;
        return false;
    }
    if (r->n_cache == r->cap_cache) {
        int64_t cap = r->cap_cache ? r->cap_cache * 2 : 64;
        qcal_engine_outputs **c = realloc(r->cache, (size_t)cap * sizeof *c);
        if (!c) {
            r->cache_full = true;
            return false;
        }
        r->cache = c;
        r->cap_cache = cap;
    }
    r->cache[r->n_cache++] = o;
    r->cache_bytes += bytes;
    return true;
}

/* One pass over the first max_samples samples (0: all): ref then every candidate on each
 * run. sums: n_c * n_out; ref_lab: n_c * n_out too (the reference's label counts, the same
 * for every candidate: kept per candidate so each candidate's sums are self-contained). */
static qcal_status pass(runner *r, const cand *ref, const cand *c, int64_t n_c, int64_t max_samples,
                        acc_sums *sums, const char *what)
{
    const qcal_accuracy_options *o = r->opt;
    /* The gated model runs one sample at a time: an op whose gate is on runs its float
     * kernel on dequantized weights, not constants, which rounds differently at different
     * batch sizes (measured with the earlier blend form: the per-op SQNR of batches 1 and 5
     * differed in the last bits), so a fixed batch keeps every figure a function of the data
     * alone. */
    bool single = ref->gates != NULL;
    memset(sums, 0, (size_t)(n_c * r->n_out) * 2 * sizeof *sums);
    acc_sums *ref_lab = sums + n_c * r->n_out;
    int64_t limit = max_samples > 0 && max_samples < r->total ? max_samples : r->total;
    int64_t files = qcal_dataset_file_count(r->ds), done = 0;
    int64_t batch = o->batch > 0 ? o->batch : 8;
    int64_t planned_runs = 0;
    for (int64_t f = 0, left = limit; f < files && left > 0; f++) {
        qcal_dataset_file_info fi;
        if (qcal_dataset_file_get(r->ds, f, &fi) != QCAL_OK)
            break;
        int64_t take = fi.samples < left ? fi.samples : left;
        int64_t per = fi.splittable && !single ? batch : 1;
        planned_runs += (take + per - 1) / per * (n_c + 1);
        left -= take;
    }
    int64_t runs0 = r->runs, nrun = 0;
    qcal_status st = QCAL_OK;
    for (int64_t f = 0; f < files && done < limit && st == QCAL_OK; f++) {
        qcal_dataset_file_info fi;
        if ((st = qcal_dataset_file_get(r->ds, f, &fi)) != QCAL_OK)
            break;
        for (int64_t s0 = 0; s0 < fi.samples && done < limit && st == QCAL_OK;) {
            int64_t n = fi.splittable && !single ? batch : 1;
            if (n > fi.samples - s0)
                n = fi.samples - s0;
            if (n > limit - done)
                n = limit - done;
            qcal_dataset_batch *b = NULL;
            if ((st = qcal_dataset_read(r->ds, f, s0, n, &b)) != QCAL_OK)
                break;
            const qcal_engine_value *vals = qcal_dataset_batch_values(b);
            qcal_engine_outputs *ro = NULL;
            bool cached = false;
            int64_t run_idx = nrun++;
            if (r->cache_on && !ref->gates && run_idx < r->n_cache) {
                ro = r->cache[run_idx];
                cached = true;
            } else {
                st = run_cand(r, ref, vals, &ro);
                if (st == QCAL_OK && r->cache_on && !ref->gates && !r->cache_full && run_idx == r->n_cache)
                    cached = cache_put(r, ro);
            }
            for (int64_t k = 0; k < n_c && st == QCAL_OK; k++) {
                qcal_engine_outputs *co = NULL;
                if ((st = run_cand(r, &c[k], vals, &co)) != QCAL_OK)
                    break;
                for (int64_t i = 0; i < r->n_out && st == QCAL_OK; i++) {
                    qcal_engine_value fv, qv;
                    if ((st = qcal_engine_outputs_at(ro, i, &fv)) == QCAL_OK &&
                        (st = qcal_engine_outputs_at(co, i, &qv)) == QCAL_OK)
                        st = fold(r, i, &fv, &qv, n, done, &sums[k * r->n_out + i], &ref_lab[k * r->n_out + i]);
                }
                qcal_engine_outputs_free(&co);
                if (o->progress)
                    o->progress(o->progress_user, r->runs - runs0, planned_runs, what);
            }
            if (!cached)
                qcal_engine_outputs_free(&ro);
            qcal_dataset_batch_free(&b);
            if (st != QCAL_OK)
                st = qcal_error(st, "%s, samples %lld-%lld: %s", fi.path, (long long)s0, (long long)(s0 + n - 1),
                                qcal_last_error());
            s0 += n;
            done += n;
        }
    }
    return st;
}

/* SQNR over every float output of candidate k. */
static double total_sqnr(const runner *r, const acc_sums *sums, int64_t k)
{
    double f = 0.0, e = 0.0;
    for (int64_t i = 0; i < r->n_out; i++) {
        f += sums[k * r->n_out + i].ss_f;
        e += sums[k * r->n_out + i].ss_e;
    }
    return sqnr_db(f, e);
}

static void fill_output(qcal_accuracy_output *out, const acc_sums *c, const acc_sums *rl, bool labelled)
{
    out->sqnr_db = sqnr_db(c->ss_f, c->ss_e);
    out->cosine = c->ss_f > 0.0 && c->ss_q > 0.0 ? c->dot / (sqrt(c->ss_f) * sqrt(c->ss_q)) : NAN;
    out->agree = c->positions ? (double)c->agree / (double)c->positions : NAN;
    out->exact_agree = c->positions && c->samples ? (double)c->exact / (double)c->samples : NAN;
    out->acc_float = labelled && c->judged ? (double)rl->right_f / (double)c->judged : NAN;
    out->acc_quant = labelled && c->judged ? (double)c->right_q / (double)c->judged : NAN;
    out->samples = c->samples;
    out->positions = c->positions;
    out->nonfinite = c->nonfinite;
}

/* The label metric of candidate k (float's and quantized's), NaN without labels. */
static void label_metric(const runner *r, const acc_sums *sums, int64_t n_c, int64_t k, double *accf, double *accq)
{
    *accf = *accq = NAN;
    if (!r->opt->labels)
        return;
    int64_t i = k * r->n_out + r->opt->label_output;
    const acc_sums *c = &sums[i], *rl = &sums[n_c * r->n_out + i];
    if (c->judged) {
        *accf = (double)rl->right_f / (double)c->judged;
        *accq = (double)c->right_q / (double)c->judged;
    }
}

static qcal_status session_at(qcal_engine *e, const qcal_onnx_model *m, const qcal_accuracy_options *opt,
                              int level, qcal_engine_session **out);

static qcal_status session(qcal_engine *e, const qcal_onnx_model *m, const qcal_accuracy_options *opt,
                           qcal_engine_session **out)
{
    return session_at(e, m, opt, opt->optimization, out);
}

/* The gated model's session: at the level asked, at most GATED_LEVEL (99, 'all'; measured on
 * PP-OCRv4 recognition, one-sample gated runs against a float run of the same process took
 * 4-43% longer at level 1 than at 'all': the bodies of its Ifs are optimized as subgraphs). */
static qcal_status gated_session(qcal_engine *e, const qcal_onnx_model *m, const qcal_accuracy_options *opt,
                                 qcal_engine_session **out)
{
    return session_at(e, m, opt, opt->optimization < GATED_LEVEL ? opt->optimization : GATED_LEVEL, out);
}

static qcal_status session_at(qcal_engine *e, const qcal_onnx_model *m, const qcal_accuracy_options *opt,
                              int level, qcal_engine_session **out)
{
    void *buf = NULL;
    size_t len = 0;
    qcal_status st = qcal_onnx_model_serialize(m, &buf, &len);
    if (st != QCAL_OK)
        return st;
    qcal_engine_session_options so;
    qcal_engine_session_options_default(&so);
    so.optimization = level;
    so.threads = opt->threads;
    st = qcal_engine_session_create(e, buf, len, &so, out);
    qcal_free(buf);
    return st;
}

void qcal_accuracy_report_free(qcal_accuracy_report *rep)
{
    if (!rep)
        return;
    for (int64_t i = 0; rep->outputs && i < rep->n_outputs; i++)
        free(rep->outputs[i].name);
    free(rep->outputs);
    for (int64_t i = 0; rep->ops && i < rep->n_ops; i++) {
        free(rep->ops[i].name);
        free(rep->ops[i].op_type);
    }
    free(rep->ops);
    memset(rep, 0, sizeof *rep);
}

/* Sensitivity order: lowest sqnr first, ties in graph order. */
typedef struct rank_item {
    double v;
    int64_t i;
} rank_item;

static int rank_cmp(const void *a, const void *b)
{
    const rank_item *x = a, *y = b;
    double u = isnan(x->v) ? INFINITY : x->v, w = isnan(y->v) ? INFINITY : y->v;
    if (u < w)
        return -1;
    if (u > w)
        return 1;
    return (x->i > y->i) - (x->i < y->i);
}

/* The one-at-a-time runs (and, with others, all-but-one) on the gated model: sqnr_only[n],
 * sqnr_others[n] (may be NULL), *all_on. */
static qcal_status per_op(runner *r, qcal_engine_session *gs, int64_t n, int64_t samples, bool others,
                          const uint8_t *want, double *only, double *oth, double *all_on)
{
    /* candidates: 0 every gate on; then op k alone and (others) all but op k, for each op
     * wanted (want NULL: every op) */
    int64_t m = 0;
    for (int64_t k = 0; k < n; k++)
        m += !want || want[k];
    int64_t n_c = 1 + m + (others ? m : 0);
    uint8_t *g = calloc((size_t)(n_c + 1) * (size_t)n + 1, 1);
    cand *c = calloc((size_t)n_c, sizeof *c);
    int64_t *idx = calloc((size_t)m + 1, sizeof *idx);
    acc_sums *sums = calloc((size_t)(n_c * r->n_out) * 2 + 1, sizeof *sums);
    if (!g || !c || !idx || !sums) {
        free(g), free(c), free(idx), free(sums);
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    }
    for (int64_t k = 0, j = 0; k < n; k++)
        if (!want || want[k])
            idx[j++] = k;
    cand ref = {gs, g}; /* row 0: every gate off */
    for (int64_t k = 0; k < n_c; k++) {
        uint8_t *row = g + (size_t)(k + 1) * (size_t)n;
        if (k == 0)
            memset(row, 1, (size_t)n);
        else if (k <= m)
            row[idx[k - 1]] = 1;
        else {
            memset(row, 1, (size_t)n);
            row[idx[k - 1 - m]] = 0;
        }
        c[k].s = gs;
        c[k].gates = row;
    }
    qcal_status st = pass(r, &ref, c, n_c, samples, sums, "per-op sensitivity");
    if (st == QCAL_OK) {
        *all_on = total_sqnr(r, sums, 0);
        for (int64_t k = 0; k < n; k++) {
            only[k] = NAN;
            if (oth)
                oth[k] = NAN;
        }
        for (int64_t j = 0; j < m; j++) {
            only[idx[j]] = total_sqnr(r, sums, 1 + j);
            if (oth && others)
                oth[idx[j]] = total_sqnr(r, sums, 1 + m + j);
        }
    }
    free(g), free(c), free(idx), free(sums);
    return st;
}

qcal_status qcal_accuracy_compare(qcal_engine *e, const qcal_onnx_model *float_m, const qcal_onnx_model *qdq_m,
                                  const qcal_onnx_model *ref, const char *data, const char *const *entries,
                                  int64_t n_entries, const qcal_accuracy_options *opt, qcal_accuracy_report *rep)
{
    if (!e || !float_m || !qdq_m || !rep)
        return qcal_error(QCAL_ERR_INVALID_ARG, "compare: NULL argument");
    qcal_accuracy_options dflt;
    if (!opt) {
        qcal_accuracy_options_default(&dflt);
        opt = &dflt;
    }
    double t0 = engine_now_s();
    qcal_accuracy_report R;
    memset(&R, 0, sizeof R);
    R.sqnr_db = R.gated_sqnr_db = NAN;
    runner r;
    memset(&r, 0, sizeof r);
    qcal_engine_session *fs = NULL, *qs = NULL, *gs = NULL;
    qcal_onnx_model *gm = NULL;
    qcal_onnx_gate_op *gops = NULL;
    int64_t n_gops = 0;
    acc_sums *sums = NULL;
    double *only = NULL, *oth = NULL;
    qcal_status st;
    if ((st = session(e, float_m, opt, &fs)) != QCAL_OK)
        goto fail;
    if ((st = session(e, qdq_m, opt, &qs)) != QCAL_OK) {
        st = qcal_error(st, "the QDQ model: %s", qcal_last_error());
        goto fail;
    }
    if ((st = runner_open(&r, e, fs, data, entries, n_entries, opt)) != QCAL_OK ||
        (st = check_outputs(&r, qs, "the QDQ model")) != QCAL_OK)
        goto fail;
    if (!(sums = calloc((size_t)r.n_out * 2 + 1, sizeof *sums)) ||
        !(R.outputs = calloc((size_t)(r.n_out ? r.n_out : 1), sizeof *R.outputs))) {
        st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
        goto fail;
    }
    cand fc = {fs, NULL}, qc = {qs, NULL};
    if ((st = pass(&r, &fc, &qc, 1, opt->max_samples, sums, "float against quantized")) != QCAL_OK)
        goto fail;
    R.n_outputs = r.n_out;
    for (int64_t i = 0; i < r.n_out; i++) {
        if (!(R.outputs[i].name = qcal_strdup(r.out_names[i]))) {
            st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
            goto fail;
        }
        fill_output(&R.outputs[i], &sums[i], &sums[r.n_out + i], opt->labels && i == opt->label_output);
    }
    R.sqnr_db = total_sqnr(&r, sums, 0);
    R.samples = sums[0].samples;
    qcal_engine_session_destroy(&qs);

    if (opt->sensitivity_samples > 0) {
        if ((st = qcal_onnx_gate(qdq_m, ref ? ref : float_m, &gm, &gops, &n_gops)) != QCAL_OK ||
            (st = gated_session(e, gm, opt, &gs)) != QCAL_OK || (st = check_outputs(&r, gs, "the gated model")) != QCAL_OK)
            goto fail;
        qcal_onnx_model_destroy(&gm);
        r.n_gates = n_gops;
        only = calloc((size_t)n_gops, sizeof *only);
        oth = calloc((size_t)n_gops, sizeof *oth);
        R.ops = calloc((size_t)n_gops, sizeof *R.ops);
        rank_item *rk = calloc((size_t)n_gops, sizeof *rk);
        if (!only || !oth || !R.ops || !rk) {
            free(rk);
            st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
            goto fail;
        }
        st = per_op(&r, gs, n_gops, opt->sensitivity_samples, opt->others, NULL, only, oth, &R.gated_sqnr_db);
        if (st != QCAL_OK) {
            free(rk);
            goto fail;
        }
        for (int64_t k = 0; k < n_gops; k++)
            rk[k] = (rank_item){only[k], k};
        qsort(rk, (size_t)n_gops, sizeof *rk, rank_cmp);
        for (int64_t j = 0; j < n_gops; j++) {
            int64_t k = rk[j].i;
            qcal_accuracy_op *op = &R.ops[R.n_ops++];
            op->name = qcal_strdup(gops[k].name);
            op->op_type = qcal_strdup(gops[k].op_type);
            op->sqnr_only_db = only[k];
            op->sqnr_others_db = oth[k];
            if (!op->name || !op->op_type) {
                free(rk);
                st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
                goto fail;
            }
        }
        free(rk);
        int64_t lim = opt->sensitivity_samples < r.total ? opt->sensitivity_samples : r.total;
        R.sensitivity_samples = lim;
    }
    R.runs = r.runs;
    R.seconds = engine_now_s() - t0;
    *rep = R;
    memset(&R, 0, sizeof R);
fail:
    qcal_accuracy_report_free(&R);
    free(only), free(oth), free(sums);
    qcal_onnx_gate_ops_free(&gops, n_gops);
    qcal_onnx_model_destroy(&gm);
    qcal_engine_session_destroy(&gs);
    qcal_engine_session_destroy(&qs);
    qcal_engine_session_destroy(&fs);
    runner_free(&r);
    return st;
}

/* ---- keep-float search ---- */

char *qcal_accuracy_keep_float_exclude(const char *name)
{
    if (!name)
        return NULL;
    size_t n = strlen(name);
    char *s = malloc(2 * n + 1), *p = s;
    if (!s)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        if (strchr("*?[]\\", name[i]))
            *p++ = '\\';
        *p++ = name[i];
    }
    *p = 0;
    return s;
}

void qcal_accuracy_keep_float_result_free(qcal_accuracy_keep_float_result *res)
{
    if (!res)
        return;
    for (int64_t i = 0; res->float_ops && i < res->n_float; i++)
        free(res->float_ops[i]);
    free(res->float_ops);
    memset(res, 0, sizeof *res);
}

static bool target_holds(const qcal_accuracy_keep_float_target *t, double sqnr, double accf, double accq)
{
    if (!isnan(t->min_output_sqnr_db) && !(sqnr >= t->min_output_sqnr_db))
        return false;
    if (!isnan(t->max_drop) && !((accf - accq) * 100.0 <= t->max_drop + 1e-9))
        return false;
    return true;
}

/* A set of names (sorted on first lookup). */
typedef struct name_set {
    const char **v;
    int64_t n, cap;
    bool sorted;
} name_set;

static bool onnx_name_put(name_set *s, const char *name)
{
    if (s->n == s->cap) {
        int64_t cap = s->cap ? s->cap * 2 : 64;
        const char **v = realloc(s->v, (size_t)cap * sizeof *v);
        if (!v)
            return false;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = name;
    s->sorted = false;
    return true;
}

static int str_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static bool name_in(name_set *s, const char *name)
{
    if (!s->sorted) {
        qsort(s->v, (size_t)s->n, sizeof *s->v, str_cmp);
        s->sorted = true;
    }
    return s->n && bsearch(&name, s->v, (size_t)s->n, sizeof *s->v, str_cmp) != NULL;
}

/* m quantized with qopt plus the first k names of order excluded (escaped), as a new model. */
static qcal_status build_qdq(const qcal_onnx_model *m, const qcal_calib_table *table, const qcal_onnx_qdq_options *qopt,
                             char **const names, int64_t k, qcal_onnx_model **out, qcal_onnx_qdq_report *rep)
{
    void *buf = NULL;
    size_t len = 0;
    qcal_onnx_model *c = NULL;
    qcal_status st = qcal_onnx_model_serialize(m, &buf, &len);
    if (st == QCAL_OK)
        st = qcal_onnx_model_parse(buf, len, &c);
    qcal_free(buf);
    if (st != QCAL_OK)
        return st;
    qcal_onnx_qdq_options o = *qopt;
    int64_t n_ex = qopt->n_exclude + k;
    char **ex = calloc((size_t)(n_ex ? n_ex : 1), sizeof *ex);
    if (!ex) {
        qcal_onnx_model_destroy(&c);
        return qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    }
    for (int64_t i = 0; i < qopt->n_exclude; i++)
        ex[i] = (char *)qopt->exclude[i];
    for (int64_t i = 0; i < k && st == QCAL_OK; i++)
        if (!(ex[qopt->n_exclude + i] = qcal_accuracy_keep_float_exclude(names[i])))
            st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
    o.exclude = (const char *const *)ex;
    o.n_exclude = n_ex;
    if (st == QCAL_OK)
        st = qcal_onnx_qdq(c, table, &o, rep);
    for (int64_t i = 0; i < k; i++)
        free(ex[qopt->n_exclude + i]);
    free(ex);
    if (st != QCAL_OK) {
        qcal_onnx_model_destroy(&c);
        return st;
    }
    *out = c;
    return QCAL_OK;
}

qcal_status qcal_accuracy_keep_float(qcal_engine *e, const qcal_onnx_model *m, const qcal_calib_table *table,
                                     const qcal_onnx_qdq_options *qopt, const char *data, const char *const *entries,
                                     int64_t n_entries, const qcal_accuracy_options *opt,
                                     const qcal_accuracy_keep_float_target *target, qcal_accuracy_keep_float_result *res)
{
    if (!e || !m || !table || !target || !res)
        return qcal_error(QCAL_ERR_INVALID_ARG, "keep-float search: NULL argument");
    qcal_accuracy_options dflt;
    if (!opt) {
        qcal_accuracy_options_default(&dflt);
        opt = &dflt;
    }
    qcal_onnx_qdq_options qd;
    if (!qopt) {
        qcal_onnx_qdq_options_default(&qd);
        qopt = &qd;
    }
    if (isnan(target->min_output_sqnr_db) && isnan(target->max_drop))
        return qcal_error(QCAL_ERR_INVALID_ARG, "keep-float search: no target (a minimum output SQNR or a maximum drop)");
    if (!isnan(target->max_drop) && !opt->labels)
        return qcal_error(QCAL_ERR_INVALID_ARG, "keep-float search: a maximum drop needs labels");
    double t0 = engine_now_s();
    qcal_accuracy_keep_float_result R;
    memset(&R, 0, sizeof R);
    R.sqnr_db = R.acc_float = R.acc_quant = NAN;
    runner r;
    memset(&r, 0, sizeof r);
    qcal_engine_session *fs = NULL, *gs = NULL;
    qcal_onnx_model *q = NULL, *gm = NULL;
    qcal_onnx_gate_op *gops = NULL;
    int64_t n_gops = 0;
    double *only = NULL;
    rank_item *rk = NULL;
    char **order = NULL;
    int64_t n_named = 0;
    acc_sums *sums = NULL;
    qcal_onnx_qdq_report qrep;
    memset(&qrep, 0, sizeof qrep);
    name_set qset;
    memset(&qset, 0, sizeof qset);
    qcal_status st;

    if ((st = session(e, m, opt, &fs)) != QCAL_OK || (st = runner_open(&r, e, fs, data, entries, n_entries, opt)) != QCAL_OK)
        goto fail;
    if (!(sums = calloc((size_t)r.n_out * 2 + 1, sizeof *sums))) {
        st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
        goto fail;
    }
    /* The float model's outputs are kept between the steps while they fit in 512 MiB. */
    r.cache_on = true;
    r.cache_budget = (uint64_t)512 << 20;

    /* Each step measures the real QDQ model with the k most sensitive ops excluded (graph
     * optimization as opt says: ONNX Runtime's int8 kernels) against the float model on the
     * data. k = 0 first; only when it fails are the ops ranked (one at a time on the gated
     * model, the first sensitivity_samples) and k searched: binary search between the largest
     * k that failed and the smallest that held (every op float holds by definition and is
     * measured only when it is the answer). The target is taken to get easier as k grows,
     * ops kept float bringing the model closer to float; every k is measured, and the answer
     * is one that held. */
    int64_t lo = -1, hi = -1, k = 0;
    bool hi_measured = false;
    double hi_sqnr = INFINITY, hi_accf = NAN, hi_accq = NAN;
    for (;;) {
        qcal_engine_session *qs = NULL;
        if ((st = build_qdq(m, table, qopt, order, k, &q, k == 0 ? &qrep : NULL)) != QCAL_OK)
            goto fail;
        if (k == 0) {
            /* the ops of the QDQ model: counted (and gated, for the ranking) from this one */
            if ((st = qcal_onnx_gate(q, m, &gm, &gops, &n_gops)) != QCAL_OK)
                goto fail;
            /* the candidates: the ops qdq quantized (an op that only reads a quantized tensor,
             * not quantized itself, has nothing --exclude could take back) */
            for (int64_t i = 0; i < qrep.n_quantized; i++)
                if (!onnx_name_put(&qset, qrep.quantized[i])) {
                    st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
                    goto fail;
                }
            for (int64_t i = 0; i < n_gops; i++)
                n_named += gops[i].name[0] && name_in(&qset, gops[i].name);
            R.n_ops = n_named;
            hi = n_named;
        }
        st = session(e, q, opt, &qs);
        qcal_onnx_model_destroy(&q);
        if (st != QCAL_OK)
            goto fail;
        cand fc = {fs, NULL}, qc = {qs, NULL};
        st = pass(&r, &fc, &qc, 1, opt->max_samples, sums, "keep-float search");
        qcal_engine_session_destroy(&qs);
        if (st != QCAL_OK)
            goto fail;
        R.checks++;
        double sq = total_sqnr(&r, sums, 0), accf, accq;
        label_metric(&r, sums, 1, 0, &accf, &accq);
        if (target_holds(target, sq, accf, accq)) {
            hi = k;
            hi_measured = true;
            hi_sqnr = sq, hi_accf = accf, hi_accq = accq;
        } else {
            lo = k;
        }
        if (!order && hi > lo + 1) {
            /* rank the named ops, most sensitive first */
            only = calloc((size_t)n_gops, sizeof *only);
            rk = calloc((size_t)n_gops, sizeof *rk);
            order = calloc((size_t)n_gops, sizeof *order);
            if (!only || !rk || !order) {
                st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
                goto fail;
            }
            double all_on;
            if ((st = gated_session(e, gm, opt, &gs)) != QCAL_OK || (st = check_outputs(&r, gs, "the gated model")) != QCAL_OK)
                goto fail;
            qcal_onnx_model_destroy(&gm);
            r.n_gates = n_gops;
            uint8_t *want = calloc((size_t)n_gops + 1, 1);
            if (!want) {
                st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
                goto fail;
            }
            for (int64_t i = 0; i < n_gops; i++)
                want[i] = gops[i].name[0] && name_in(&qset, gops[i].name);
            st = per_op(&r, gs, n_gops, opt->sensitivity_samples > 0 ? opt->sensitivity_samples : 8, false, want,
                        only, NULL, &all_on);
            free(want);
            if (st != QCAL_OK)
                goto fail;
            qcal_engine_session_destroy(&gs);
            for (int64_t i = 0; i < n_gops; i++)
                rk[i] = (rank_item){only[i], i};
            qsort(rk, (size_t)n_gops, sizeof *rk, rank_cmp);
            int64_t j = 0;
            for (int64_t i = 0; i < n_gops; i++)
                if (gops[rk[i].i].name[0] && name_in(&qset, gops[rk[i].i].name))
                    order[j++] = gops[rk[i].i].name;
        }
        if (hi - lo <= 1) {
            if (hi_measured || lo >= n_named) {
                if (!hi_measured) /* even every named op float fails: its figures */
                    hi_sqnr = sq, hi_accf = accf, hi_accq = accq;
                break;
            }
            k = hi; /* every op float: measured for its figures */
            continue;
        }
        k = lo + (hi - lo) / 2;
    }
    k = hi_measured ? hi : n_named;
    R.met = hi_measured;
    R.sqnr_db = hi_sqnr;
    R.acc_float = hi_accf;
    R.acc_quant = hi_accq;
    R.float_ops = calloc((size_t)(k ? k : 1), sizeof *R.float_ops);
    if (!R.float_ops) {
        st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
        goto fail;
    }
    for (int64_t i = 0; i < k; i++) {
        if (!(R.float_ops[i] = qcal_strdup(order[i]))) {
            st = qcal_error(QCAL_ERR_NO_MEMORY, "out of memory");
            goto fail;
        }
        R.n_float = i + 1;
    }
    R.runs = r.runs;
    R.seconds = engine_now_s() - t0;
    *res = R;
    memset(&R, 0, sizeof R);
fail:
    qcal_accuracy_keep_float_result_free(&R);
    free(only), free(rk), free(order), free(sums);
    qcal_onnx_qdq_report_free(&qrep);
    free(qset.v);
    qcal_onnx_gate_ops_free(&gops, n_gops);
    qcal_onnx_model_destroy(&gm);
    qcal_onnx_model_destroy(&q);
    qcal_engine_session_destroy(&gs);
    qcal_engine_session_destroy(&fs);
    runner_free(&r);
    return st;
}
