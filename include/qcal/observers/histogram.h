/* qcal histogram observer family: "histogram" (L2 search, PyTorch), "percentile", "entropy"
 * (KL, TensorRT) and "mse" (NVIDIA). All four are used through the object API of
 * qcal/observer.h (qcal_observer_create with kind QCAL_OBSERVER_HISTOGRAM, _PERCENTILE,
 * _ENTROPY or _MSE); this header documents what they compute. It declares nothing else.
 *
 * COLLECTION (all four)
 *   Config: bins (default 2048), nonfinite (default skip-and-count). A batch that fits the
 *   current grid is read once (min/max, non-finite count and binning fused); the first batch
 *   and a batch that grows the grid take a min/max pass and then a binning pass (AVX2/AVX-512
 *   with a C reference, OpenMP above qcal_threads_for; integer counts, so results never
 *   depend on ISA or thread count).
 *   NaN/Inf are never binned: skipped and counted, or QCAL_ERR_NONFINITE with the observer
 *   unchanged under QCAL_NONFINITE_ERROR. Counts are exact uint64 (PyTorch keeps float32).
 *   - histogram, percentile two-tails: signed grid [lo, hi]; entropy, mse, percentile abs:
 *     grid over |x| on [0, hi].
 *   - First batch: [lo, hi] = [min, max] of the batch (|x|: [0, max|x|]); bin index as
 *     torch.histc's CPU kernel with float bounds: (int64)((x - lo) / (hi - lo) * bins) in
 *     float32, x == hi in the last bin - verified against torch.histc next to every edge.
 *     PyTorch 1.13's HistogramObserver truncates min/max with int() before histc (a
 *     defect fixed in later PyTorch); qcal does not.
 *   - Later batches inside [lo, hi] are binned on the same grid. A batch outside grows the
 *     grid: the bin width is multiplied by the smallest power of two 2^k such that, with lo
 *     moved down by a whole number of new bins, the grid covers the batch; old bin i goes to
 *     new bin m + (i >> k), exactly, and values that sat exactly on the old top edge move to
 *     hi's bin in the new grid. The new grid's spare bins (beyond those covering the data)
 *     go below and above in proportion to how far the batch passed the data seen so far on
 *     each side: growth at the top only keeps lo, symmetric growth stays centred. For |x|
 *     grids hi simply doubles, and the result equals binning all data at once on the final
 *     grid, bit for bit. New edges are computed in double and rounded to float (signed
 *     grids: a value within rounding of an edge may sit one bin off compared with binning
 *     everything at once). If the new edges are not finite in float (ranges near FLT_MAX)
 *     the grid becomes [min, max] of everything and old counts are spread linearly (total
 *     preserved).
 *     PyTorch instead resamples the old histogram approximately (_combine_histograms,
 *     upsample_rate): density assumed uniform in each bin, result dependent on batch order.
 *     qcal's growth depends on the first batch's range (the lattice origin) but never
 *     resamples; upsample_rate is accepted for compatibility and unused.
 *   - A constant batch gives a zero-width grid (lo == hi, all counts in bin 0); a later
 *     wider batch places that point mass in its exact bin.
 *   - merge(dst, src): dst grows as for a batch covering src's grid, then src's counts are
 *     added: exactly when src's bins nest in the new grid (same lattice: width ratio 2^j,
 *     offset a whole number of src bins; always the case for |x| grids whose first amax
 *     differ by a power of two) or src has zero width; otherwise each src bin's count is
 *     spread linearly over the merged bins it overlaps (rounded cumulative counts: the
 *     total is exact, each count moves by less than one merged bin).
 *   - save/load: grid, data min/max, total, top-edge count and every count.
 *   - data_range: the grid ([lo, hi]; |x| grids: [-hi, hi], or [0, hi] if no value < 0).
 *
 * RANGE CHOICE (qcal_observer_qrange; qcal_observer_qparams then applies the qscheme)
 *   histogram: PyTorch 1.13 HistogramObserver._non_linear_param_search on the counts as
 *     float32 over [lo, hi] with dst_nbins = 2^bits of the dtype (256, or 2^32 for qint32),
 *     reproducing its float32/float64 arithmetic, torch.cumsum (double accumulation) and
 *     torch.sum's cascade order (8-lane AVX2 build): the same histogram, min and max give
 *     PyTorch's new_min/new_max bit for bit (tested on 12 PyTorch histograms). Deviation: a
 *     range wider than FLT_MAX is searched at 1/4 scale (exact) where PyTorch returns NaN.
 *     Zero-width grid: (lo, lo), as PyTorch.
 *   percentile (percentile default 99.99 as NVIDIA pytorch-quantization; ONNX Runtime uses
 *     99.999): abs mode (default) clips at the p-th percentile t of |x|; two-tails mode
 *     (signed histogram) at the (100-p)-th and p-th percentiles of x (p < 50 uses the
 *     median for both). Inside the bin where the cumulative count reaches q * total the
 *     value is interpolated linearly (uniform density in the bin). NVIDIA returns the
 *     lower edge of that bin; ONNX Runtime the upper edge.
 *   entropy (entropy_levels default 128, needs bins > levels): TensorRT's KL search on the
 *     |x| histogram with its first bin clamped to the second: B[0] = min(B[0], B[1]). For
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
 *   mse: NVIDIA HistogramCalibrator style on the |x| histogram: candidates amax = centre of
 *     bin i, i in [min(128, bins-1), bins); error = sum_j count_j (deq(c_j) - c_j)^2 over
 *     bin centres c_j with deq(c) = min(nearbyint(c/s), L) * s, s = amax / L, L = 255 for
 *     non-negative data with per_tensor_affine, else (quant_max - quant_min) / 2 (127);
 *     first minimal mean error wins; t = (i + 0.5) * bin width. The errors are compared
 *     exactly (integer sums; a float64 sum, as numpy's, agrees to ~1e-15 relative).
 *   Clip ranges from t (percentile abs, entropy, mse): [0, t] if no negative value was seen,
 *   else [-t, t]. qcal_qparams_compute then applies the qscheme (symmetric: max(|min|,max)).
 *   No data: QCAL_NO_DATA, qparams (1, 0). All-zero data: (0, 0), finite scale.
 */
#ifndef QCAL_OBSERVERS_HISTOGRAM_H
#define QCAL_OBSERVERS_HISTOGRAM_H

#include "qcal/observer.h"

#endif
