/* Tensor statistics (one-pass stable, Chan's combine) and float-vs-quantized comparison
 * metrics (torch.ao.ns.fx.utils semantics) over the block kernels of the min/max family
 * (observers/minmax_dsp.h) and the numeric family (numeric/metrics_dsp.h).
 *
 * Reduction structure (the determinism contract of include/qcal/numeric.h): the input of
 * one update call is cut into superblocks of QCAL_NUM_SUPER elements; each superblock is
 * reduced by the block kernel over QCAL_NUM_BLOCK-element blocks combined in order; the
 * superblock partials are combined in index order. Threads only decide who computes which
 * superblock, never the order of arithmetic, so any thread count gives the same bits. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "core/cpu.h"
#include "core/internal.h"
#include "numeric/metrics_dsp.h"
#include "observers/minmax_dsp.h"
#include "qcal/numeric.h"
#include "qcal_config.h"

#define QCAL_NUM_BLOCK 4096
#define QCAL_NUM_SUPER 65536

/* Partial statistics of a block: finite count, non-finite count, min/max, mean, m2. */
typedef struct qcal_num_blk {
    int64_t n;
    uint64_t nonfinite;
    float min, max;
    double mean, m2;
} qcal_num_blk;

static inline void blk_empty(qcal_num_blk *b)
{
    memset(b, 0, sizeof *b);
    b->min = INFINITY;
    b->max = -INFINITY;
}

/* Chan et al.: combine (n, mean, m2) of two disjoint sets; a then b. */
static inline void blk_combine(qcal_num_blk *a, const qcal_num_blk *b)
{
    a->nonfinite += b->nonfinite;
    if (b->n == 0)
        return;
    if (a->n == 0) {
        uint64_t nf = a->nonfinite;
        *a = *b;
        a->nonfinite = nf;
        return;
    }
    double na = (double)a->n, nb = (double)b->n, n = na + nb;
    double delta = b->mean - a->mean;
    a->mean += delta * (nb / n);
    a->m2 += b->m2 + delta * delta * (na * nb / n);
    a->n += b->n;
    if (b->min < a->min)
        a->min = b->min;
    if (b->max > a->max)
        a->max = b->max;
}

/* Mean and m2 of the finite values of a block that has some NaN/Inf: in order. */
static void moments_skip(const float *x, int64_t n, int64_t cnt, double *mean, double *m2)
{
    double sum = 0, q = 0;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(x[i]))
            sum += x[i];
    double mu = sum / (double)cnt;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(x[i]))
            continue;
        double d = (double)x[i] - mu;
        q += d * d;
    }
    *mean = mu;
    *m2 = q;
}

static void acc_add(qcal_numeric_metric_acc *d, const qcal_numeric_metric_acc *s)
{
    d->count += s->count;
    d->nonfinite += s->nonfinite;
    d->sxx += s->sxx;
    d->syy += s->syy;
    d->sxy += s->sxy;
    d->sdd += s->sdd;
    if (s->max_abs_err > d->max_abs_err)
        d->max_abs_err = s->max_abs_err;
}

/* ---- superblock drivers --------------------------------------------------------------- */

/* Blocks are handled GROUP at a time (64 KiB): the min/max family gives each block's
 * min/max and non-finite count, then the moments kernel takes the run of full, finite
 * blocks in one call (it interleaves blocks); a block with NaN/Inf or a short last block
 * goes alone. Each block's numbers do not depend on the grouping. */
#define GROUP 4

static void super_stats(const float *x, int64_t n, qcal_num_blk *out)
{
    const qcal_minmax_dsp *mm = qcal_minmax_dsp_get();
    const qcal_metrics_dsp *md = qcal_metrics_dsp_get();
    blk_empty(out);
    for (int64_t g = 0; g < n; g += GROUP * QCAL_NUM_BLOCK) {
        qcal_num_blk b[GROUP];
        int64_t len[GROUP];
        int nb = 0;
        for (int64_t i = g; i < n && nb < GROUP; i += QCAL_NUM_BLOCK, nb++) {
            len[nb] = n - i < QCAL_NUM_BLOCK ? n - i : QCAL_NUM_BLOCK;
            blk_empty(&b[nb]);
            mm->minmax(x + i, len[nb], &b[nb].min, &b[nb].max, &b[nb].nonfinite);
            b[nb].n = (int64_t)((uint64_t)len[nb] - b[nb].nonfinite);
        }
        for (int k = 0; k < nb;) {
            const float *xb = x + g + (int64_t)k * QCAL_NUM_BLOCK;
            int e = k;
            while (e < nb && b[e].nonfinite == 0 && len[e] == QCAL_NUM_BLOCK)
                e++;
            if (e > k) {
                double mean[GROUP], m2[GROUP];
                md->moments(xb, QCAL_NUM_BLOCK, e - k, mean, m2);
                for (int j = k; j < e; j++) {
                    b[j].mean = mean[j - k];
                    b[j].m2 = m2[j - k];
                }
                k = e;
            } else {
                if (b[k].nonfinite == 0)
                    md->moments(xb, len[k], 1, &b[k].mean, &b[k].m2);
                else if (b[k].n > 0)
                    moments_skip(xb, len[k], b[k].n, &b[k].mean, &b[k].m2);
                k++;
            }
        }
        for (int k = 0; k < nb; k++)
            blk_combine(out, &b[k]);
    }
}

static void super_metrics(const float *x, const float *y, int64_t n, qcal_numeric_metric_acc *out)
{
    qcal_f32_pair_metrics_fn f = qcal_metrics_dsp_get()->pair_metrics;
    memset(out, 0, sizeof *out);
    for (int64_t i = 0; i < n; i += QCAL_NUM_BLOCK) {
        int64_t m = n - i < QCAL_NUM_BLOCK ? n - i : QCAL_NUM_BLOCK;
        qcal_numeric_metric_acc b;
        f(x + i, y + i, m, &b);
        acc_add(out, &b);
    }
}

static qcal_status stats_blk(const float *x, int64_t n, qcal_num_blk *out)
{
    int64_t nsb = (n + QCAL_NUM_SUPER - 1) / QCAL_NUM_SUPER;
    int threads = qcal_threads_for(n);
    blk_empty(out);
    if (threads <= 1 || nsb <= 1) {
        for (int64_t s = 0; s < nsb; s++) {
            int64_t off = s * QCAL_NUM_SUPER, m = n - off < QCAL_NUM_SUPER ? n - off : QCAL_NUM_SUPER;
            qcal_num_blk b;
            super_stats(x + off, m, &b);
            blk_combine(out, &b);
        }
        return QCAL_OK;
    }
    qcal_num_blk *part = qcal_malloc((size_t)nsb * sizeof *part);
    if (!part)
        return QCAL_ERR_NO_MEMORY;
#if QCAL_HAVE_OPENMP
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
    for (int64_t s = 0; s < nsb; s++) {
        int64_t off = s * QCAL_NUM_SUPER, m = n - off < QCAL_NUM_SUPER ? n - off : QCAL_NUM_SUPER;
        super_stats(x + off, m, &part[s]);
    }
    for (int64_t s = 0; s < nsb; s++)
        blk_combine(out, &part[s]);
    free(part);
    return QCAL_OK;
}

/* ---- public: statistics ----------------------------------------------------------------- */

qcal_status qcal_numeric_stats_init(qcal_numeric_stats *s)
{
    if (!s)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_numeric_stats_init: NULL");
    memset(s, 0, sizeof *s);
    s->min = INFINITY;
    s->max = -INFINITY;
    return QCAL_OK;
}

static void stats_from_blk(qcal_numeric_stats *s, const qcal_num_blk *b)
{
    s->count = b->n;
    s->nonfinite = b->nonfinite;
    s->min = b->min;
    s->max = b->max;
    s->mean = b->n ? b->mean : 0;
    s->m2 = b->n ? b->m2 : 0;
    s->absmax = b->n ? fmaxf(fabsf(b->min), fabsf(b->max)) : 0.0f;
}

static void blk_from_stats(qcal_num_blk *b, const qcal_numeric_stats *s)
{
    b->n = s->count;
    b->nonfinite = s->nonfinite;
    b->min = s->min;
    b->max = s->max;
    b->mean = s->mean;
    b->m2 = s->m2;
}

qcal_status qcal_numeric_stats_merge(qcal_numeric_stats *dst, const qcal_numeric_stats *src)
{
    if (!dst || !src)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_numeric_stats_merge: NULL argument");
    if (dst->count < 0 || src->count < 0)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_numeric_stats_merge: negative count");
    qcal_num_blk a, b;
    blk_from_stats(&a, dst);
    blk_from_stats(&b, src);
    blk_combine(&a, &b);
    stats_from_blk(dst, &a);
    return QCAL_OK;
}

qcal_status qcal_numeric_stats_update(qcal_numeric_stats *s, const float *x, int64_t n)
{
    if (!s || n < 0 || (n > 0 && !x))
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_numeric_stats_update: bad arguments (n %lld)",
                          (long long)n);
    if (n == 0)
        return QCAL_OK;
    qcal_num_blk b;
    qcal_status st = stats_blk(x, n, &b);
    if (st != QCAL_OK)
        return st;
    qcal_numeric_stats t;
    stats_from_blk(&t, &b);
    return qcal_numeric_stats_merge(s, &t);
}

qcal_status qcal_numeric_stats_std(const qcal_numeric_stats *s, double *std)
{
    if (!s || !std)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_numeric_stats_std: NULL argument");
    *std = s->count > 1 ? sqrt(s->m2 / (double)(s->count - 1)) : 0.0;
    return QCAL_OK;
}

/* ---- public: metrics ------------------------------------------------------------------ */

qcal_status qcal_numeric_metric_acc_init(qcal_numeric_metric_acc *acc)
{
    if (!acc)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_numeric_metric_acc_init: NULL");
    memset(acc, 0, sizeof *acc);
    return QCAL_OK;
}

qcal_status qcal_numeric_metric_acc_merge(qcal_numeric_metric_acc *dst, const qcal_numeric_metric_acc *src)
{
    if (!dst || !src)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_numeric_metric_acc_merge: NULL argument");
    acc_add(dst, src);
    return QCAL_OK;
}

qcal_status qcal_numeric_metric_acc_update(qcal_numeric_metric_acc *acc, const float *x, const float *y,
                                   int64_t n)
{
    if (!acc || n < 0 || (n > 0 && (!x || !y)))
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_numeric_metric_acc_update: bad arguments (n %lld)",
                          (long long)n);
    int64_t nsb = (n + QCAL_NUM_SUPER - 1) / QCAL_NUM_SUPER;
    int threads = qcal_threads_for(n);
    qcal_numeric_metric_acc tot;
    memset(&tot, 0, sizeof tot);
    if (threads <= 1 || nsb <= 1) {
        for (int64_t s = 0; s < nsb; s++) {
            int64_t off = s * QCAL_NUM_SUPER, m = n - off < QCAL_NUM_SUPER ? n - off : QCAL_NUM_SUPER;
            qcal_numeric_metric_acc b;
            super_metrics(x + off, y + off, m, &b);
            acc_add(&tot, &b);
        }
    } else {
        qcal_numeric_metric_acc *part = qcal_malloc((size_t)nsb * sizeof *part);
        if (!part)
            return QCAL_ERR_NO_MEMORY;
#if QCAL_HAVE_OPENMP
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
        for (int64_t s = 0; s < nsb; s++) {
            int64_t off = s * QCAL_NUM_SUPER, m = n - off < QCAL_NUM_SUPER ? n - off : QCAL_NUM_SUPER;
            super_metrics(x + off, y + off, m, &part[s]);
        }
        for (int64_t s = 0; s < nsb; s++)
            acc_add(&tot, &part[s]);
        free(part);
    }
    acc_add(acc, &tot);
    return QCAL_OK;
}

qcal_status qcal_numeric_metric_acc_result(const qcal_numeric_metric_acc *acc, qcal_numeric_metrics *out)
{
    if (!acc || !out)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_numeric_metric_acc_result: NULL argument");
    if (acc->count == 0)
        return qcal_error(QCAL_ERR_EMPTY, "no finite element pair to compare (%llu non-finite)",
                          (unsigned long long)acc->nonfinite);
    qcal_numeric_metrics m;
    m.count = acc->count;
    m.nonfinite = acc->nonfinite;
    m.max_abs_err = acc->max_abs_err;
    /* sqnr = 20 log10(sqrt(sxx) / sqrt(sdd)), the ratio of norms as compute_sqnr */
    if (acc->sdd == 0)
        m.sqnr_db = INFINITY;
    else if (acc->sxx == 0)
        m.sqnr_db = -INFINITY;
    else
        m.sqnr_db = 20.0 * log10(sqrt(acc->sxx) / sqrt(acc->sdd));
    if (acc->sdd == 0)
        m.l2 = 0;
    else if (acc->sxx == 0)
        m.l2 = INFINITY;
    else
        m.l2 = sqrt(acc->sdd / acc->sxx);
    double den = sqrt(acc->sxx) * sqrt(acc->syy);
    m.cosine = acc->sxy / (den > 1e-8 ? den : 1e-8);
    *out = m;
    return QCAL_OK;
}

qcal_status qcal_numeric_compare_f32(const float *x, const float *y, int64_t n, qcal_numeric_metrics *out)
{
    if (n < 1)
        return qcal_error(QCAL_ERR_EMPTY, "qcal_numeric_compare_f32: %lld elements", (long long)n);
    qcal_numeric_metric_acc acc;
    qcal_numeric_metric_acc_init(&acc);
    qcal_status s = qcal_numeric_metric_acc_update(&acc, x, y, n);
    if (s != QCAL_OK)
        return s;
    return qcal_numeric_metric_acc_result(&acc, out);
}
