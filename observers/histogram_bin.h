/* The threaded binning driver of the histogram observer family (observers/histogram_bin.c):
 * one batch binned by the family's kernels (histogram_dsp.h) on either grid, split over
 * OpenMP threads whose integer partials are added in thread order. Internal, not installed.
 *
 * First-batch grid: `bins` equal bins over [lo, hi]; a value v in [lo, hi] goes to bin
 *   i = (int64)((v - lo) / (hi - lo) * (float)bins)   (float32, truncation), i == bins -> bins-1
 * which is ATen's histc CPU kernel (LINEAR_INTERPOLATION, no local search) with float edges.
 * When hi - lo overflows float (a range wider than FLT_MAX) the same formula runs in double. */
#ifndef QCAL_OBSERVERS_HISTOGRAM_BIN_H
#define QCAL_OBSERVERS_HISTOGRAM_BIN_H

#include <stdbool.h>
#include <stdint.h>

#include "observers/histogram_dsp.h"

/* Batches of at most this many values are binned by plain loops, without scratch. */
#define QCAL_HIST_SMALL_BATCH 1024

/* Grids of at least this many slots are binned by the same plain loop, one thread, straight
 * into the counts: their sub-histograms and per-thread partials would not fit any cache
 * (and the SIMD kernels' uint16 slots stop at 2^16), and each batch would pay for zeroing
 * and sweeping them (16777216 bins: 1.5 GB and ~7 s a 1 MiB part; docs/observers.md,
 * "Cost of large bin counts"). */
#define QCAL_HIST_DIRECT_SLOTS 65536

/* Runs the family's kernel for one grid (hg: first-batch, else lg: lattice; fused: the
 * `_inside` version) over x with OpenMP above qcal_threads_for(n): thread t bins
 * x[t*n/threads, (t+1)*n/threads) into its own partial counts and sub-histograms, and the
 * integer partials are added in thread order, so counts never depend on the thread count.
 * First-batch: counts[0..bins), top-edge values folded into the last bin and added to *top;
 * lattice: counts[0..accept). Fused: *mn / *mx / *nonfinite of all of x, and the counts are
 * added only if everything was inside (and, with reject_nonfinite, nothing non-finite):
 * *binned. QCAL_ERR_NO_MEMORY / QCAL_ERR_OVERFLOW for scratch (counts untouched). */
qcal_status qcal_hist_bin_threaded(const float *x, int64_t n, const qcal_histc_grid *hg,
                                   const qcal_lattice_grid *lg, bool fused,
                                   bool reject_nonfinite, uint64_t *counts, uint64_t *top,
                                   float *mn, float *mx, uint64_t *nonfinite, bool *binned);

/* Adds the histogram of x[0..n) (of |x| if absval) over [lo, hi] (lo < hi, both finite) into
 * counts[0..bins); *top += how many of them sit on the top edge (index == bins before the
 * last-bin rule; they are also in counts[bins-1]). Values outside [lo, hi] and NaN are not
 * counted. Uses OpenMP above qcal_threads_for(n); integer counts, so the result never
 * depends on the thread count. QCAL_ERR_NO_MEMORY if scratch cannot be allocated (counts
 * then untouched). */
qcal_status qcal_f32_histc(const float *x, int64_t n, float lo, float hi, int32_t bins,
                           bool absval, uint64_t *counts, uint64_t *top);
/* One pass over x[0..n) for a batch that probably fits the grid: min / max of its finite
 * values into *mn / *mx ((+inf, -inf) if none) and their count of non-finite ones into
 * *nonfinite (as qcal_f32_minmax), and, if every finite value (|x| if absval) lies in
 * [lo, hi] (and, with reject_nonfinite, none is NaN/Inf), its histogram added into counts
 * and *top as qcal_f32_histc would, with *binned = true. Otherwise *binned = false and
 * counts / top are untouched (binning stops early; the min/max still cover all of x).
 * lo < hi; a grid whose width overflows float takes the C path. OpenMP above
 * qcal_threads_for(n); results independent of ISA and thread count. */
qcal_status qcal_f32_histc_inside(const float *x, int64_t n, float lo, float hi, int32_t bins,
                                  bool absval, bool reject_nonfinite, uint64_t *counts,
                                  uint64_t *top, float *mn, float *mx, uint64_t *nonfinite,
                                  bool *binned);

#endif
