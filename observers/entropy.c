/* The "entropy" observer: TensorRT-style KL-divergence threshold search over a histogram
 * of |x|. Variant (documented in include/qcal/observers/histogram.h):
 *   for each candidate i in [levels, bins]:
 *     P = bins[0..i-1] with the mass of bins[i..] (outliers) added to P[i-1];
 *     Q = the unclipped bins[0..i-1] merged into levels (bin j -> level (j * levels) / i,
 *         integer division) and spread evenly back over each level's non-zero bins;
 *     p = P / total, q = Q / (total - outliers);
 *     KL_i = sum_{j: P_j > 0} p_j * (log p_j - log q_j), +inf if some q_j = 0 < p_j;
 *   threshold = i * bin width for the first i with the smallest KL_i.
 * Building Q from the unclipped bins is what penalises clipping (TensorRT, MXNet); a Q
 * built from P would make KL = 0 at i = levels. All in double, summed in ascending j;
 * log() is the C library's. Cost: O(i + levels) per candidate. */
#include <math.h>
#include <string.h>

#include "observers/histogram_kernels.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

int32_t qcal_hist_entropy_search(const uint64_t *counts, int32_t bins, int32_t levels,
                                 double *best_kl)
{
    uint64_t total = 0;
    for (int32_t j = 0; j < bins; j++)
        total += counts[j];
    double *lp = qcal_malloc(((size_t)bins + (size_t)levels) * sizeof(double));
    uint64_t *lsum = qcal_malloc((size_t)levels * 2 * sizeof(uint64_t));
    if (!lp || !lsum || total == 0 || levels > bins || levels < 1) {
        free(lp);
        free(lsum);
        if (best_kl)
            *best_kl = 0.0;
        return bins;
    }
    double *lq = lp + bins;
    uint64_t *nz = lsum + levels;
    const double S = (double)total;
    for (int32_t j = 0; j < bins; j++)
        lp[j] = counts[j] ? log((double)counts[j] / S) : 0.0;
    uint64_t outl = 0;   /* sum of counts[i..bins) for the current candidate i */
    for (int32_t j = levels; j < bins; j++)
        outl += counts[j];
    int32_t best = bins;
    double best_v = INFINITY;
    for (int32_t i = levels; i <= bins; i++) {
        double kl = INFINITY;
        uint64_t sq = total - outl;
        if (sq > 0 && !(counts[i - 1] == 0 && outl > 0)) {
            memset(lsum, 0, (size_t)levels * 2 * sizeof(uint64_t));
            for (int32_t j = 0; j < i; j++) {
                int64_t l = ((int64_t)j * levels) / i;
                lsum[l] += counts[j];
                nz[l] += counts[j] > 0;
            }
            const double SQ = (double)sq;
            for (int32_t l = 0; l < levels; l++)
                lq[l] = nz[l] ? log(((double)lsum[l] / (double)nz[l]) / SQ) : 0.0;
            kl = 0.0;
            for (int32_t j = 0; j < i; j++) {
                uint64_t p = j == i - 1 ? counts[j] + outl : counts[j];
                if (p == 0)
                    continue;
                double lpj = j == i - 1 ? log((double)p / S) : lp[j];
                int64_t l = ((int64_t)j * levels) / i;
                kl += ((double)p / S) * (lpj - lq[l]);
            }
        }
        if (kl < best_v) {
            best_v = kl;
            best = i;
        }
        if (i < bins)
            outl -= counts[i];
    }
    free(lp);
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
