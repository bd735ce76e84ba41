/* Introspection of the histogram family for reports (include/qcal/observers/histogram.h):
 * the histogram the range search runs on and the objective curve of the search. Both are
 * computed from the same state and by the same code as qcal_observer_qrange. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "observers/histogram_kinds.h"
#include "qcal/observers/histogram.h"

static bool is_hist_kind(const qcal_observer *obs)
{
    qcal_observer_kind k = obs->cfg.kind;
    return k == QCAL_OBSERVER_HISTOGRAM || k == QCAL_OBSERVER_PERCENTILE ||
           k == QCAL_OBSERVER_ENTROPY || k == QCAL_OBSERVER_MSE;
}

qcal_status qcal_observer_histogram_bins(const qcal_observer *obs, int64_t cap, double *edges,
                                         uint64_t *counts, int64_t *n)
{
    if (!obs || !edges || !counts || !n)
        return qcal_error(QCAL_ERR_INVALID_ARG, "observer or outputs are NULL");
    *n = 0;
    if (!is_hist_kind(obs))
        return qcal_error(QCAL_ERR_INVALID_ARG, "observer %s has no histogram",
                          qcal_observer_kind_name(obs->cfg.kind));
    if (cap < obs->cfg.bins)
        return qcal_error(QCAL_ERR_INVALID_ARG, "capacity %lld is below the %d bins",
                          (long long)cap, (int)obs->cfg.bins);
    qcal_hist view;
    qcal_status st;
    float mn, mx;
    int64_t one;
    const qcal_hist *h = qcal_histobs_qrange_begin(obs, &mn, &mx, &one, &view, &st);
    if (!h)
        return st;
    double lo = h->lo, hi = h->hi, w = (hi - lo) / h->bins;
    for (int32_t i = 0; i <= h->bins; i++)
        edges[i] = i == h->bins ? hi : lo + w * i;
    memcpy(counts, h->counts, (size_t)h->bins * sizeof *counts);
    *n = h->bins;
    qcal_histobs_qrange_end(&view);
    return QCAL_OK;
}

/* Writes candidate k (if below cap) with the clip range of threshold t on |x|. */
static void put_abs(const qcal_observer *obs, int64_t cap, float *lo, float *hi, double *err,
                    int64_t k, double t, double e)
{
    if (k >= cap)
        return;
    qcal_histobs_clip_range(obs, t, &lo[k], &hi[k]);
    err[k] = e;
}

/* Writes candidate k (if below cap): the bins window [a, b] of a signed histogram (f: 0
 * edges, 0.5 centres, as qcal_histobs_window_range). */
static void put_window(const qcal_observer *obs, const qcal_hist *h, int64_t cap, float *lo,
                       float *hi, double *err, int64_t k, int32_t a, int32_t b, double f,
                       double e)
{
    if (k >= cap)
        return;
    qcal_histobs_window_range(obs, h, a, b, f, &lo[k], &hi[k]);
    err[k] = e;
}

qcal_status qcal_observer_histogram_search_curve(const qcal_observer *obs, int64_t cap, float *lo, float *hi,
                                                 double *err, int64_t *n, int64_t *chosen)
{
    if (!obs || !lo || !hi || !err || !n || !chosen || cap < 0)
        return qcal_error(QCAL_ERR_INVALID_ARG, "observer or outputs are NULL");
    *n = 0;
    *chosen = -1;
    if (!is_hist_kind(obs))
        return qcal_error(QCAL_ERR_INVALID_ARG, "observer %s has no range search",
                          qcal_observer_kind_name(obs->cfg.kind));
    if (obs->cfg.kind == QCAL_OBSERVER_PERCENTILE)
        return qcal_error(QCAL_ERR_UNSUPPORTED,
                          "the percentile observer reads its range off the histogram: no "
                          "objective curve");
    qcal_hist view;
    qcal_status st;
    float mn, mx;
    int64_t one;
    const qcal_hist *h = qcal_histobs_qrange_begin(obs, &mn, &mx, &one, &view, &st);
    if (!h)
        return st;
    st = QCAL_OK;
    if (h->lo == h->hi) {
        /* Zero-width histogram: no search; the one candidate is the point itself. */
        if (cap > 0) {
            lo[0] = h->lo;
            hi[0] = h->hi;
            err[0] = 0.0;
            if (obs->cfg.kind != QCAL_OBSERVER_HISTOGRAM)
                qcal_histobs_clip_range(obs, h->hi, &lo[0], &hi[0]);
        }
        *n = 1;
        *chosen = 0;
        qcal_histobs_qrange_end(&view);
        return QCAL_OK;
    }
    const int32_t B = h->bins;
    const double w = ((double)h->hi - (double)h->lo) / B;
    if (!h->absval && obs->cfg.kind != QCAL_OBSERVER_HISTOGRAM) {
        /* Two-ended searches: the slice through the chosen window, its low end fixed. */
        bool ent = obs->cfg.kind == QCAL_OBSERVER_ENTROPY;
        int32_t first = ent ? obs->cfg.entropy_levels : (B - 1 < 128 ? B - 1 : 128);
        int32_t nc = B - first + 1, a = 0, b = B;
        int64_t qmin = 0, qmax = 0;
        st = qcal_qconfig_range(&obs->cfg.q, &qmin, &qmax);
        double *e = st == QCAL_OK ? qcal_malloc((size_t)nc * sizeof *e) : NULL;
        if (st == QCAL_OK && !e)
            st = QCAL_ERR_NO_MEMORY;
        if (e) {
            bool ok = ent ? qcal_hist_entropy_window(h->counts, B, first, qmax - qmin,
                                                     qcal_hist_zero_bin(h), &a, &b, NULL, e)
                          : qcal_hist_mse_window(h->counts, B, qmax - qmin,
                                                 qcal_hist_zero_bin(h), &a, &b, NULL, e);
            if (!ok) {
                st = QCAL_ERR_NO_MEMORY;
            } else {
                for (int32_t c = 0; c < nc; c++)
                    put_window(obs, h, cap, lo, hi, err, c, a, first + c, 0.0, e[c]);
                *n = nc;
                *chosen = b - first;
            }
            free(e);
        }
    } else if (obs->cfg.kind == QCAL_OBSERVER_ENTROPY) {
        int32_t levels = obs->cfg.entropy_levels;
        int32_t nc = B - levels + 1;
        double *kl = qcal_malloc((size_t)nc * sizeof *kl);
        if (!kl) {
            st = QCAL_ERR_NO_MEMORY;
        } else {
            int32_t best = qcal_hist_entropy_search_curve(h->counts, B, levels, NULL, kl);
            for (int32_t c = 0; c < nc; c++)
                put_abs(obs, cap, lo, hi, err, c, (double)(levels + c) * ((double)h->hi / B),
                        kl[c]);
            *n = nc;
            *chosen = best - levels;
            free(kl);
        }
    } else if (obs->cfg.kind == QCAL_OBSERVER_MSE) {
        int64_t nlev;
        st = qcal_histobs_mse_levels(obs, h, &nlev);
        int32_t start = B - 1 < 128 ? B - 1 : 128, nc = B - start;
        double *e = st == QCAL_OK ? qcal_malloc((size_t)nc * sizeof *e) : NULL;
        if (st == QCAL_OK && !e)
            st = QCAL_ERR_NO_MEMORY;
        if (e) {
            int32_t best = qcal_hist_mse_search_curve(h->counts, B, h->hi, nlev, NULL, e);
            for (int32_t c = 0; c < nc; c++)
                put_abs(obs, cap, lo, hi, err, c,
                        ((double)(start + c) + 0.5) * ((double)h->hi / B), e[c]);
            *n = nc;
            *chosen = best - start;
            free(e);
        }
    } else {
        float *fh = qcal_malloc((size_t)B * sizeof *fh);
        int32_t *se = qcal_malloc(2 * ((size_t)B + 1) * sizeof *se);
        double *nv = qcal_malloc(((size_t)B + 1) * sizeof *nv);
        if (!fh || !se || !nv) {
            st = QCAL_ERR_NO_MEMORY;
        } else {
            for (int32_t i = 0; i < B; i++)
                fh[i] = (float)h->counts[i];
            qcal_l2_trace tr = { .cap = (int64_t)B + 1, .n = 0, .chosen = -1, .start = se,
                                 .end = se + B + 1, .norm = nv };
            double dst = obs->cfg.q.dtype == QCAL_QINT32 ? 4294967296.0 : 256.0;
            float a, b;
            st = qcal_hist_l2_search_trace(fh, B, h->lo, h->hi, dst, &a, &b, &tr);
            if (st == QCAL_OK) {
                /* The ranges as the search reports them: min + bin_width * bin in float. */
                const float bw = (h->hi - h->lo) / (float)B;
                int64_t m = tr.n < tr.cap ? tr.n : tr.cap;
                for (int64_t k = 0; k < m && k < cap; k++) {
                    lo[k] = h->lo + bw * (float)tr.start[k];
                    hi[k] = h->lo + bw * (float)(tr.end[k] + 1);
                    if (qcal_histobs_is_lattice(obs)) {
                        lo[k] = fminf(fmaxf(lo[k], h->lo), h->hi);
                        hi[k] = fminf(fmaxf(hi[k], h->lo), h->hi);
                    }
                    err[k] = tr.norm[k];
                }
                *n = tr.n;
                *chosen = tr.chosen;
            }
        }
        free(fh);
        free(se);
        free(nv);
    }
    (void)w;
    qcal_histobs_qrange_end(&view);
    return st;
}
