/* The observer ops the four histogram kinds (histogram, percentile, entropy, mse) share:
 * which grid's state they keep (first-batch, lattice or torch) and over x or |x|, update /
 * merge / save / load routed to it, and the common start and end of their range choice.
 * Each kind's own range chooser is in its file. See histogram_kinds.h. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "observers/histogram_kinds.h"

/* ---- shared observer ops ------------------------------------------------------------- */

/* Histogram of |x| (symmetric targets: TensorRT's and NVIDIA's searches) or of x. */
static bool kind_uses_abs(const qcal_observer_config *cfg)
{
    switch (cfg->kind) {
    case QCAL_OBSERVER_ENTROPY:
    case QCAL_OBSERVER_MSE:
        return !qcal_histobs_config_asymmetric(cfg);
    case QCAL_OBSERVER_PERCENTILE:
        if (cfg->percentile_mode == QCAL_PERCENTILE_AUTO)
            return !qcal_histobs_config_asymmetric(cfg);
        return cfg->percentile_mode == QCAL_PERCENTILE_ABS;
    default:
        return false;
    }
}

static qcal_histobs *hobs(const qcal_observer *obs)
{
    return (qcal_histobs *)obs->impl;
}

qcal_hist *qcal_histobs_hist(const qcal_observer *obs)
{
    return &hobs(obs)->hist;
}

static bool is_lattice(const qcal_observer *obs)
{
    return obs->cfg.grid == QCAL_GRID_LATTICE;
}

static bool is_torch(const qcal_observer *obs)
{
    return obs->cfg.grid == QCAL_GRID_TORCH;
}

qcal_torch_hist *qcal_histobs_torch(const qcal_observer *obs)
{
    return is_torch(obs) ? &hobs(obs)->th : NULL;
}

qcal_status qcal_histobs_init(qcal_observer *obs)
{
    qcal_histobs *h = qcal_calloc(1, sizeof *h);
    if (!h)
        return QCAL_ERR_NO_MEMORY;
    obs->impl = h;
    bool absval = kind_uses_abs(&obs->cfg);
    if (is_torch(obs))
        return qcal_torch_hist_init(&h->th, obs->cfg.bins);
    if (is_lattice(obs)) {
        h->hist.bins = obs->cfg.bins;
        h->hist.absval = absval;
        return qcal_lattice_init(&h->lat, obs->cfg.bins, absval);
    }
    return qcal_hist_init(&h->hist, obs->cfg.bins, absval);
}

void qcal_histobs_fini(qcal_observer *obs)
{
    qcal_histobs *h = obs->impl;
    if (h) {
        qcal_hist_free(&h->hist);
        qcal_lattice_free(&h->lat);
        qcal_torch_hist_free(&h->th);
        free(h);
        obs->impl = NULL;
    }
}

qcal_status qcal_histobs_update(qcal_observer *obs, const qcal_tensor *x, int64_t numel,
                                uint64_t *nonfinite)
{
    if (is_torch(obs))
        return qcal_torch_hist_update(&hobs(obs)->th, x->data, numel, obs->cfg.nonfinite,
                                      nonfinite);
    if (is_lattice(obs))
        return qcal_lattice_update(&hobs(obs)->lat, x->data, numel, obs->cfg.nonfinite,
                                   nonfinite);
    return qcal_hist_update(&hobs(obs)->hist, x->data, numel, obs->cfg.nonfinite, nonfinite);
}

qcal_status qcal_histobs_channels(const qcal_observer *obs, int64_t *n)
{
    (void)obs;
    *n = 1;
    return QCAL_OK;
}

/* Data min / max (signed) and whether anything was seen. */
static bool data_minmax(const qcal_observer *obs, float *dmin, float *dmax)
{
    if (is_torch(obs)) {
        const qcal_torch_hist *t = &hobs(obs)->th;
        *dmin = t->min_val;
        *dmax = t->max_val;
        return !qcal_torch_hist_empty(t);
    }
    if (is_lattice(obs)) {
        const qcal_lattice *L = &hobs(obs)->lat;
        *dmin = L->dmin;
        *dmax = L->dmax;
        return L->total > 0;
    }
    const qcal_hist *h = &hobs(obs)->hist;
    *dmin = h->dmin;
    *dmax = h->dmax;
    return !qcal_hist_empty(h);
}

qcal_status qcal_histobs_data_range(const qcal_observer *obs, int64_t cap, float *mn,
                                    float *mx, int64_t *n)
{
    (void)cap;
    *n = 1;
    float dmin, dmax;
    if (!data_minmax(obs, &dmin, &dmax)) {
        qcal_range_set_empty(mn, mx, 1);
        return QCAL_NO_DATA;
    }
    if (is_torch(obs)) {   /* PyTorch's min_val / max_val buffers */
        mn[0] = dmin;
        mx[0] = dmax;
        return QCAL_OK;
    }
    if (is_lattice(obs)) {
        /* The data range (|x| kinds: [-max|x|, max|x|], or [0, max|x|] without negatives). */
        const qcal_lattice *L = &hobs(obs)->lat;
        if (L->absval) {
            float a = qcal_lattice_vmax(L);
            mn[0] = dmin < 0.0f ? -a : 0.0f;
            mx[0] = a;
        } else {
            mn[0] = dmin;
            mx[0] = dmax;
        }
        return QCAL_OK;
    }
    const qcal_hist *h = &hobs(obs)->hist;
    if (h->absval) {
        mn[0] = h->dmin < 0.0f ? -h->hi : 0.0f;
        mx[0] = h->hi;
    } else {
        mn[0] = h->lo;
        mx[0] = h->hi;
    }
    return QCAL_OK;
}

void qcal_histobs_reset(qcal_observer *obs)
{
    if (is_torch(obs))
        qcal_torch_hist_clear(&hobs(obs)->th);
    else if (is_lattice(obs))
        qcal_lattice_clear(&hobs(obs)->lat);
    else
        qcal_hist_clear(&hobs(obs)->hist);
}

qcal_status qcal_histobs_merge(qcal_observer *dst, const qcal_observer *src)
{
    if (is_torch(dst))
        return qcal_torch_hist_merge(&hobs(dst)->th, &hobs(src)->th);
    if (is_lattice(dst))
        return qcal_lattice_merge(&hobs(dst)->lat, &hobs(src)->lat);
    return qcal_hist_merge(&hobs(dst)->hist, &hobs(src)->hist);
}

void qcal_histobs_save(const qcal_observer *obs, qcal_buf *b)
{
    if (is_torch(obs))
        qcal_torch_hist_save(&hobs(obs)->th, b);
    else if (is_lattice(obs))
        qcal_lattice_save(&hobs(obs)->lat, b);
    else
        qcal_hist_save(&hobs(obs)->hist, b);
}

qcal_status qcal_histobs_load(qcal_observer *obs, qcal_cursor *c)
{
    if (is_torch(obs))
        return qcal_torch_hist_load(&hobs(obs)->th, c);
    if (is_lattice(obs))
        return qcal_lattice_load(&hobs(obs)->lat, c);
    return qcal_hist_load(&hobs(obs)->hist, c);
}

const qcal_hist *qcal_histobs_qrange_begin(const qcal_observer *obs, float *mn, float *mx,
                                           int64_t *n, qcal_hist *view, qcal_status *st)
{
    *n = 1;
    *st = QCAL_OK;
    memset(view, 0, sizeof *view);
    if (is_torch(obs)) {
        /* The torch grid keeps float counts; only the histogram kind reads them
         * (histogram.c), through qcal_histobs_torch. */
        qcal_range_set_empty(mn, mx, 1);
        *st = qcal_error(QCAL_ERR_UNSUPPORTED, "grid=torch keeps PyTorch's float32 counts: "
                         "read them with qcal_observer_histogram_torch_get");
        return NULL;
    }
    /* Two-ended entropy / mse searches model an affine grid, which always holds zero: their
     * histogram spans zero too (data away from zero leave bins empty between zero and the
     * data, as the |x| searches' [0, max|x|] does). */
    const bool with_zero = (obs->cfg.kind == QCAL_OBSERVER_ENTROPY ||
                            obs->cfg.kind == QCAL_OBSERVER_MSE) &&
                           !kind_uses_abs(&obs->cfg);
    if (!is_lattice(obs)) {
        const qcal_hist *h = &hobs(obs)->hist;
        if (qcal_hist_empty(h)) {
            qcal_range_set_empty(mn, mx, 1);
            *st = QCAL_NO_DATA;
            return NULL;
        }
        if (!with_zero || (h->lo <= 0.0f && 0.0f <= h->hi) || h->lo == h->hi)
            return h;
        /* First-batch grid away from zero: re-binned onto a grid from zero (linear spread
         * inside each bin, total exact). */
        *view = *h;
        view->lo = fminf(h->lo, 0.0f);
        view->hi = fmaxf(h->hi, 0.0f);
        view->top = 0;
        view->counts = qcal_calloc((size_t)h->bins, sizeof *view->counts);
        if (!view->counts) {
            *st = QCAL_ERR_NO_MEMORY;
            return NULL;
        }
        qcal_hist_rebin(h->counts, h->bins, h->lo, h->hi, view->counts, h->bins, view->lo,
                        view->hi);
        return view;
    }
    const qcal_lattice *L = &hobs(obs)->lat;
    if (L->total == 0) {
        qcal_range_set_empty(mn, mx, 1);
        *st = QCAL_NO_DATA;
        return NULL;
    }
    /* bins equal bins over the range of v seen, re-binned from the lattice. */
    view->bins = obs->cfg.bins;
    view->absval = L->absval;
    view->lo = qcal_lattice_vmin(L);
    view->hi = qcal_lattice_vmax(L);
    if (with_zero && view->lo != view->hi) {
        view->lo = fminf(view->lo, 0.0f);
        view->hi = fmaxf(view->hi, 0.0f);
    }
    view->dmin = L->dmin;
    view->dmax = L->dmax;
    view->total = L->total;
    view->top = 0;
    view->counts = qcal_calloc((size_t)view->bins, sizeof *view->counts);
    if (!view->counts) {
        *st = QCAL_ERR_NO_MEMORY;
        return NULL;
    }
    if (view->lo == view->hi)
        view->counts[0] = L->total;
    else
        qcal_lattice_view(L, view->lo, view->hi, view->bins, view->counts);
    return view;
}

void qcal_histobs_qrange_end(qcal_hist *view)
{
    free(view->counts);
    view->counts = NULL;
}

qcal_lattice *qcal_histobs_lattice(const qcal_observer *obs)
{
    return &hobs(obs)->lat;
}

bool qcal_histobs_is_lattice(const qcal_observer *obs)
{
    return is_lattice(obs);
}

int32_t qcal_hist_zero_bin(const qcal_hist *h)
{
    if (!(h->lo <= 0.0f && 0.0f <= h->hi))
        return -1;
    if (h->lo == h->hi)
        return 0;
    return qcal_hist_bin_of(0.0f, h->lo, h->hi, h->bins);
}

void qcal_histobs_window_range(const qcal_observer *obs, const qcal_hist *h, int32_t a,
                               int32_t b, double f, float *mn, float *mx)
{
    double lo = h->lo, hi = h->hi, w = (hi - lo) / h->bins;
    float fa = a <= 0 && f == 0.0 ? h->lo : (float)(lo + ((double)a + f) * w);
    float fb = b >= h->bins && f == 0.0 ? h->hi : (float)(lo + ((double)b + f) * w);
    if (is_lattice(obs)) {
        float dmin, dmax;
        data_minmax(obs, &dmin, &dmax);
        fa = fminf(fmaxf(fa, dmin), dmax);
        fb = fminf(fmaxf(fb, dmin), dmax);
    }
    *mn = fa;
    *mx = fb;
}

void qcal_histobs_clip_range(const qcal_observer *obs, double t, float *mn, float *mx)
{
    float dmin, dmax;
    data_minmax(obs, &dmin, &dmax);
    float ft = (float)t;
    if (!(ft <= FLT_MAX))
        ft = FLT_MAX;
    if (is_lattice(obs)) {
        /* Inside the data: t <= max|x| (the searches stay below it; rounding aside). */
        float a = fmaxf(-dmin, dmax);
        if (ft > a)
            ft = a;
    }
    *mx = ft;
    *mn = dmin < 0.0f ? -ft : 0.0f;
}
