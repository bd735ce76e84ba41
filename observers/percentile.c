/* The "percentile" observer: clips at the p-th percentile of |x| (symmetric, as NVIDIA's
 * pytorch-quantization) or, two tails, at the (100-p)/2-th and (100+p)/2-th percentiles of x:
 * 100 - p percent of the values clipped in either mode, split evenly between the tails as
 * ONNX Runtime's non-symmetric percentile calibrator does ((100 - p) / 200 per side). Read
 * off the growable histogram. See include/qcal/observers/histogram.h. */
#include <math.h>

#include "observers/histogram_kinds.h"

double qcal_hist_quantile(const uint64_t *counts, int32_t bins, double lo, double hi,
                          double q)
{
    uint64_t total = 0;
    for (int32_t i = 0; i < bins; i++)
        total += counts[i];
    double w = (hi - lo) / bins;
    double target = q * (double)total;
    /* First bin whose inclusive cumulative count reaches the target (skipping empty bins),
     * then linear interpolation inside it: uniform density over the bin. */
    uint64_t below = 0;
    int32_t last = -1;
    for (int32_t i = 0; i < bins; i++) {
        if (counts[i] == 0)
            continue;
        last = i;
        if ((double)(below + counts[i]) >= target) {
            double f = (target - (double)below) / (double)counts[i];
            if (f < 0.0)
                f = 0.0;
            if (f > 1.0)
                f = 1.0;
            return lo + ((double)i + f) * w;
        }
        below += counts[i];
    }
    /* Rounding left the target above the total: the top of the last non-empty bin. */
    return last < 0 ? lo : lo + (double)(last + 1) * w;
}

static qcal_status percentile_qrange(const qcal_observer *obs, int64_t cap, float *mn, float *mx,
                                     int64_t *n)
{
    (void)cap;
    qcal_hist view;
    qcal_status st;
    const qcal_hist *h = qcal_histobs_qrange_begin(obs, mn, mx, n, &view, &st);
    if (!h)
        return st;
    double p = obs->cfg.percentile / 100.0;
    if (h->absval) {   /* abs mode, or auto on a symmetric target */
        double t = h->lo == h->hi ? h->hi
                                  : qcal_hist_quantile(h->counts, h->bins, 0.0, h->hi, p);
        qcal_histobs_clip_range(obs, t, mn, mx);
    } else if (h->lo == h->hi) {
        mn[0] = h->lo;
        mx[0] = h->hi;
    } else {
        /* 100 - p percent clipped in all, half off each tail (p = 0: both at the median) */
        double tail = (1.0 - p) / 2.0;
        double a = qcal_hist_quantile(h->counts, h->bins, h->lo, h->hi, tail);
        double b = qcal_hist_quantile(h->counts, h->bins, h->lo, h->hi, 1.0 - tail);
        mn[0] = (float)a;
        mx[0] = (float)b;
        if (qcal_histobs_is_lattice(obs)) {
            mn[0] = fminf(fmaxf(mn[0], h->lo), h->hi);
            mx[0] = fminf(fmaxf(mx[0], h->lo), h->hi);
        }
    }
    qcal_histobs_qrange_end(&view);
    return QCAL_OK;
}

const qcal_observer_ops qcal_observer_percentile_ops = {
    .kind = QCAL_OBSERVER_PERCENTILE,
    .init = qcal_histobs_init,
    .fini = qcal_histobs_fini,
    .update = qcal_histobs_update,
    .channels = qcal_histobs_channels,
    .data_range = qcal_histobs_data_range,
    .qrange = percentile_qrange,
    .reset = qcal_histobs_reset,
    .merge = qcal_histobs_merge,
    .save = qcal_histobs_save,
    .load = qcal_histobs_load,
};
