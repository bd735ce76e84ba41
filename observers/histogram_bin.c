/* The threaded binning driver of the histogram family: splits a batch over OpenMP threads,
 * runs the family's kernel (histogram_dsp.h) on each part into private partial counts and adds
 * them in thread order, so that counts never depend on the thread count; tiny batches and
 * huge grids take a plain loop straight into the counts. Both grids (first-batch, lattice)
 * go through it. See histogram_bin.h. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu.h"
#include "core/internal.h"
#include "observers/histogram_bin.h"
#include "observers/minmax_dsp.h"
#include "qcal_config.h"

/* Bin indices must be computed op by op (no fused multiply-add) to match torch.histc. */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

static inline int64_t part_start(int64_t n, int t, int threads)
{
    return (int64_t)((__int128)n * t / threads);
}

/* Batches of at most SMALL_BATCH values go straight into the counts (one thread, no
 * scratch): for a 64-value call the scratch's calloc and the sum over the window cost ~20x
 * the binning. Same slots, min / max and non-finite count as the kernels (the slot
 * functions of histogram_dsp.h, the reference loop). */
#define SMALL_BATCH QCAL_HIST_SMALL_BATCH

static void bin_small(const float *x, int64_t n, const qcal_histc_grid *hg,
                      const qcal_lattice_grid *lg, bool fused, bool reject_nonfinite,
                      uint64_t *counts, uint64_t *top, float *mn, float *mx,
                      uint64_t *nonfinite, bool *binned)
{
    const bool fast = hg && qcal_histc_float_ok(hg->lo, hg->hi);
    if (fused) {
        float l = INFINITY, h = -INFINITY;
        uint64_t bad = 0;
        bool inside = true;
        for (int64_t i = 0; i < n; i++) {
            float v = x[i];
            if (!qcal_f32_finite(v)) {
                bad++;
                continue;
            }
            l = v < l ? v : l;
            h = v > h ? v : h;
            inside &= hg ? qcal_histc_slot(v, hg->lo, hg->hi, hg->bins, hg->absval, fast) <=
                               hg->bins
                         : qcal_lattice_slot(v, lg) < (uint32_t)lg->accept;
        }
        *mn = l;
        *mx = h;
        *nonfinite = bad;
        if (reject_nonfinite && bad > 0)
            inside = false;
        *binned = inside;
        if (!inside)
            return;
    }
    for (int64_t i = 0; i < n; i++) {
        if (hg) {
            int32_t s = qcal_histc_slot(x[i], hg->lo, hg->hi, hg->bins, hg->absval, fast);
            if (s < hg->bins) {
                counts[s]++;
            } else if (s == hg->bins) {   /* the top edge belongs to the last bin */
                counts[s - 1]++;
                (*top)++;
            }
        } else {
            uint32_t s = qcal_lattice_slot(x[i], lg);
            if (s < (uint32_t)lg->accept)
                counts[s]++;
        }
    }
}

qcal_status qcal_hist_bin_threaded(const float *x, int64_t n, const qcal_histc_grid *hg,
                                   const qcal_lattice_grid *lg, bool fused,
                                   bool reject_nonfinite, uint64_t *counts, uint64_t *top,
                                   float *mn, float *mx, uint64_t *nonfinite, bool *binned)
{
    enum { MAXT = 64 };
    const qcal_histogram_dsp *dsp = qcal_histogram_dsp_get();
    /* Per thread, in uint64 words: partial counts (ncount), then the sub-histograms. */
    const int32_t ncount = hg ? hg->bins + 1 : lg->accept;
    const int32_t stride = hg ? hg->bins + 2 : lg->accept + 1;
    int threads = qcal_threads_for(n);
    if (threads > MAXT)
        threads = MAXT;
    if ((threads == 1 && n <= SMALL_BATCH) || ncount >= QCAL_HIST_DIRECT_SLOTS) {
        bin_small(x, n, hg, lg, fused, reject_nonfinite, counts, top, mn, mx, nonfinite, binned);
        return QCAL_OK;
    }
    size_t sub_bytes = (size_t)QCAL_HIST_SUB_COPIES * (size_t)stride * sizeof(qcal_hist_sub);
    size_t per = (size_t)ncount + (sub_bytes + 7) / 8, total;
    if (!qcal_mul_size(per, (size_t)threads, &total))
        return qcal_error(QCAL_ERR_OVERFLOW, "histogram scratch for %d slots x %d threads "
                          "overflows", (int)stride, threads);
    uint64_t *scratch = qcal_calloc(total, sizeof(uint64_t));
    if (!scratch)
        return QCAL_ERR_NO_MEMORY;
    float pl[MAXT], ph[MAXT];
    uint64_t pb[MAXT];
    bool pin[MAXT];
#if QCAL_HAVE_OPENMP
#pragma omp parallel for num_threads(threads) schedule(static, 1) if (threads > 1)
#endif
    for (int t = 0; t < threads; t++) {
        int64_t s = part_start(n, t, threads), e = part_start(n, t + 1, threads);
        uint64_t *part = scratch + (size_t)t * per;
        qcal_hist_sub *sub = (qcal_hist_sub *)(part + ncount);
        pin[t] = true;
        if (hg && fused)
            pin[t] = dsp->histc_inside(x + s, e - s, hg, part, sub, &pl[t], &ph[t], &pb[t]);
        else if (hg)
            dsp->histc(x + s, e - s, hg, part, sub);
        else if (fused) {
            int64_t r = dsp->lattice_bin_until(x + s, e - s, lg, part, sub, &pl[t], &ph[t],
                                               &pb[t]);
            pin[t] = r == e - s;
            if (!pin[t]) {   /* the counts are dropped; the min / max cover the rest too */
                float l, h;
                uint64_t b;
                qcal_minmax_dsp_get()->minmax(x + s + r, e - s - r, &l, &h, &b);
                pl[t] = l < pl[t] ? l : pl[t];
                ph[t] = h > ph[t] ? h : ph[t];
                pb[t] += b;
            }
        } else
            dsp->lattice_bin(x + s, e - s, lg, part, sub);
    }
    bool inside = true;
    if (fused) {
        float l = INFINITY, h = -INFINITY;
        uint64_t bad = 0;
        for (int t = 0; t < threads; t++) {
            l = pl[t] < l ? pl[t] : l;
            h = ph[t] > h ? ph[t] : h;
            bad += pb[t];
            inside &= pin[t];
        }
        if (reject_nonfinite && bad > 0)
            inside = false;
        *mn = l;
        *mx = h;
        *nonfinite = bad;
        *binned = inside;
    }
    if (inside) {
        const int32_t nb = hg ? hg->bins : ncount;
        for (int t = 0; t < threads; t++) {
            const uint64_t *part = scratch + (size_t)t * per;
            for (int32_t b = 0; b < nb; b++)
                counts[b] += part[b];
            if (hg) {   /* the top edge belongs to the last bin */
                counts[nb - 1] += part[nb];
                *top += part[nb];
            }
        }
    }
    free(scratch);
    return QCAL_OK;
}

qcal_status qcal_f32_histc(const float *x, int64_t n, float lo, float hi, int32_t bins,
                           bool absval, uint64_t *counts, uint64_t *top)
{
    const qcal_histc_grid g = { .lo = lo, .hi = hi, .bins = bins, .absval = absval };
    return qcal_hist_bin_threaded(x, n, &g, NULL, false, false, counts, top, NULL, NULL, NULL,
                                  NULL);
}

qcal_status qcal_f32_histc_inside(const float *x, int64_t n, float lo, float hi, int32_t bins,
                                  bool absval, bool reject_nonfinite, uint64_t *counts,
                                  uint64_t *top, float *mn, float *mx, uint64_t *nonfinite,
                                  bool *binned)
{
    const qcal_histc_grid g = { .lo = lo, .hi = hi, .bins = bins, .absval = absval };
    return qcal_hist_bin_threaded(x, n, &g, NULL, true, reject_nonfinite, counts, top, mn, mx,
                                  nonfinite, binned);
}
