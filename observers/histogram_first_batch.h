/* The first-batch grid's histogram of the histogram observer family (grid =
 * QCAL_GRID_FIRST_BATCH; observers/histogram_first_batch.c): bins over the first batch's
 * exact range (the grid of histogram_bin.h), grown exactly. Internal, not installed. */
#ifndef QCAL_OBSERVERS_HISTOGRAM_FIRST_BATCH_H
#define QCAL_OBSERVERS_HISTOGRAM_FIRST_BATCH_H

#include <stdbool.h>
#include <stdint.h>

#include "observers/observer_impl.h"

/* Bin of one value v in [lo, hi] with the grid arithmetic of histogram_bin.h
 * (lo <= hi; lo == hi -> 0). */
int32_t qcal_hist_bin_of(float v, float lo, float hi, int32_t bins);

/* Growable histogram.
 * No data: lo = +inf, hi = -inf, total 0. Degenerate: lo == hi (every value seen so far was
 * that one value; all counts in bin 0). Otherwise lo < hi with the grid of
 * histogram_bin.h.
 * Growth (a batch outside [lo, hi]): the new grid keeps lo as an edge and multiplies the bin
 * width by the smallest power of two 2^k that, with the lower edge moved down by a whole
 * number of new bins, covers the batch: old bin i becomes new bin m + (i >> k), exactly.
 * For |x| grids lo stays 0, so hi only doubles. If the new edges cannot be represented
 * finitely in float32 (ranges near FLT_MAX) the grid becomes [min, max] of everything seen
 * and old counts are spread linearly (qcal_hist_rebin). */
typedef struct qcal_hist {
    int32_t bins;
    bool absval;        /* grid over |x| with lo fixed at 0 */
    float lo, hi;       /* grid edges */
    float dmin, dmax;   /* min / max of the finite values seen (signed, also for absval) */
    uint64_t total;     /* sum of counts */
    uint64_t top;       /* values exactly on the top edge hi (part of counts[bins-1]); on
                         * growth they move to hi's bin of the new grid, keeping it exact */
    uint64_t *counts;   /* [bins] */
} qcal_hist;

qcal_status qcal_hist_init(qcal_hist *h, int32_t bins, bool absval);
void qcal_hist_free(qcal_hist *h);
void qcal_hist_clear(qcal_hist *h);
bool qcal_hist_empty(const qcal_hist *h);
/* Adds a batch (see observer_impl.h update contract: counts non-finite values into
 * *nonfinite; strict policy -> QCAL_ERR_NONFINITE with h unchanged). */
qcal_status qcal_hist_update(qcal_hist *h, const float *x, int64_t n,
                             qcal_nonfinite_policy policy, uint64_t *nonfinite);
/* dst += src (same bins and absval). Exact when src's grid lies on dst's grown lattice
 * (same origin, power-of-two width ratio) or src is degenerate; otherwise src's counts
 * are spread linearly over the merged bins, preserving the total. */
qcal_status qcal_hist_merge(qcal_hist *dst, const qcal_hist *src);
/* Re-bins counts on [lo, hi] into dst_counts on [dlo, dhi] (the latter covering the former)
 * assuming uniform density inside each source bin; rounded cumulative counts, so the
 * total is preserved exactly. */
void qcal_hist_rebin(const uint64_t *counts, int32_t bins, double lo, double hi,
                     uint64_t *dst_counts, int32_t dst_bins, double dlo, double dhi);
void qcal_hist_save(const qcal_hist *h, qcal_buf *b);
qcal_status qcal_hist_load(qcal_hist *h, qcal_cursor *c);

#endif
