/* Observer evaluation: every candidate observer on every tensor, the exact SQNR and
 * clipped fraction of each one's fake-quantization, and a recommendation per tensor
 * (include/qcal/numeric_eval.h). The HTML report is in numeric/report.c. */
#include <errno.h>
#include <fnmatch.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/json.h"
#include "io/text.h"
#include "qcal/atomic_file.h"
#include "core/internal.h"
#include "numeric/evaluate_impl.h"
#include "observers/minmax_kernels.h"
#include "qcal/fakequant.h"
#include "qcal/numeric.h"

/* Candidate kinds in the order of simplicity (qcal_numeric_eval_simplicity). */
static const qcal_observer_kind simplicity_order[QCAL_OBSERVER_KIND_COUNT] = {
    QCAL_OBSERVER_MINMAX,
    QCAL_OBSERVER_PER_CHANNEL_MINMAX,
    QCAL_OBSERVER_MOVING_AVERAGE_MINMAX,
    QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX,
    QCAL_OBSERVER_PERCENTILE,
    QCAL_OBSERVER_HISTOGRAM,
    QCAL_OBSERVER_MSE,
    QCAL_OBSERVER_ENTROPY,
};

int qcal_numeric_eval_simplicity(qcal_observer_kind kind)
{
    for (int i = 0; i < QCAL_OBSERVER_KIND_COUNT; i++)
        if (simplicity_order[i] == kind)
            return i;
    return QCAL_OBSERVER_KIND_COUNT;
}

static bool kind_is_per_channel(qcal_observer_kind k)
{
    return k == QCAL_OBSERVER_PER_CHANNEL_MINMAX ||
           k == QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX;
}

void qcal_numeric_eval_options_default(qcal_numeric_eval_options *opt)
{
    if (!opt)
        return;
    memset(opt, 0, sizeof *opt);
    opt->kinds = 0;
    opt->min_sqnr_db = NAN;
    qcal_qconfig_default(&opt->activation_q);
    qcal_qconfig_default(&opt->weight_q);
    opt->weight_q.dtype = QCAL_QINT8;
    opt->weight_q.qscheme = QCAL_PER_CHANNEL_SYMMETRIC;
    opt->bins = 2048;
    opt->report_bins = 160;
}

void qcal_numeric_eval_report_options_default(qcal_numeric_eval_report_options *opt)
{
    if (!opt)
        return;
    opt->title = "qcal calibration report";
    opt->source = NULL;
}

void qcal_numeric_eval_cand_free(eval_cand *c)
{
    qcal_observer_destroy(&c->obs);
    qcal_qparams_free(&c->qp);
    free(c->scale);
    free(c->zp);
    free(c->mn);
    free(c->mx);
    memset(c, 0, sizeof *c);
}

void qcal_numeric_eval_entry_free(eval_entry *e)
{
    for (int i = 0; i < e->nc; i++)
        qcal_numeric_eval_cand_free(&e->c[i]);
    free(e->name);
    free(e->hist);
    memset(e, 0, sizeof *e);
}

void qcal_numeric_eval_destroy(qcal_numeric_eval **ev)
{
    if (!ev || !*ev)
        return;
    for (int64_t i = 0; i < (*ev)->n; i++)
        qcal_numeric_eval_entry_free(&(*ev)->e[i]);
    free((*ev)->e);
    free((*ev)->source);
    free(*ev);
    *ev = NULL;
}

qcal_status qcal_numeric_eval_create(const qcal_numeric_eval_options *opt,
                                     qcal_numeric_eval **out)
{
    if (!out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "evaluation output is NULL");
    qcal_numeric_eval_options o;
    if (opt)
        o = *opt;
    else
        qcal_numeric_eval_options_default(&o);
    if (o.kinds >> QCAL_OBSERVER_KIND_COUNT)
        return qcal_error(QCAL_ERR_INVALID_ARG, "kinds mask 0x%x names unknown observer kinds",
                          (unsigned)o.kinds);
    if (o.bins < 256 || o.bins > (1 << 20))
        return qcal_error(QCAL_ERR_INVALID_ARG, "bins %d is outside [256, 1048576]", (int)o.bins);
    if (o.report_bins < 8 || o.report_bins > 4096)
        return qcal_error(QCAL_ERR_INVALID_ARG, "report_bins %d is outside [8, 4096]",
                          (int)o.report_bins);
    if (!(isnan(o.min_sqnr_db) || isfinite(o.min_sqnr_db)))
        return qcal_error(QCAL_ERR_INVALID_ARG, "min_sqnr_db must be a finite number or NaN");
    int64_t qmin, qmax;
    qcal_status st = qcal_qconfig_range(&o.activation_q, &qmin, &qmax);
    if (st < 0)
        return st;
    if (qcal_qscheme_is_per_channel(o.activation_q.qscheme))
        return qcal_error(QCAL_ERR_INVALID_ARG, "the activation qconfig must be per tensor, not %s",
                          qcal_qscheme_name(o.activation_q.qscheme));
    if ((st = qcal_qconfig_range(&o.weight_q, &qmin, &qmax)) < 0)
        return st;
    if (o.weight_q.qscheme == QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS)
        return qcal_error(QCAL_ERR_INVALID_ARG,
                          "the weight qconfig cannot use per_channel_affine_float_qparams");
    qcal_numeric_eval *ev = qcal_calloc(1, sizeof *ev);
    if (!ev)
        return QCAL_ERR_NO_MEMORY;
    ev->opt = o;
    *out = ev;
    return QCAL_OK;
}

bool qcal_numeric_eval_cand_config(const qcal_numeric_eval *ev, qcal_calib_role role,
                                   qcal_observer_kind k, qcal_observer_config *cfg)
{
    if (ev->opt.kinds && !(ev->opt.kinds & (1u << k)))
        return false;
    qcal_observer_config_default(cfg, k);
    cfg->bins = ev->opt.bins;
    if (role == QCAL_CALIB_ROLE_ACTIVATION) {
        if (kind_is_per_channel(k))
            return false;
        cfg->q = ev->opt.activation_q;
        return true;
    }
    cfg->q = ev->opt.weight_q;
    bool sym = ev->opt.weight_q.qscheme == QCAL_PER_CHANNEL_SYMMETRIC ||
               ev->opt.weight_q.qscheme == QCAL_PER_TENSOR_SYMMETRIC;
    if (kind_is_per_channel(k)) {
        cfg->q.qscheme = sym ? QCAL_PER_CHANNEL_SYMMETRIC : QCAL_PER_CHANNEL_AFFINE;
        cfg->axis = 0;
    } else {
        cfg->q.qscheme = sym ? QCAL_PER_TENSOR_SYMMETRIC : QCAL_PER_TENSOR_AFFINE;
    }
    return true;
}

static eval_entry *find_entry(const qcal_numeric_eval *ev, const char *name, qcal_calib_role role)
{
    for (int64_t i = 0; i < ev->n; i++)
        if (ev->e[i].role == role && !strcmp(ev->e[i].name, name))
            return &ev->e[i];
    return NULL;
}

static qcal_status new_entry(qcal_numeric_eval *ev, const char *name, qcal_calib_role role,
                             eval_entry **out)
{
    if (ev->n == ev->cap) {
        int64_t cap = ev->cap ? ev->cap * 2 : 16;
        eval_entry *e = realloc(ev->e, (size_t)cap * sizeof *e);
        if (!e)
            return qcal_error(QCAL_ERR_NO_MEMORY, "cannot grow the evaluation to %lld tensors",
                              (long long)cap);
        ev->e = e;
        ev->cap = cap;
    }
    eval_entry *e = &ev->e[ev->n];
    memset(e, 0, sizeof *e);
    size_t len = strlen(name);
    e->name = qcal_malloc(len + 1);
    if (!e->name)
        return QCAL_ERR_NO_MEMORY;
    memcpy(e->name, name, len + 1);
    e->role = role;
    e->dmin = INFINITY;
    e->dmax = -INFINITY;
    qcal_status st = QCAL_OK;
    for (int i = 0; i < QCAL_OBSERVER_KIND_COUNT && st >= 0; i++) {
        qcal_observer_config cfg;
        if (!qcal_numeric_eval_cand_config(ev, role, simplicity_order[i], &cfg))
            continue;
        eval_cand *c = &e->c[e->nc];
        c->kind = simplicity_order[i];
        st = qcal_observer_create(&cfg, &c->obs);
        if (st >= 0)
            e->nc++;
    }
    if (st >= 0 && e->nc == 0)
        st = qcal_error(QCAL_ERR_INVALID_ARG, "no candidate observer applies to %s '%s'",
                        qcal_calib_role_name(role), name);
    if (st < 0) {
        qcal_numeric_eval_entry_free(e);
        return st;
    }
    ev->n++;
    *out = e;
    return QCAL_OK;
}

qcal_status qcal_numeric_eval_observe(qcal_numeric_eval *ev, const char *name,
                                      qcal_calib_role role, const qcal_tensor *x)
{
    if (!ev || !name || !x)
        return qcal_error(QCAL_ERR_INVALID_ARG, "evaluation, name or tensor is NULL");
    if ((unsigned)role >= QCAL_CALIB_ROLE_COUNT)
        return qcal_error(QCAL_ERR_INVALID_ARG, "unknown role %d", (int)role);
    if (ev->finished)
        return qcal_error(QCAL_ERR_STATE, ev->loaded ? "a loaded evaluation state cannot observe "
                          "more batches" : "observe after qcal_numeric_eval_finish");
    int64_t n;
    qcal_status st = qcal_tensor_numel(x, &n);
    if (st < 0)
        return st;
    eval_entry *e = find_entry(ev, name, role);
    if (!e && (st = new_entry(ev, name, role, &e)) < 0)
        return st;
    /* Every candidate must accept the batch, or none sees it. */
    for (int i = 0; i < e->nc; i++) {
        st = qcal_observer_update(e->c[i].obs, x);
        if (st < 0) {
            if (i > 0)
                return qcal_error(QCAL_ERR_STATE, "%s '%s': the %s observer refused a batch the "
                                  "others took (%s); the evaluation is inconsistent",
                                  qcal_calib_role_name(role), name,
                                  qcal_observer_kind_name(e->c[i].kind), qcal_last_error());
            return st;
        }
    }
    float mn, mx;
    uint64_t nf = 0;
    qcal_f32_minmax(x->data, n, &mn, &mx, &nf);
    if (mn < e->dmin)
        e->dmin = mn;
    if (mx > e->dmax)
        e->dmax = mx;
    e->nonfinite += nf;
    e->count += (uint64_t)n - nf;
    return QCAL_OK;
}

qcal_status qcal_numeric_eval_cand_prepare(const qcal_numeric_eval *ev, eval_cand *c)
{
    (void)ev;
    int64_t ch = 0;
    qcal_status st = qcal_observer_channels(c->obs, &ch);
    if (st < 0)
        return st;
    if (ch < 1)
        ch = 1;
    c->channels = ch;
    c->scale = qcal_calloc((size_t)ch, sizeof(float));
    c->zp = qcal_calloc((size_t)ch, sizeof(int32_t));
    c->mn = qcal_calloc((size_t)ch, sizeof(float));
    c->mx = qcal_calloc((size_t)ch, sizeof(float));
    if (!c->scale || !c->zp || !c->mn || !c->mx)
        return QCAL_ERR_NO_MEMORY;
    int64_t got = 0;
    st = qcal_observer_qparams(c->obs, &c->qp);
    if (st < 0)
        return st;
    for (int64_t k = 0; k < ch && k < c->qp.channels; k++) {
        c->scale[k] = qcal_qparams_scale_at(&c->qp, k);
        c->zp[k] = qcal_qparams_zero_point_at(&c->qp, k);
    }
    st = qcal_observer_qrange(c->obs, ch, c->mn, c->mx, &got);
    if (st < 0)
        return st;
    const qcal_observer_config *cfg = qcal_observer_get_config(c->obs);
    if ((st = qcal_qconfig_range(&cfg->q, &c->qmin, &c->qmax)) < 0)
        return st;
    qcal_numeric_metric_acc_init(&c->acc);
    return QCAL_OK;
}

qcal_status qcal_numeric_eval_finish(qcal_numeric_eval *ev)
{
    if (!ev)
        return qcal_error(QCAL_ERR_INVALID_ARG, "evaluation is NULL");
    if (ev->finished)
        return QCAL_OK;
    for (int64_t i = 0; i < ev->n; i++) {
        eval_entry *e = &ev->e[i];
        for (int j = 0; j < e->nc; j++) {
            qcal_status st = qcal_numeric_eval_cand_prepare(ev, &e->c[j]);
            if (st < 0)
                return st;
        }
        size_t nb = (size_t)ev->opt.report_bins;
        e->hist = qcal_calloc(nb, sizeof(uint64_t));
        if (!e->hist)
            return QCAL_ERR_NO_MEMORY;
        if (ev->opt.progress)
            ev->opt.progress(ev->opt.progress_user, i + 1, ev->n, e->name);
    }
    ev->finished = true;
    return QCAL_OK;
}

/* Fake-quantizes x with candidate c's qparams into dst / mask (numel(x) each). */
static qcal_status cand_fakequant(const eval_cand *c, const qcal_tensor *x, float *dst,
                                  uint8_t *mask)
{
    qcal_tensor_mut y;
    qcal_status st = qcal_tensor_mut_init(&y, dst, x->ndim, x->shape);
    return st != QCAL_OK ? st : qcal_fakequant_forward(x, &c->qp, &y, mask);
}

qcal_status qcal_numeric_eval_score(qcal_numeric_eval *ev, const char *name,
                                    qcal_calib_role role, const qcal_tensor *x)
{
    if (!ev || !name || !x)
        return qcal_error(QCAL_ERR_INVALID_ARG, "evaluation, name or tensor is NULL");
    if (!ev->finished)
        return qcal_error(QCAL_ERR_STATE, "score before qcal_numeric_eval_finish");
    if (ev->loaded)
        return qcal_error(QCAL_ERR_STATE, "a loaded evaluation state holds results, not data: it "
                          "cannot score more batches");
    eval_entry *e = find_entry(ev, name, role);
    if (!e)
        return qcal_error(QCAL_ERR_NOT_FOUND, "%s '%s' was not observed in pass 1",
                          qcal_calib_role_name(role), name);
    int64_t n;
    qcal_status st = qcal_tensor_numel(x, &n);
    if (st < 0)
        return st;
    if (n == 0)
        return qcal_error(QCAL_ERR_EMPTY, "cannot score an empty tensor");
    size_t bytes;
    if (!qcal_mul_size((size_t)n, sizeof(float), &bytes))
        return qcal_error(QCAL_ERR_OVERFLOW, "tensor too large");
    float *fq = qcal_malloc(bytes);
    uint8_t *mask = qcal_malloc((size_t)n);
    if (!fq || !mask) {
        free(fq);
        free(mask);
        return QCAL_ERR_NO_MEMORY;
    }
    const float *xd = x->data;
    for (int j = 0; j < e->nc && st >= 0; j++) {
        eval_cand *c = &e->c[j];
        st = cand_fakequant(c, x, fq, mask);
        if (st < 0)
            break;
        st = qcal_numeric_metric_acc_update(&c->acc, xd, fq, n);
        c->sqnr_done = false;
        uint64_t clipped = 0;
        for (int64_t i = 0; i < n; i++)
            clipped += (uint64_t)(!mask[i] & (isfinite(xd[i]) != 0));
        c->clipped += clipped;
    }
    /* The report's histogram of the finite data over [dmin, dmax]. */
    if (st >= 0 && e->dmin <= e->dmax) {
        int64_t nb = ev->opt.report_bins;
        double lo = e->dmin, w = ((double)e->dmax - lo) / (double)nb;
        for (int64_t i = 0; i < n; i++) {
            float v = xd[i];
            if (!isfinite(v))
                continue;
            int64_t b = w > 0 ? (int64_t)(((double)v - lo) / w) : 0;
            if (b >= nb)
                b = nb - 1;
            if (b < 0)
                b = 0;
            e->hist[b]++;
        }
    }
    e->scored = true;
    ev->results_ready = false;
    free(fq);
    free(mask);
    return st;
}

qcal_status qcal_numeric_eval_set_layer_sqnr(qcal_numeric_eval *ev, const char *name,
                                             qcal_calib_role role, double sqnr_db)
{
    if (!ev || !name)
        return qcal_error(QCAL_ERR_INVALID_ARG, "evaluation or name is NULL");
    eval_entry *e = find_entry(ev, name, role);
    if (!e)
        return qcal_error(QCAL_ERR_NOT_FOUND, "%s '%s' is not in the evaluation",
                          qcal_calib_role_name(role), name);
    e->has_layer_sqnr = true;
    e->layer_sqnr = sqnr_db;
    return QCAL_OK;
}

qcal_status qcal_numeric_eval_restrict(qcal_numeric_eval *ev, uint32_t kinds)
{
    if (!ev)
        return qcal_error(QCAL_ERR_INVALID_ARG, "evaluation is NULL");
    if (!ev->finished)
        return qcal_error(QCAL_ERR_STATE, "restrict before qcal_numeric_eval_finish");
    if (kinds >> QCAL_OBSERVER_KIND_COUNT)
        return qcal_error(QCAL_ERR_INVALID_ARG, "kinds mask 0x%x names unknown observer kinds",
                          (unsigned)kinds);
    if (!kinds)
        return QCAL_OK;
    /* Checked before anything changes: every asked kind exists, every tensor keeps one. */
    uint32_t have = 0;
    for (int64_t i = 0; i < ev->n; i++)
        for (int j = 0; j < ev->e[i].nc; j++)
            have |= 1u << ev->e[i].c[j].kind;
    for (int k = 0; k < QCAL_OBSERVER_KIND_COUNT; k++)
        if ((kinds & (1u << k)) && !(have & (1u << k)))
            return qcal_error(QCAL_ERR_NOT_FOUND, "no tensor of the evaluation has a %s candidate",
                              qcal_observer_kind_name((qcal_observer_kind)k));
    for (int64_t i = 0; i < ev->n; i++) {
        int keep = 0;
        for (int j = 0; j < ev->e[i].nc; j++)
            keep += (kinds >> ev->e[i].c[j].kind) & 1u;
        if (!keep)
            return qcal_error(QCAL_ERR_INVALID_ARG, "%s '%s' has none of the selected observers",
                              qcal_calib_role_name(ev->e[i].role), ev->e[i].name);
    }
    for (int64_t i = 0; i < ev->n; i++) {
        eval_entry *e = &ev->e[i];
        int out = 0;
        for (int j = 0; j < e->nc; j++) {
            if ((kinds >> e->c[j].kind) & 1u) {
                if (out != j) {
                    e->c[out] = e->c[j];
                    memset(&e->c[j], 0, sizeof e->c[j]);
                }
                out++;
            } else {
                qcal_numeric_eval_cand_free(&e->c[j]);
            }
        }
        e->nc = out;
    }
    ev->opt.kinds = kinds;
    ev->results_ready = false;
    return QCAL_OK;
}

qcal_status qcal_numeric_eval_set_min_sqnr(qcal_numeric_eval *ev, double min_sqnr_db)
{
    if (!ev)
        return qcal_error(QCAL_ERR_INVALID_ARG, "evaluation is NULL");
    if (!(isnan(min_sqnr_db) || isfinite(min_sqnr_db)))
        return qcal_error(QCAL_ERR_INVALID_ARG, "min_sqnr_db must be a finite number or NaN");
    ev->opt.min_sqnr_db = min_sqnr_db;
    ev->results_ready = false;
    return QCAL_OK;
}

qcal_status qcal_numeric_eval_set_source(qcal_numeric_eval *ev, const char *source)
{
    if (!ev)
        return qcal_error(QCAL_ERR_INVALID_ARG, "evaluation is NULL");
    char *copy = NULL;
    if (source) {
        size_t n = strlen(source);
        if (n > QCAL_NUMERIC_EVAL_SOURCE_MAX)
            return qcal_error(QCAL_ERR_INVALID_ARG, "source label of %zu bytes (at most %d)", n,
                              QCAL_NUMERIC_EVAL_SOURCE_MAX);
        if (!(copy = qcal_malloc(n + 1)))
            return QCAL_ERR_NO_MEMORY;
        memcpy(copy, source, n + 1);
    }
    free(ev->source);
    ev->source = copy;
    return QCAL_OK;
}

const char *qcal_numeric_eval_source(const qcal_numeric_eval *ev)
{
    return ev ? ev->source : NULL;
}

static int entry_cmp(const void *a, const void *b)
{
    const eval_entry *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : (int)x->role - (int)y->role;
}

/* Sorts the entries and computes the public results (once). Called by the const readers:
 * a cache filled behind a const handle (pass 2 has no end call to do it in). Not
 * synchronised: the header asks that the first read not race another call. */
static qcal_status finalize(const qcal_numeric_eval *cev)
{
    qcal_numeric_eval *ev = (qcal_numeric_eval *)cev;
    if (!ev->finished)
        return qcal_error(QCAL_ERR_STATE, "results before qcal_numeric_eval_finish");
    if (ev->results_ready)
        return QCAL_OK;
    for (int64_t i = 0; i < ev->n; i++)
        if (!ev->e[i].scored)
            return qcal_error(QCAL_ERR_STATE, "%s '%s' was not scored (pass 2)",
                              qcal_calib_role_name(ev->e[i].role), ev->e[i].name);
    qsort(ev->e, (size_t)ev->n, sizeof *ev->e, entry_cmp);
    for (int64_t i = 0; i < ev->n; i++) {
        eval_entry *e = &ev->e[i];
        int best = -1, simplest_ok = -1;
        for (int j = 0; j < e->nc; j++) {
            eval_cand *c = &e->c[j];
            qcal_numeric_metrics m;
            if (!c->sqnr_done) {   /* once: a loaded candidate has its SQNR, not the data */
                c->sqnr = qcal_numeric_metric_acc_result(&c->acc, &m) >= 0 ? m.sqnr_db : NAN;
                qcal_clear_error();
                c->sqnr_done = true;
            }
            const qcal_observer_config *cfg = qcal_observer_get_config(c->obs);
            e->pub[j] = (qcal_numeric_eval_candidate){
                .kind = c->kind,
                .sqnr_db = c->sqnr,
                .clipped = e->count ? (double)c->clipped / (double)e->count : 0.0,
                .channels = c->channels,
                .scale = c->scale,
                .zero_point = c->zp,
                .min_val = c->mn,
                .max_val = c->mx,
                .quant_min = c->qmin,
                .quant_max = c->qmax,
                .dtype = cfg->q.dtype,
                .qscheme = cfg->q.qscheme,
                .axis = cfg->axis,
            };
            /* Candidates are in the order of simplicity: strict > keeps ties simple. NaN
             * (no finite value) never wins. */
            if (!isnan(c->sqnr) && (best < 0 || c->sqnr > e->c[best].sqnr))
                best = j;
            if (simplest_ok < 0 && !isnan(ev->opt.min_sqnr_db) &&
                c->sqnr >= ev->opt.min_sqnr_db)
                simplest_ok = j;
        }
        e->recommended = simplest_ok >= 0 ? simplest_ok : (best >= 0 ? best : 0);
    }
    ev->results_ready = true;
    return QCAL_OK;
}

qcal_status qcal_numeric_eval_count(const qcal_numeric_eval *ev, int64_t *n)
{
    if (!ev || !n)
        return qcal_error(QCAL_ERR_INVALID_ARG, "evaluation or output is NULL");
    *n = ev->n;
    return QCAL_OK;
}

qcal_status qcal_numeric_eval_result(const qcal_numeric_eval *ev, int64_t i,
                                     qcal_numeric_eval_tensor *out)
{
    if (!ev || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "evaluation or output is NULL");
    qcal_status st = finalize(ev);
    if (st < 0)
        return st;
    if (i < 0 || i >= ev->n)
        return qcal_error(QCAL_ERR_INVALID_ARG, "tensor index %lld is outside [0, %lld)",
                          (long long)i, (long long)ev->n);
    const eval_entry *e = &ev->e[i];
    *out = (qcal_numeric_eval_tensor){
        .name = e->name,
        .role = e->role,
        .ncandidates = e->nc,
        .candidates = e->pub,
        .recommended = e->recommended,
        .count = e->count,
        .nonfinite = e->nonfinite,
        .data_min = e->dmin,
        .data_max = e->dmax,
    };
    return QCAL_OK;
}

qcal_status qcal_numeric_eval_observer(const qcal_numeric_eval *ev, int64_t i,
                                       qcal_observer_kind kind, const qcal_observer **out)
{
    if (!ev || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "evaluation or output is NULL");
    if (i < 0 || i >= ev->n)
        return qcal_error(QCAL_ERR_INVALID_ARG, "tensor index %lld is outside [0, %lld)",
                          (long long)i, (long long)ev->n);
    for (int j = 0; j < ev->e[i].nc; j++)
        if (ev->e[i].c[j].kind == kind) {
            *out = ev->e[i].c[j].obs;
            return QCAL_OK;
        }
    return qcal_error(QCAL_ERR_NOT_FOUND, "'%s' has no %s candidate", ev->e[i].name,
                      qcal_observer_kind_name(kind));
}

/* ---- text outputs --------------------------------------------------------------------- */

static void put(qcal_buf *b, const char *s)
{
    qcal_buf_append(b, s, strlen(s));
}

static void putf(qcal_buf *b, const char *fmt, ...) QCAL_PRINTF(2, 3);
static void putf(qcal_buf *b, const char *fmt, ...)
{
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k > 0)
        qcal_buf_append(b, tmp, (size_t)k < sizeof tmp ? (size_t)k : sizeof tmp - 1);
}

static void put_f32(qcal_buf *b, float v)
{
    if (!isfinite(v)) {
        put(b, "null");
        return;
    }
    char tmp[40];
    qcal_fmt_f32(tmp, sizeof tmp, v);
    put(b, tmp);
}

/* SQNR and fractions: shortest decimal that reads back as the same double would be long;
 * 6 significant digits carry every meaningful difference. null when not finite. */
static void put_f64(qcal_buf *b, double v)
{
    if (!isfinite(v))
        put(b, "null");
    else
        putf(b, "%.6g", v);
}

static void put_f32_array(qcal_buf *b, const float *v, int64_t n)
{
    put(b, "[");
    for (int64_t i = 0; i < n; i++) {
        if (i)
            put(b, ", ");
        put_f32(b, v[i]);
    }
    put(b, "]");
}

static void format_json(const qcal_numeric_eval *ev, qcal_buf *b)
{
    put(b, "{\"tensors\": [");
    for (int64_t i = 0; i < ev->n; i++) {
        const eval_entry *e = &ev->e[i];
        put(b, i ? ",\n  {" : "\n  {");
        put(b, "\"name\": ");
        qcal_json_write_str(b, e->name);
        putf(b, ", \"role\": \"%s\", \"recommended\": \"%s\", \"observers\": {",
             qcal_calib_role_name(e->role), qcal_observer_kind_name(e->c[e->recommended].kind));
        for (int j = 0; j < e->nc; j++) {
            const qcal_numeric_eval_candidate *c = &e->pub[j];
            putf(b, "%s\n    \"%s\": {\"sqnr_db\": ", j ? "," : "", qcal_observer_kind_name(c->kind));
            put_f64(b, c->sqnr_db);
            put(b, ", \"scale\": ");
            put_f32_array(b, c->scale, c->channels);
            put(b, ", \"zero_point\": [");
            for (int64_t k = 0; k < c->channels; k++)
                putf(b, "%s%d", k ? ", " : "", (int)c->zero_point[k]);
            put(b, "], \"min\": ");
            put_f32_array(b, c->min_val, c->channels);
            put(b, ", \"max\": ");
            put_f32_array(b, c->max_val, c->channels);
            putf(b, ", \"quant_min\": %lld, \"quant_max\": %lld, \"clipped\": ",
                 (long long)c->quant_min, (long long)c->quant_max);
            put_f64(b, c->clipped);
            putf(b, ", \"dtype\": \"%s\"}", qcal_dtype_name(c->dtype));
        }
        put(b, "}}");
    }
    put(b, ev->n ? "\n]}\n" : "]}\n");
}

/* CSV field: quoted when it holds a comma, quote or line break (RFC 4180). */
static void put_csv_str(qcal_buf *b, const char *s)
{
    if (!strpbrk(s, ",\"\r\n")) {
        put(b, s);
        return;
    }
    put(b, "\"");
    for (const char *p = s; *p; p++) {
        if (*p == '"')
            put(b, "\"");
        qcal_buf_append(b, p, 1);
    }
    put(b, "\"");
}

static void format_csv(const qcal_numeric_eval *ev, qcal_buf *b)
{
    put(b, "name,role,observer,recommended,sqnr_db,clipped,channels,scale,zero_point,min,max,"
           "quant_min,quant_max\n");
    for (int64_t i = 0; i < ev->n; i++) {
        const eval_entry *e = &ev->e[i];
        for (int j = 0; j < e->nc; j++) {
            const qcal_numeric_eval_candidate *c = &e->pub[j];
            put_csv_str(b, e->name);
            putf(b, ",%s,%s,%d,", qcal_calib_role_name(e->role), qcal_observer_kind_name(c->kind),
                 j == e->recommended);
            put_f64(b, c->sqnr_db);
            put(b, ",");
            put_f64(b, c->clipped);
            /* Per-channel arrays: the first channel's values (JSON has every channel). */
            putf(b, ",%lld,", (long long)c->channels);
            put_f32(b, c->scale[0]);
            putf(b, ",%d,", (int)c->zero_point[0]);
            put_f32(b, c->min_val[0]);
            put(b, ",");
            put_f32(b, c->max_val[0]);
            putf(b, ",%lld,%lld\n", (long long)c->quant_min, (long long)c->quant_max);
        }
    }
}

/* Short column titles of the text table. */
static const char *short_kind(qcal_observer_kind k)
{
    switch (k) {
    case QCAL_OBSERVER_MINMAX: return "minmax";
    case QCAL_OBSERVER_MOVING_AVERAGE_MINMAX: return "ma_minmax";
    case QCAL_OBSERVER_PER_CHANNEL_MINMAX: return "pc_minmax";
    case QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX: return "ma_pc_minmax";
    case QCAL_OBSERVER_HISTOGRAM: return "histogram";
    case QCAL_OBSERVER_PERCENTILE: return "percentile";
    case QCAL_OBSERVER_ENTROPY: return "entropy";
    case QCAL_OBSERVER_MSE: return "mse";
    default: return "?";
    }
}

static void format_table(const qcal_numeric_eval *ev, qcal_buf *b)
{
    /* Columns: every kind any tensor has, in the order of simplicity. */
    bool used[QCAL_OBSERVER_KIND_COUNT] = { false };
    size_t namew = 6;
    for (int64_t i = 0; i < ev->n; i++) {
        size_t l = strlen(ev->e[i].name);
        if (l > namew)
            namew = l;
        for (int j = 0; j < ev->e[i].nc; j++)
            used[qcal_numeric_eval_simplicity(ev->e[i].c[j].kind)] = true;
    }
    if (namew > 48)
        namew = 48;
    putf(b, "%-*s  %-10s  %-12s", (int)namew, "tensor", "role", "recommended");
    for (int k = 0; k < QCAL_OBSERVER_KIND_COUNT; k++)
        if (used[k])
            putf(b, "  %12s", short_kind(simplicity_order[k]));
    put(b, "\n");
    for (int64_t i = 0; i < ev->n; i++) {
        const eval_entry *e = &ev->e[i];
        putf(b, "%-*s  %-10s  %-12s", (int)namew, e->name, qcal_calib_role_name(e->role),
             short_kind(e->c[e->recommended].kind));
        for (int k = 0; k < QCAL_OBSERVER_KIND_COUNT; k++) {
            if (!used[k])
                continue;
            int j;
            for (j = 0; j < e->nc && e->c[j].kind != simplicity_order[k]; j++)
                ;
            if (j == e->nc)
                putf(b, "  %12s", "-");
            else if (isfinite(e->pub[j].sqnr_db))
                putf(b, "  %9.2f dB", e->pub[j].sqnr_db);
            else
                putf(b, "  %12s", e->pub[j].sqnr_db > 0 ? "inf" : "n/a");
        }
        put(b, "\n");
    }
    put(b, "SQNR in dB of fake-quantizing each tensor with each observer's qparams; "
           "recommended: highest SQNR, ties to the simpler observer\n");
}

qcal_status qcal_numeric_eval_format_results(const qcal_numeric_eval *ev,
                                             qcal_numeric_eval_format format, char **buf,
                                             size_t *len)
{
    if (!ev || !buf || !len)
        return qcal_error(QCAL_ERR_INVALID_ARG, "evaluation or output is NULL");
    qcal_status st = finalize(ev);
    if (st < 0)
        return st;
    qcal_buf b = { 0 };
    switch (format) {
    case QCAL_NUMERIC_EVAL_TABLE: format_table(ev, &b); break;
    case QCAL_NUMERIC_EVAL_CSV: format_csv(ev, &b); break;
    case QCAL_NUMERIC_EVAL_JSON: format_json(ev, &b); break;
    default: return qcal_error(QCAL_ERR_INVALID_ARG, "unknown format %d", (int)format);
    }
    qcal_buf_append(&b, "", 1);
    if (b.failed) {
        qcal_buf_free(&b);
        return qcal_error(QCAL_ERR_NO_MEMORY, "cannot format the evaluation");
    }
    *buf = (char *)b.data;
    *len = b.len - 1;
    return QCAL_OK;
}

qcal_status qcal_numeric_eval_write_file(const char *path, const void *data, size_t len)
{
    qcal_atomic_file f;
    qcal_status st = qcal_atomic_file_open(&f, path);
    if (st < 0)
        return st;
    if (len && fwrite(data, 1, len, f.fp) != len) {
        int e = errno;
        qcal_atomic_file_abort(&f);
        return qcal_error(QCAL_ERR_IO, "cannot write '%s': %s", path, strerror(e ? e : EIO));
    }
    return qcal_atomic_file_commit(&f);
}

qcal_status qcal_numeric_eval_write_results(const qcal_numeric_eval *ev,
                                            qcal_numeric_eval_format format, const char *path)
{
    if (!path)
        return qcal_error(QCAL_ERR_INVALID_ARG, "path is NULL");
    char *buf = NULL;
    size_t len = 0;
    qcal_status st = qcal_numeric_eval_format_results(ev, format, &buf, &len);
    if (st >= 0)
        st = qcal_numeric_eval_write_file(path, buf, len);
    qcal_free(buf);
    return st;
}

/* ---- rules file ------------------------------------------------------------------------ */

/* The rules-file glob that matches exactly name: fnmatch metacharacters escaped with '\';
 * quoted when it holds a space or '#'. A name holding '"' cannot be quoted (the rules file
 * has no escapes inside quotes): a space or '#' in it becomes '?', and the caller checks
 * that the glob matches no other tensor. */
static void put_glob(qcal_buf *b, const char *name, bool *approximate)
{
    bool quote_needed = strpbrk(name, " \t#") != NULL || name[0] == '\0';
    bool has_quote = strchr(name, '"') != NULL;
    bool quoted = quote_needed && !has_quote;
    *approximate = quote_needed && has_quote;
    if (quoted)
        put(b, "\"");
    for (const char *p = name; *p; p++) {
        if (strchr("*?[]\\", *p)) {
            char t[2] = { '\\', *p };
            qcal_buf_append(b, t, 2);
        } else if (*approximate && strchr(" \t#", *p)) {
            put(b, "?");
        } else {
            qcal_buf_append(b, p, 1);
        }
    }
    if (quoted)
        put(b, "\"");
}

qcal_status qcal_numeric_eval_write_rules(const qcal_numeric_eval *ev, const char *path)
{
    if (!ev || !path)
        return qcal_error(QCAL_ERR_INVALID_ARG, "evaluation or path is NULL");
    qcal_status st = finalize(ev);
    if (st < 0)
        return st;
    qcal_buf b = { 0 };
    put(&b, "# qcal evaluate: every tensor's recommended observer (first match wins)\n");
    for (int64_t i = 0; i < ev->n && st >= 0; i++) {
        const eval_entry *e = &ev->e[i];
        const eval_cand *c = &e->c[e->recommended];
        const qcal_observer_config *cfg = qcal_observer_get_config(c->obs);
        size_t start = b.len;
        bool approx = false;
        put_glob(&b, e->name, &approx);
        if (approx) {
            /* The glob must select this tensor only. */
            char *glob = qcal_malloc(b.len - start + 1);
            if (!glob) {
                st = QCAL_ERR_NO_MEMORY;
                break;
            }
            memcpy(glob, b.data + start, b.len - start);
            glob[b.len - start] = 0;
            for (int64_t k = 0; k < ev->n; k++)
                if (k != i && ev->e[k].role == e->role && fnmatch(glob, ev->e[k].name, 0) == 0)
                    st = qcal_error(QCAL_ERR_UNSUPPORTED, "tensor names '%s' and '%s' cannot be "
                                    "told apart in a rules file (a name with '\"' and a space "
                                    "or '#')", e->name, ev->e[k].name);
            free(glob);
        }
        putf(&b, " %s %s dtype=%s qscheme=%s", qcal_calib_role_name(e->role),
             qcal_observer_kind_name(c->kind), qcal_dtype_name(cfg->q.dtype),
             qcal_qscheme_name(cfg->q.qscheme));
        if (cfg->q.reduce_range)
            put(&b, " reduce_range=true");
        if (cfg->q.custom_range)
            putf(&b, " quant_min=%lld quant_max=%lld", (long long)cfg->q.quant_min,
                 (long long)cfg->q.quant_max);
        if (kind_is_per_channel(c->kind))
            putf(&b, " axis=%d", (int)cfg->axis);
        if (c->kind >= QCAL_OBSERVER_HISTOGRAM)
            putf(&b, " bins=%d", (int)cfg->bins);
        putf(&b, "   # SQNR %.2f dB\n", c->sqnr);
    }
    if (st >= 0 && b.failed)
        st = qcal_error(QCAL_ERR_NO_MEMORY, "cannot format the rules");
    if (st >= 0)
        st = qcal_numeric_eval_write_file(path, b.data, b.len);
    qcal_buf_free(&b);
    return st;
}
