/* The "entropy" observer: TensorRT-style KL-divergence threshold search over a histogram
 * of |x|. Variant (documented in include/qcal/observers/histogram.h):
 *   for each candidate i in [levels, bins]:
 *     P = bins[0..i-1], the mass of bins[i..] added to P[i-1];
 *     bin j < i belongs to level (j * levels) / i (integer division);
 *     Q = P merged per level and spread evenly back over that level's non-zero bins of P;
 *     KL_i = sum_{j: P_j > 0} (P_j / S) * (log P_j - log(levelsum / nonzero))  (S = total)
 *   threshold = i * bin width for the first i with the smallest KL_i.
 * All in double, summed in ascending j; log() is the C library's. */
#include <math.h>
#include <string.h>

#include "observers/histogram_kernels.h"

int32_t qcal_hist_entropy_search(const uint64_t *counts, int32_t bins, int32_t levels,
                                 double *best_kl)
{
    uint64_t total = 0;
    for (int32_t j = 0; j < bins; j++)
        total += counts[j];
    double *logp = qcal_malloc(((size_t)bins + 2 * (size_t)levels) * sizeof(double));
    uint64_t *lsum = qcal_malloc((size_t)levels * 2 * sizeof(uint64_t));
    if (!logp || !lsum || total == 0 || levels > bins) {
        free(logp);
        free(lsum);
        if (best_kl)
            *best_kl = 0.0;
        return bins;
    }
    double *logq = logp + bins;
    uint64_t *nz = lsum + levels;
    for (int32_t j = 0; j < bins; j++)
        logp[j] = counts[j] ? log((double)counts[j]) : 0.0;
    /* outliers[i] = sum of counts[i..bins) as we walk i downwards is simpler upwards: */
    uint64_t outl = 0;
    for (int32_t j = levels; j < bins; j++)
        outl += counts[j];
    const double S = (double)total;
    int32_t best = bins;
    double best_v = INFINITY;
    for (int32_t i = levels; i <= bins; i++) {
        /* outl = sum counts[i..bins) */
        uint64_t plast = counts[i - 1] + outl;
        memset(lsum, 0, (size_t)levels * 2 * sizeof(uint64_t));
        for (int32_t j = 0; j < i; j++) {
            uint64_t p = j == i - 1 ? plast : counts[j];
            int64_t l = ((int64_t)j * levels) / i;
            lsum[l] += p;
            nz[l] += p > 0;
        }
        for (int32_t l = 0; l < levels; l++)
            logq[l] = nz[l] ? log((double)lsum[l] / (double)nz[l]) : 0.0;
        double kl = 0.0;
        for (int32_t j = 0; j < i; j++) {
            uint64_t p = j == i - 1 ? plast : counts[j];
            if (p == 0)
                continue;
            double lp = j == i - 1 ? log((double)p) : logp[j];
            int64_t l = ((int64_t)j * levels) / i;
            kl += ((double)p / S) * (lp - logq[l]);
        }
        if (kl < best_v) {
            best_v = kl;
            best = i;
        }
        if (i < bins)
            outl -= counts[i];
    }
    free(logp);
    free(lsum);
    if (best_kl)
        *best_kl = best_v;
    return best;
}

static qcal_status entropy_qrange(qcal_observer *obs, int64_t cap, float *mn, float *mx,
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
        int32_t i = qcal_hist_entropy_search(h->counts, h->bins, obs->cfg.entropy_levels, NULL);
        t = (double)i * ((double)h->hi / h->bins);
    }
    qcal_histobs_clip_range(obs, t, mn, mx);
    return QCAL_OK;
}

const qcal_observer_ops qcal_observer_entropy_ops = {
    .kind = QCAL_OBSERVER_ENTROPY,
    .init = qcal_histobs_init,
    .fini = qcal_histobs_fini,
    .update = qcal_histobs_update,
    .channels = qcal_histobs_channels,
    .data_range = qcal_histobs_data_range,
    .qrange = entropy_qrange,
    .reset = qcal_histobs_reset,
    .merge = qcal_histobs_merge,
    .save = qcal_histobs_save,
    .load = qcal_histobs_load,
};
