/* Weight comparison (quantize-dequantize with an observer's qparams, then metrics) and the
 * per-fqn streaming activation comparison. Contracts in include/qcal/numeric.h. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"
#include "qcal/numeric.h"
#include "qcal/quantize.h"
#include "qcal/weights.h"

#define CHUNK 65536   /* elements quantize-dequantized at a time */

void qcal_numeric_weights_options_default(qcal_numeric_weights_options *opt)
{
    memset(opt, 0, sizeof *opt);
    opt->observer = QCAL_OBSERVER_PER_CHANNEL_MINMAX;
    opt->dtype = QCAL_QINT8;
    opt->qscheme = QCAL_PER_CHANNEL_SYMMETRIC;
    opt->reduce_range = false;
}

static bool per_channel_kind(qcal_observer_kind k)
{
    return k == QCAL_OBSERVER_PER_CHANNEL_MINMAX ||
           k == QCAL_OBSERVER_MOVING_AVERAGE_PER_CHANNEL_MINMAX;
}

static qcal_qscheme per_tensor_version(qcal_qscheme q)
{
    switch (q) {
    case QCAL_PER_CHANNEL_AFFINE:
    case QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS:
        return QCAL_PER_TENSOR_AFFINE;
    case QCAL_PER_CHANNEL_SYMMETRIC:
        return QCAL_PER_TENSOR_SYMMETRIC;
    default:
        return q;
    }
}

/* Quantize-dequantizes src[0..n) with one (scale, zp) in chunks and accumulates metrics. */
static qcal_status qdq_accumulate(const float *src, int64_t n, float scale, int32_t zp,
                                  qcal_dtype dtype, void *qbuf, float *dq, qcal_numeric_metric_acc *acc)
{
    qcal_qparams qp;
    qcal_status st0 = qcal_qparams_per_tensor(&qp, dtype, scale, zp);
    if (st0 != QCAL_OK)
        return st0;
    for (int64_t i = 0; i < n; i += CHUNK) {
        int64_t m = n - i < CHUNK ? n - i : CHUNK;
        qcal_tensor t;
        qcal_tensor_mut d;
        qcal_status st = qcal_tensor_init(&t, src + i, 1, &m);
        if (st == QCAL_OK)
            st = qcal_tensor_mut_init(&d, dq, 1, &m);
        if (st == QCAL_OK)
            st = qcal_quantize(&t, &qp, qbuf);
        if (st == QCAL_OK)
            st = qcal_dequantize(qbuf, &qp, &d);
        if (st == QCAL_OK)
            st = qcal_numeric_metric_acc_update(acc, src + i, dq, m);
        if (st != QCAL_OK)
            return st;
    }
    return QCAL_OK;
}

qcal_status qcal_numeric_weights_compare(const qcal_numeric_weights_options *opt, const char *name,
                                        const qcal_tensor *w, qcal_numeric_weight_result *out)
{
    if (!opt || !w || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_numeric_weights_compare: NULL argument");
    if (!name)
        name = "";
    int64_t numel;
    qcal_status st = qcal_tensor_numel(w, &numel);
    if (st != QCAL_OK)
        return st;
    if (numel == 0)
        return qcal_error(QCAL_ERR_EMPTY, "weight '%s' has no elements", name);
    if (!w->data)
        return qcal_error(QCAL_ERR_INVALID_ARG, "weight '%s' has no data", name);
    if (opt->dtype == QCAL_QINT32)
        return qcal_error(QCAL_ERR_UNSUPPORTED, "weight comparison supports quint8 and qint8, not qint32");
    bool per_channel = per_channel_kind(opt->observer) && w->ndim >= 2;
    qcal_observer_config cfg;
    qcal_observer_config_default(&cfg, per_channel ? opt->observer
                                                   : (per_channel_kind(opt->observer)
                                                          ? QCAL_OBSERVER_MINMAX
                                                          : opt->observer));
    cfg.q.dtype = opt->dtype;
    cfg.q.qscheme = per_channel ? opt->qscheme : per_tensor_version(opt->qscheme);
    if (per_channel && !qcal_qscheme_is_per_channel(cfg.q.qscheme))
        cfg.q.qscheme = cfg.q.qscheme == QCAL_PER_TENSOR_SYMMETRIC ? QCAL_PER_CHANNEL_SYMMETRIC
                                                                  : QCAL_PER_CHANNEL_AFFINE;
    if (cfg.q.qscheme == QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS)
        return qcal_error(QCAL_ERR_UNSUPPORTED,
                          "weight comparison does not support per_channel_affine_float_qparams");
    cfg.q.reduce_range = opt->reduce_range;
    cfg.axis = 0;
    float *dq = NULL, *scales = NULL;
    int32_t *zps = NULL;
    void *qbuf = NULL;
    int64_t channels = per_channel ? w->shape[0] : 1;
    qcal_numeric_weight_result r;
    memset(&r, 0, sizeof r);
    /* statistics first: a tensor without any finite value cannot be quantized */
    qcal_numeric_stats_init(&r.stats);
    st = qcal_numeric_stats_update(&r.stats, w->data, numel);
    if (st != QCAL_OK)
        goto done;
    if (r.stats.count == 0) {
        st = qcal_error(QCAL_ERR_NONFINITE, "weight '%s' has no finite value (%llu NaN/Inf)",
                        name, (unsigned long long)r.stats.nonfinite);
        goto done;
    }
    dq = qcal_malloc(CHUNK * sizeof *dq);
    qbuf = qcal_malloc(CHUNK * 4);
    scales = qcal_malloc((size_t)channels * sizeof *scales);
    zps = qcal_malloc((size_t)channels * sizeof *zps);
    if (!dq || !qbuf || !scales || !zps) {
        st = QCAL_ERR_NO_MEMORY;
        goto done;
    }
    /* the qparams only (the weight quantizer, qcal/weights.h); the codes are made chunk by
     * chunk below with the metrics */
    qcal_weights_options wo;
    qcal_weights_options_default(&wo);
    wo.observer = cfg.kind;
    wo.q = cfg.q;
    wo.axis = cfg.axis;
    st = qcal_weights_quantize(&wo, w, NULL, scales, zps, NULL);
    /* QCAL_NO_DATA here: some channel had no finite value (the tensor has some, checked
     * above); that channel got scale 1, zero-point 0 and contributes no compared pair */
    if (st == QCAL_NO_DATA)
        st = QCAL_OK;
    if (st != QCAL_OK)
        goto done;
    /* axis 0 of a C-contiguous tensor: channel c is the contiguous slab [c*inner, (c+1)*inner),
     * so per-tensor quantize of each slab equals torch.quantize_per_channel(axis=0). */
    int64_t inner = numel / channels;
    qcal_numeric_metric_acc acc;
    qcal_numeric_metric_acc_init(&acc);
    r.scale_min = INFINITY;
    r.scale_max = -INFINITY;
    for (int64_t c = 0; c < channels; c++) {
        int64_t before = acc.count;
        float sc = scales[c];
        st = qdq_accumulate(w->data + c * inner, inner, sc, zps[c],
                            opt->dtype, qbuf, dq, &acc);
        if (st != QCAL_OK)
            goto done;
        if (acc.count == before)
            continue;   /* channel without finite values: its placeholder scale is no range */
        r.scale_min = fminf(r.scale_min, sc);
        r.scale_max = fmaxf(r.scale_max, sc);
    }
    st = qcal_numeric_metric_acc_result(&acc, &r.m);
    if (st != QCAL_OK)
        goto done;
    qcal_numeric_stats_std(&r.stats, &r.std);
    snprintf(r.name, sizeof r.name, "%s", name);
    r.ndim = w->ndim;
    memcpy(r.shape, w->shape, sizeof r.shape);
    r.channels = channels;
    /* FP8: stored symmetric whatever was asked (qcal/qparams.h) */
    r.qscheme = !qcal_dtype_is_float8(opt->dtype) ? cfg.q.qscheme
                : per_channel                     ? QCAL_PER_CHANNEL_SYMMETRIC
                                                  : QCAL_PER_TENSOR_SYMMETRIC;
    *out = r;
done:
    free(scales);
    free(zps);
    free(dq);
    free(qbuf);
    return st;
}

/* ---- activation comparison ------------------------------------------------------------ */

typedef struct act_entry {
    char *fqn;
    int64_t steps;
    qcal_numeric_metric_acc acc;
    qcal_numeric_stats stats;
} act_entry;

struct qcal_numeric_act_compare {
    qcal_numeric_act_mode mode;
    act_entry *e;
    int64_t n, cap;
};

qcal_status qcal_numeric_act_compare_create(qcal_numeric_act_mode mode, qcal_numeric_act_compare **out)
{
    if (!out || (mode != QCAL_NUMERIC_ACT_PROPAGATE && mode != QCAL_NUMERIC_ACT_SHADOW))
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_numeric_act_compare_create: bad mode %d", (int)mode);
    qcal_numeric_act_compare *ac = qcal_calloc(1, sizeof *ac);
    if (!ac)
        return QCAL_ERR_NO_MEMORY;
    ac->mode = mode;
    *out = ac;
    return QCAL_OK;
}

void qcal_numeric_act_compare_destroy(qcal_numeric_act_compare **acp)
{
    if (!acp || !*acp)
        return;
    qcal_numeric_act_compare *ac = *acp;
    for (int64_t i = 0; i < ac->n; i++)
        free(ac->e[i].fqn);
    free(ac->e);
    free(ac);
    *acp = NULL;
}

qcal_status qcal_numeric_act_compare_mode(const qcal_numeric_act_compare *ac, qcal_numeric_act_mode *mode)
{
    if (!ac || !mode)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_numeric_act_compare_mode: NULL argument");
    *mode = ac->mode;
    return QCAL_OK;
}

qcal_status qcal_numeric_act_compare_add(qcal_numeric_act_compare *ac, const char *fqn, const qcal_tensor *f,
                                 const qcal_tensor *q)
{
    if (!ac || !fqn || !f || !q)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_numeric_act_compare_add: NULL argument");
    int64_t nf, nq;
    qcal_status st = qcal_tensor_numel(f, &nf);
    if (st == QCAL_OK)
        st = qcal_tensor_numel(q, &nq);
    if (st != QCAL_OK)
        return st;
    if (f->ndim != q->ndim || nf != nq ||
        memcmp(f->shape, q->shape, (size_t)f->ndim * sizeof f->shape[0]))
        return qcal_error(QCAL_ERR_MISMATCH, "'%s': float output (%d-d, %lld elements) and "
                          "quantized output (%d-d, %lld elements) differ in shape",
                          fqn, f->ndim, (long long)nf, q->ndim, (long long)nq);
    if (nf == 0)
        return qcal_error(QCAL_ERR_EMPTY, "'%s': empty activation", fqn);
    if (!f->data || !q->data)
        return qcal_error(QCAL_ERR_INVALID_ARG, "'%s': tensor without data", fqn);
    int64_t i = 0;
    while (i < ac->n && strcmp(ac->e[i].fqn, fqn))
        i++;
    act_entry tmp;
    memset(&tmp, 0, sizeof tmp);
    act_entry *e = i < ac->n ? &ac->e[i] : &tmp;
    if (e == &tmp) {
        qcal_numeric_metric_acc_init(&tmp.acc);
        qcal_numeric_stats_init(&tmp.stats);
    }
    /* compute into copies so a failure leaves the entry unchanged */
    qcal_numeric_metric_acc acc = e->acc;
    qcal_numeric_stats stats = e->stats;
    st = qcal_numeric_metric_acc_update(&acc, f->data, q->data, nf);
    if (st == QCAL_OK)
        st = qcal_numeric_stats_update(&stats, f->data, nf);
    if (st != QCAL_OK)
        return st;
    if (e == &tmp) {
        if (ac->n == ac->cap) {
            int64_t nc = ac->cap ? ac->cap * 2 : 16;
            act_entry *ne = realloc(ac->e, (size_t)nc * sizeof *ne);
            if (!ne)
                return qcal_error(QCAL_ERR_NO_MEMORY, "cannot grow to %lld entries", (long long)nc);
            ac->e = ne;
            ac->cap = nc;
        }
        tmp.fqn = strdup(fqn);
        if (!tmp.fqn)
            return qcal_error(QCAL_ERR_NO_MEMORY, "cannot copy fqn");
        ac->e[ac->n++] = tmp;
        e = &ac->e[ac->n - 1];
    }
    e->acc = acc;
    e->stats = stats;
    e->steps++;
    return QCAL_OK;
}

qcal_status qcal_numeric_act_compare_count(const qcal_numeric_act_compare *ac, int64_t *n)
{
    if (!ac || !n)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_numeric_act_compare_count: NULL argument");
    *n = ac->n;
    return QCAL_OK;
}

qcal_status qcal_numeric_act_compare_get(const qcal_numeric_act_compare *ac, int64_t i, const char **fqn,
                                 int64_t *steps, qcal_numeric_metrics *m, qcal_numeric_stats *float_stats)
{
    if (!ac || i < 0 || i >= ac->n)
        return qcal_error(QCAL_ERR_INVALID_ARG, "entry %lld out of range [0, %lld)", (long long)i,
                          ac ? (long long)ac->n : 0LL);
    qcal_numeric_metrics mm;
    qcal_status st = qcal_numeric_metric_acc_result(&ac->e[i].acc, &mm);
    if (st != QCAL_OK)
        return st;
    if (fqn)
        *fqn = ac->e[i].fqn;
    if (steps)
        *steps = ac->e[i].steps;
    if (m)
        *m = mm;
    if (float_stats)
        *float_stats = ac->e[i].stats;
    return QCAL_OK;
}
