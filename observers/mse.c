/* The "mse" observer: NVIDIA pytorch-quantization HistogramCalibrator's MSE search over a
 * histogram of |x|: candidate amax = centre of bin i for i in [min(128, bins-1), bins);
 * error = sum over bins j of count_j * (dequant(quant(c_j)) - c_j)^2 with c_j the bin
 * centre, quant(c) = min(nearbyint(c / s), nlev) (round half to even), s = amax / nlev;
 * mse = error / bins; the first i with the smallest mse wins. All in double, summed in
 * ascending j. See include/qcal/observers/histogram.h. */
#include <math.h>

#include "observers/histogram_kernels.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

int32_t qcal_hist_mse_search(const uint64_t *counts, int32_t bins, double hi, int64_t nlev,
                             double *best_mse)
{
    double w = hi / bins;
    int32_t start = bins - 1 < 128 ? bins - 1 : 128;
    int32_t best = bins - 1;
    double best_v = INFINITY;
    const double lev = (double)nlev;
    for (int32_t i = start; i < bins; i++) {
        double amax = ((double)i + 0.5) * w;
        double s = amax / lev;
        double err = 0.0;
        for (int32_t j = 0; j < bins; j++) {
            if (!counts[j])
                continue;
            double c = ((double)j + 0.5) * w;
            double q = nearbyint(c / s);
            if (q > lev)
                q = lev;
            double d = q * s - c;
            double dd = d * d;
            err += dd * (double)counts[j];
        }
        double mse = err / bins;
        if (mse < best_v) {
            best_v = mse;
            best = i;
        }
    }
    if (best_mse)
        *best_mse = best_v;
    return best;
}

static qcal_status mse_qrange(qcal_observer *obs, int64_t cap, float *mn, float *mx,
                              int64_t *n)
{
    (void)cap;
    const qcal_hist *h = qcal_histobs_hist(obs);
    *n = 1;
    if (qcal_hist_empty(h)) {
        qcal_range_set_empty(mn, mx, 1);
        return QCAL_NO_DATA;
    }
    double t = h->hi;
    if (h->lo != h->hi) {
        int64_t qmin, qmax;
        qcal_status st = qcal_qconfig_range(&obs->cfg.q, &qmin, &qmax);
        if (st != QCAL_OK)
            return st;
        /* Non-negative data with an affine scheme uses every level for [0, amax]; otherwise
         * half of them serve each sign (127 for 8 bits, as NVIDIA's narrow range). */
        bool unsigned_range = h->dmin >= 0.0f && (obs->cfg.q.qscheme == QCAL_PER_TENSOR_AFFINE);
        int64_t nlev = unsigned_range ? qmax - qmin : (qmax - qmin) / 2;
        if (nlev < 1)
            nlev = 1;
        int32_t i = qcal_hist_mse_search(h->counts, h->bins, h->hi, nlev, NULL);
        t = ((double)i + 0.5) * ((double)h->hi / h->bins);
    }
    qcal_histobs_clip_range(obs, t, mn, mx);
    return QCAL_OK;
}

const qcal_observer_ops qcal_observer_mse_ops = {
    .kind = QCAL_OBSERVER_MSE,
    .init = qcal_histobs_init,
    .fini = qcal_histobs_fini,
    .update = qcal_histobs_update,
    .channels = qcal_histobs_channels,
    .data_range = qcal_histobs_data_range,
    .qrange = mse_qrange,
    .reset = qcal_histobs_reset,
    .merge = qcal_histobs_merge,
    .save = qcal_histobs_save,
    .load = qcal_histobs_load,
};
