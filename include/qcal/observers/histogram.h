/* qcal histogram observer family: "histogram" (L2 search, PyTorch), "percentile", "entropy"
 * (KL, TensorRT) and "mse" (NVIDIA). All four are used through the object API of
 * qcal/observer.h (qcal_observer_create with kind QCAL_OBSERVER_HISTOGRAM, _PERCENTILE,
 * _ENTROPY or _MSE); this header documents what they compute and declares the two
 * introspection calls reports use (bins of the searched histogram, objective curves).
 *
 * COLLECTION (all four). Config: bins (default 2048), grid (default lattice), nonfinite
 *   (default skip-and-count). NaN/Inf are never binned: skipped and counted, or
 *   QCAL_ERR_NONFINITE with the observer unchanged under QCAL_NONFINITE_ERROR. Counts are
 *   exact uint64 (PyTorch keeps float32); AVX2/AVX-512 kernels with a C reference, OpenMP
 *   above qcal_threads_for: results never depend on ISA or thread count.
 *   - histogram, percentile two-tails: values x; entropy, mse, percentile abs: |x|.
 *   - ASYMMETRIC TARGETS (an affine qscheme with an integer dtype, the default quint8
 *     per_tensor_affine): entropy, mse and percentile (mode auto, its default) keep x and
 *     search both ends (below); symmetric targets (qint8 per_tensor_symmetric, float8) keep
 *     |x| and TensorRT's / NVIDIA's searches as before. Observer state version 3; version 2
 *     states of affine entropy / mse held |x| and are refused.
 *
 * GRID LATTICE (default, QCAL_GRID_LATTICE, "lattice"): everything the observer reports
 *   (qrange, qparams, data_range, saved state except the batch counter) is a function of
 *   the multiset of finite values seen: not of batch order, batch sizes or how batches
 *   were split over observers merged afterwards. Bit for bit.
 *   - Cells of width 2^e anchored at zero: value v goes to cell floor(v * 2^-e) (exact in
 *     float). e is the smallest exponent (>= -127) for which the cells from the data's min
 *     to its max number at most 2 * bins and every cell index lies in [-2^24, 2^24): a
 *     function of the data range alone, growing with it. Growth doubles the width (cell j
 *     -> j >> 1), merges align both sides to the larger e and add counts: both exact.
 *     Between bins and 2 * bins cells cover the data (fewer only for data far narrower than
 *     its magnitude, where cells reach the float spacing). Exact min and max are kept.
 *   - A batch inside the current window is read once (min/max, non-finite count and
 *     binning fused); otherwise a min/max pass, the re-gridding and a binning pass.
 *   - Range choice runs on a view: `bins` equal bins over [min, max] of the data (|x|
 *     kinds: [0, max|x|]), each cell's count spread uniformly over the part of the cell
 *     inside the data range, cumulative counts rounded to integers (totals exact). The
 *     searches below then run unchanged on the view, and every clipping range lies inside
 *     the data: histogram and percentile two-tails within [min, max]; |x| kinds t <=
 *     max|x|.
 *   - State: canonical payload (i32 e, i64 first cell, u32 cells, f32 min, f32 max, u64
 *     total, u64 counts of the cells from min's to max's), at most 36 + 16 * bins bytes
 *     (32.8 KB for 2048 bins); the same data gives the same bytes.
 *   - data_range: [min, max] of the data (|x| kinds: [-max|x|, max|x|], or [0, max|x|] if
 *     no value < 0).
 *
 * GRID FIRST-BATCH (QCAL_GRID_FIRST_BATCH, "first-batch"): bins over the first batch's
 *   exact range; the answer after growth depends on batch order. Not PyTorch's numbers
 *   (PyTorch truncates the bounds with int() and resamples on growth: grid torch below).
 *   - First batch: [lo, hi] = [min, max] of the batch (|x|: [0, max|x|]); bin index as
 *     torch.histc's CPU kernel with float bounds: (int64)((x - lo) / (hi - lo) * bins) in
 *     float32, x == hi in the last bin - verified against torch.histc next to every edge.
 *     PyTorch 1.13's HistogramObserver truncates min/max with int() before histc (a
 *     defect fixed in later PyTorch); qcal does not.
 *   - Later batches inside [lo, hi] are binned on the same grid. A batch outside grows the
 *     grid: the bin width is multiplied by the smallest power of two 2^k such that, with lo
 *     moved down by a whole number of new bins, the grid covers the batch; old bin i goes to
 *     new bin m + (i >> k), exactly, and values that sat exactly on the old top edge move to
 *     hi's bin in the new grid. The new grid's spare bins go below and above in proportion
 *     to how far the batch passed the data seen so far on each side. For |x| grids hi
 *     simply doubles. New edges are computed in double and rounded to float. If they are
 *     not finite in float (ranges near FLT_MAX) the grid becomes [min, max] of everything
 *     and old counts are spread linearly (total preserved).
 *     PyTorch instead resamples the old histogram approximately (_combine_histograms,
 *     upsample_rate): density assumed uniform in each bin, result dependent on batch order.
 *     qcal's growth depends on the first batch's range (the lattice origin) but never
 *     resamples. (qcal has no upsample_rate: the lattice grid needs no resampling.)
 *   - A constant batch gives a zero-width grid (lo == hi, all counts in bin 0).
 *   - merge(dst, src): dst grows as for a batch covering src's grid, then src's counts are
 *     added: exactly when src's bins nest in the new grid, otherwise each src bin's count is
 *     spread linearly over the merged bins it overlaps (total exact).
 *   - save/load: grid, data min/max, total, top-edge count and every count.
 *   - data_range: the grid ([lo, hi]; |x| grids: [-hi, hi], or [0, hi] if no value < 0).
 *
 * GRID TORCH (QCAL_GRID_TORCH, "torch"; kind histogram only): PyTorch 1.13's
 *   HistogramObserver bit for bit after any sequence of batches: its buffers histogram
 *   (float32 counts), min_val and max_val, and calculate_qparams.
 *   - First batch, or any batch while min_val == max_val (the old counts are dropped, as
 *     PyTorch): min/max of the batch; torch.histc(x, bins, int(min), int(max)): bounds
 *     truncated toward zero, values outside them not counted; equal bounds take the
 *     batch's own min/max, still equal widened by 1; last edge as torch.linspace.
 *   - Later batches: _adjust_min_max (float32: hist_bin_width = (max - min) / (bins * 128),
 *     downsample_rate D = ceil(range / (bins * width)), max += D * bins * width - range,
 *     start_idx = round-half-even((min_val - new min) / width)), torch.histc over the
 *     truncated new bounds, then counts added if the range is unchanged, else
 *     _combine_histograms: old counts upsampled 128 times at start_idx, cumulative sums in
 *     double sampled every D cells, differences against the previous sum rounded to float,
 *     / 128, to float, added.
 *   - Non-finite values are skipped and counted (PyTorch raises); QCAL_NONFINITE_ERROR
 *     refuses the batch. Counts per batch are exact integers made float (PyTorch's float
 *     counter saturates at 2^24 per bin and thread). A growth PyTorch cannot do (old
 *     histogram outside the combined cells, infinite downsample rate) is
 *     QCAL_ERR_UNSUPPORTED, observer unchanged.
 *   - merge: only with an empty side (the result is the other side); two non-empty sides
 *     are QCAL_ERR_UNSUPPORTED (PyTorch has no merge; its histogram depends on order).
 *   - save/load: the three buffers. qcal_observer_histogram_torch_get / _set read and replace
 *     them (a torch.ao state_dict). data_range: [min_val, max_val].
 *   - Introspection: qcal_observer_histogram_bins and qcal_observer_histogram_search_curve are
 *     QCAL_ERR_UNSUPPORTED (float counts): use qcal_observer_histogram_torch_get.
 *
 * RANGE CHOICE (qcal_observer_qrange; qcal_observer_qparams then applies the qscheme), on
 * the first-batch or torch histogram or the lattice's view ([lo, hi] below):
 *   histogram: PyTorch 1.13 HistogramObserver._non_linear_param_search on the counts as
 *     float32 over [lo, hi] with dst_nbins = 2^bits of the dtype (256, or 2^32 for qint32),
 *     reproducing its float32/float64 arithmetic, torch.cumsum (double accumulation) and
 *     torch.sum's cascade order (8-lane AVX2 build): the same histogram, min and max give
 *     PyTorch's new_min/new_max bit for bit (tested on 12 PyTorch histograms). Deviation: a
 *     range wider than FLT_MAX is searched at 1/4 scale (exact) where PyTorch returns NaN.
 *     Zero-width grid: (lo, lo), as PyTorch.
 *   percentile (percentile default 99.99 as NVIDIA pytorch-quantization; ONNX Runtime uses
 *     99.999): abs mode (default) clips at the p-th percentile t of |x|; two-tails mode
 *     (signed histogram) at the (100-p)/2-th and (100+p)/2-th percentiles of x: 100 - p
 *     percent clipped in both modes, split evenly over the two tails as ONNX Runtime's
 *     non-symmetric calibrator does. Inside the bin where the cumulative count reaches q * total the
 *     value is interpolated linearly (uniform density in the bin). NVIDIA returns the
 *     lower edge of that bin; ONNX Runtime the upper edge.
 *   entropy (entropy_levels default 128, needs bins > levels), symmetric targets (affine:
 *     the two-ended search below): TensorRT's KL search on the |x| histogram with its first bin clamped to the second: B[0] = min(B[0], B[1]). For
 *     each candidate i in [levels, bins]: P = B[0..i-1] with the mass beyond added to
 *     P[i-1]; Q = the unclipped B[0..i-1] merged into `levels` levels (bin j -> level
 *     j*levels/i, integer division) and spread evenly over each level's non-zero bins;
 *     p = P/total, q = Q/(total - outliers); KL = sum p_j log(p_j/q_j) (infinite if
 *     q_j = 0 < p_j); threshold t = i * bin width for the first (smallest) i of minimal
 *     KL (t = hi if only bin 0 holds data).
 *     Why the clamp: exact zeros of ReLU / max-pool outputs form a spike in bin 0 that Q
 *     smears over a whole level, so the plain TensorRT search clips far too low. Zero is
 *     reproduced exactly for every t, so the spike is noise for the search. Excluding
 *     exact zeros (ncnn) needs a zero count kept with the histogram (extra pass, state,
 *     file format); the clamp needs nothing and also flattens near-zero spikes. NVIDIA
 *     pytorch-quantization copies B[0] = B[1], which also adds mass to a sparse first bin
 *     (lognormal); min() does not. The measurements on the demo CNN are in
 *     docs/observers.md ("Entropy and the zero spike").
 *     Levels: `entropy_levels` for signed and non-negative data alike. TensorRT's 128 comes
 *     from symmetric int8; NVIDIA searches 256 for unsigned 8-bit, the quint8 [0, t]
 *     analogue, but on the demo 256 clips more (docs/observers.md), so the default stays
 *     128; set entropy_levels = 256 for NVIDIA's unsigned search. Other differences: ncnn
 *     (threshold (i+0.5)*w, Q from P), ONNX Runtime (signed histogram), NVIDIA (last
 *     argmin, linspace level map).
 *     Each KL is the sum of its terms evaluated almost exactly (per-level prefix sums in
 *     double-double; ~1e-13 relative to a float64 term-by-term sum, exactly 0 when every
 *     term is 0). Search timings: docs/observers.md.
 *   mse, symmetric targets (affine: the two-ended search below): NVIDIA HistogramCalibrator
 *     style on the |x| histogram: candidates amax = centre of bin i, i in [min(128, bins-1), bins); error = sum_j count_j (deq(c_j) - c_j)^2 over
 *     bin centres c_j with deq(c) = min(nearbyint(c/s), L) * s, s = amax / L, L = 255 for
 *     non-negative data with per_tensor_affine, else (quant_max - quant_min) / 2 (127);
 *     first minimal mean error wins; t = (i + 0.5) * bin width. The errors are compared
 *     exactly (integer sums; a float64 sum, as numpy's, agrees to ~1e-15 relative).
 *   Two-ended searches (asymmetric targets), on a signed histogram of x: entropy and mse
 *     on `bins` bins over [min(0, min), max(0, max)] (an affine grid always holds zero, so
 *     data away from zero leave the bins between zero and the data empty, as |x| does;
 *     the lattice view, or the first-batch grid re-binned linearly), percentile two-tails
 *     on [min, max]. A window [a, b) of bins is chosen by coordinate descent (the best b
 *     for the current a, the smallest on ties, then the best a for that b, the largest on
 *     ties, from [0, bins), until a round no longer lowers the objective); windows contain
 *     the bin of zero.
 *     entropy: P = counts[a..b) with the mass below a added to P[a] and above to P[b-1];
 *       Q = the unclipped counts merged into entropy_levels levels, spread over each level's
 *       non-zero bins; b - a >= levels; the zero bin clamped to its fuller neighbour (bin 0
 *       of non-negative data: the |x| clamp). Range [lo + a w, lo + b w].
 *     mse: grid of quant_max - quant_min steps over the window's edges (the zero point's
 *       rounding left out), bin centres quantized round-half-up and clamped, exact integer
 *       errors; b - a >= min(128, bins - 1). Range: the window's edges.
 *     percentile: the two-tails mode.
 *   No degenerate minimum (entropy, both searches): a candidate that clips mass while
 *   holding data only in the bins receiving it is not a candidate (P = Q whatever is
 *   clipped: U[0.5, 1] gave [0, 0.5005]). Two-ended entropy search only: each end moves in
 *   from the data's extreme only while the window's squared error (values at bin centres,
 *   clipped ones moved to the edge, kept ones s^2 / 12 with s = window / (quant_max -
 *   quant_min)) does not rise, for the current other end; the KL chooses among those ends.
 *   TensorRT's KL prices a clipped tail by its mass alone, never by how far it reaches:
 *   unbounded, it took the narrowest window (levels bins) on every long-tailed tensor of
 *   PP-OCRv4 (see observers/entropy.c). Ranges are
 *   kept inside [min, max] of the data.
 *   Clip ranges from t (percentile abs, entropy, mse, symmetric targets): [0, t] if no
 *   negative value was seen, else [-t, t]. qcal_qparams_compute then applies the qscheme (symmetric: max(|min|,max)).
 *   No data: QCAL_NO_DATA, qparams (1, 0). All-zero data: (0, 0), finite scale.
 */
#ifndef QCAL_OBSERVERS_HISTOGRAM_H
#define QCAL_OBSERVERS_HISTOGRAM_H

#include "qcal/observer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- introspection (reports) ------------------------------------------------------------
 * Both calls take an observer of the histogram family (QCAL_ERR_INVALID_ARG otherwise) and
 * return QCAL_NO_DATA with *n = 0 when it has seen nothing. */

/* The histogram the range search runs on: lattice grid: `bins` equal bins over the data
 * range ([0, max|x|] for entropy, mse and abs percentile), re-binned from the lattice;
 * first-batch grid: its bins. edges[0..*n] (cap + 1 entries) and counts[0..*n) (cap
 * entries); *n = bins (QCAL_ERR_INVALID_ARG if cap < bins). Torch grid (float counts):
 * QCAL_ERR_UNSUPPORTED, read qcal_observer_histogram_torch_get instead (also for
 * qcal_observer_histogram_search_curve below). */
QCAL_API qcal_status qcal_observer_histogram_bins(const qcal_observer *obs, int64_t cap,
                                                  double *edges, uint64_t *counts,
                                                  int64_t *n);

/* The objective curve of the range search: candidate k in [0, *n) clips to [lo[k], hi[k]]
 * with error err[k]; *chosen is the candidate the observer's qrange picked. histogram: the
 * candidates PyTorch's greedy L2 search evaluates, in visit order (err: its L2 estimate;
 * the last one is the rejected step when the search stopped on a rise); entropy: every
 * threshold i * width, i in [entropy_levels, bins] (err: KL divergence, +inf where it is
 * undefined); mse: every bin centre from bin min(128, bins - 1) up (err: mean squared
 * error). percentile has no objective: QCAL_ERR_UNSUPPORTED. cap: capacity of lo, hi and
 * err; bins + 1 always suffices (with less, the first cap are written, *n counts all).
 * *chosen is -1 if the L2 search kept the full range without evaluating a candidate. */
QCAL_API qcal_status qcal_observer_histogram_search_curve(const qcal_observer *obs, int64_t cap,
                                                          float *lo, float *hi, double *err,
                                                          int64_t *n, int64_t *chosen);

/* grid=torch (histogram kind only): PyTorch's buffers. counts[0..bins) gets torch's
 * `histogram` (float32 counts; bin i spans [min + i w, min + (i+1) w], w = (max - min) /
 * bins, though torch.histc binned each batch over int()-truncated bounds), *min_val /
 * *max_val its min_val / max_val (+inf / -inf when empty); *n = bins. QCAL_ERR_INVALID_ARG
 * for another kind or grid, or cap < bins. */
QCAL_API qcal_status qcal_observer_histogram_torch_get(const qcal_observer *obs, int64_t cap,
                                                       float *counts, float *min_val,
                                                       float *max_val, int64_t *n);
/* grid=torch: replaces the state by PyTorch buffers (a torch.ao HistogramObserver's
 * state_dict): n == bins, counts finite and >= 0, [min_val, max_val] finite with
 * min <= max, or (+inf, -inf) with zero counts for an empty observer (QCAL_ERR_FORMAT
 * otherwise, observer unchanged). */
QCAL_API qcal_status qcal_observer_histogram_torch_set(qcal_observer *obs,
                                                       const float *counts, int64_t n,
                                                       float min_val, float max_val);

#ifdef __cplusplus
}
#endif

/* The names this header's calls had before 0.2.0, kept for one release (qcal/deprecated.h;
 * defined here, once every declaration above is in place). */
#define QCAL_OBSERVERS_HISTOGRAM_DECLARED
#include "qcal/deprecated.h"
#endif
