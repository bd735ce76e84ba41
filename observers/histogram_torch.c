/* The torch grid (grid=torch): PyTorch 1.13 HistogramObserver.forward bit for bit
 * (torch/ao/quantization/observer.py: forward, _adjust_min_max, _combine_histograms, with
 * torch.histc's CPU kernel), so that calculate_qparams (histogram.c, the same L2 search as
 * the other grids) gives PyTorch's scale and zero-point after any sequence of batches.
 * Every float operation below mirrors one PyTorch tensor op on float32 (or float64 where
 * PyTorch computes in double); none may be fused or reassociated. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "observers/histogram_bin.h"
#include "observers/histogram_torch.h"
#include "observers/minmax_kernels.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

qcal_status qcal_torch_hist_init(qcal_torch_hist *h, int32_t bins)
{
    h->bins = bins;
    h->upsample_rate = 128;
    h->min_val = INFINITY;
    h->max_val = -INFINITY;
    h->hist = qcal_calloc((size_t)bins, sizeof *h->hist);
    return h->hist ? QCAL_OK : QCAL_ERR_NO_MEMORY;
}

void qcal_torch_hist_free(qcal_torch_hist *h)
{
    free(h->hist);
    h->hist = NULL;
}

void qcal_torch_hist_clear(qcal_torch_hist *h)
{
    h->min_val = INFINITY;
    h->max_val = -INFINITY;
    if (h->hist)
        memset(h->hist, 0, (size_t)h->bins * sizeof *h->hist);
}

bool qcal_torch_hist_empty(const qcal_torch_hist *h)
{
    return h->min_val == INFINITY && h->max_val == -INFINITY;
}

float qcal_torch_linspace_last(float start, float end, int64_t steps)
{
    if (steps < 2)
        return start;
    /* RangeFactoriesKernel.cpp: step = (end - start) / (steps - 1) in float; index idx >=
     * steps / 2 is end - step * (steps - idx - 1), which this build compiles as one fused
     * multiply-add. The vectorised loop fills 2 vectors of 8 floats at a time
     * (Vectorized<float>::arange(base, step): lane k = base + k * step) and the scalar loop
     * the remainder, so the last element is end itself (fma(-step, 0, end)) unless it
     * falls in a vector chunk (steps % 16 == 0): lane 7 of base = fma(-step, 7, end).
     * Checked against torch.linspace on 59,850 (start, end, steps) triples. */
    float step = (end - start) / (float)(steps - 1);
    if (steps % 16 != 0)
        return end;
    float base = fmaf(-step, 7.0f, end);
    float k7 = 7.0f * step;
    return base + k7;
}

/* torch.histc(x, bins, min=int(lo_t), max=int(hi_t)) on the finite values x[0..n), whose
 * min / max are amin / amax; the counts are added to out (set: out is overwritten). */
static qcal_status torch_histc(const float *x, int64_t n, float lo_t, float hi_t, float amin,
                               float amax, int32_t bins, float *out, bool set)
{
    /* int() truncates toward zero (the 1.13 defect); Scalar -> double. */
    double left = (double)truncf(lo_t), right = (double)truncf(hi_t);
    /* histc_select_outer_bin_edges: equal edges take the input's own min / max, and if
     * still equal are widened by 1 (in double). */
    if (left == right) {
        left = amin;
        right = amax;
    }
    if (left == right) {
        left -= 1.0;
        right += 1.0;
    }
    /* torch.linspace(left, right, bins + 1) in float32: the kernel reads its first and
     * last element. */
    float lo = (float)left;
    float hi = qcal_torch_linspace_last(lo, (float)right, (int64_t)bins + 1);
    if (!(lo < hi) || !isfinite(lo) || !isfinite(hi))
        return qcal_error(QCAL_ERR_UNSUPPORTED,
                          "grid=torch: torch.histc's float edges [%.9g, %.9g] are empty "
                          "(PyTorch's kernel is undefined there)", (double)lo, (double)hi);
    uint64_t *counts = qcal_calloc((size_t)bins, sizeof *counts);
    if (!counts)
        return QCAL_ERR_NO_MEMORY;
    uint64_t top = 0;
    qcal_status st = qcal_f32_histc(x, n, lo, hi, bins, false, counts, &top);
    if (st == QCAL_OK) {
        /* Integer counts made float32 (PyTorch counts in float: equal below 2^24 per bin
         * and batch). */
        for (int32_t i = 0; i < bins; i++)
            out[i] = set ? (float)counts[i] : out[i] + (float)counts[i];
    }
    free(counts);
    return st;
}

/* _combine_histograms(new_hist, old, U, D, start_idx, bins): old upsampled U times into a
 * zero array of bins * D cells at start_idx, cumulative sums in double sampled every D-th
 * cell, differences (the previous sample rounded to float, as the shifted float tensor
 * holds it) divided by U in double, made float and added to new_hist. The zero cells add
 * nothing to the double cumulative sum, so only the bins * U occupied cells are summed. */
static void combine(float *new_hist, const float *old, int32_t bins, int64_t U, int64_t D,
                    int64_t start_idx)
{
    const int64_t occupied_end = start_idx + (int64_t)bins * U;
    double run = 0.0;       /* cumsum up to the current cell */
    int64_t cell = start_idx;   /* next occupied cell to add */
    float prev_f = 0.0f;    /* shifted_integral_histogram[j] */
    for (int64_t j = 0; j < bins; j++) {
        const int64_t upto = (j + 1) * D - 1;   /* integral_histogram[j] = cumsum[upto] */
        while (cell < occupied_end && cell <= upto) {
            run += (double)old[(cell - start_idx) / U];
            cell++;
        }
        double interp = (run - (double)prev_f) / (double)U;
        new_hist[j] = new_hist[j] + (float)interp;
        prev_f = (float)run;
    }
}

/* Finite values of x, or x itself if all are finite (*owned = NULL). */
static qcal_status finite_values(const float *x, int64_t n, uint64_t nf, const float **out,
                                 int64_t *m, float **owned)
{
    *owned = NULL;
    *out = x;
    *m = n;
    if (nf == 0)
        return QCAL_OK;
    float *y = qcal_malloc((size_t)(n - (int64_t)nf) * sizeof *y + sizeof *y);
    if (!y)
        return QCAL_ERR_NO_MEMORY;
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(x[i]))
            y[k++] = x[i];
    *owned = y;
    *out = y;
    *m = k;
    return QCAL_OK;
}

qcal_status qcal_torch_hist_update(qcal_torch_hist *h, const float *x, int64_t n,
                                   qcal_nonfinite_policy policy, uint64_t *nonfinite)
{
    float bmin, bmax;
    uint64_t nf = 0;
    qcal_f32_minmax(x, n, &bmin, &bmax, &nf);
    *nonfinite += nf;
    if (nf > 0 && policy == QCAL_NONFINITE_ERROR)
        return qcal_error(QCAL_ERR_NONFINITE, "batch holds %llu NaN/Inf values",
                          (unsigned long long)nf);
    const float *v;
    int64_t m;
    float *owned;
    qcal_status st = finite_values(x, n, nf, &v, &m, &owned);
    if (st != QCAL_OK)
        return st;
    if (m == 0) {   /* nothing finite: PyTorch returns early on numel() == 0 */
        free(owned);
        return QCAL_OK;
    }
    const int32_t bins = h->bins;
    float *nh = qcal_malloc((size_t)bins * sizeof *nh);
    if (!nh) {
        free(owned);
        return QCAL_ERR_NO_MEMORY;
    }
    float cmin, cmax;
    if (qcal_torch_hist_empty(h) || h->min_val == h->max_val) {
        /* First batch (or every value so far equal): the old histogram is replaced. */
        cmin = bmin;
        cmax = bmax;
        st = torch_histc(v, m, bmin, bmax, bmin, bmax, bins, nh, true);
    } else {
        const float min_val = h->min_val, max_val = h->max_val;
        cmin = fminf(bmin, min_val);
        cmax = fmaxf(bmax, max_val);
        /* _adjust_min_max, float32 tensor ops with Python ints made float. */
        const int64_t U = h->upsample_rate;
        const float hist_bin_width = (max_val - min_val) / (float)((int64_t)bins * U);
        const float span = (float)bins * hist_bin_width;
        const float q = ceilf((cmax - cmin) / span);
        /* D cells per new bin are never allocated (combine sums only the occupied ones);
         * the bound keeps (bins + 1) * D inside int64. */
        const double qmax = 4e18 / ((double)bins + 1.0);
        if (!(q >= 1.0f && (double)q <= qmax)) {
            st = qcal_error(QCAL_ERR_UNSUPPORTED,
                            "grid=torch: range [%.9g, %.9g] grows to [%.9g, %.9g], a "
                            "downsample rate of %g; PyTorch would allocate %g x %d cells",
                            (double)min_val, (double)max_val, (double)cmin, (double)cmax,
                            (double)q, (double)q, (int)bins);
            goto done;
        }
        const int64_t D = (int64_t)q;
        const float e = (float)D * span - (cmax - cmin);
        cmax = cmax + e;
        const float sidx = nearbyintf((min_val - cmin) / hist_bin_width);
        const int64_t start_idx = sidx >= 0.0f && (double)sidx <= qmax ? (int64_t)sidx : -1;
        if (start_idx < 0 || start_idx + (int64_t)bins * U > (int64_t)bins * D) {
            /* PyTorch's slice assignment fails on a size mismatch here. */
            st = qcal_error(QCAL_ERR_UNSUPPORTED,
                            "grid=torch: the old histogram (start %lld, %lld cells) does not "
                            "fit the %lld combined cells (PyTorch raises here too)",
                            (long long)start_idx, (long long)((int64_t)bins * U),
                            (long long)((int64_t)bins * D));
            goto done;
        }
        st = torch_histc(v, m, cmin, cmax, bmin, bmax, bins, nh, true);
        if (st != QCAL_OK)
            goto done;
        if (cmin == min_val && cmax == max_val) {
            for (int32_t i = 0; i < bins; i++)
                nh[i] = nh[i] + h->hist[i];
        } else {
            combine(nh, h->hist, bins, U, D, start_idx);
        }
    }
done:
    free(owned);
    if (st != QCAL_OK) {
        free(nh);
        return st;
    }
    free(h->hist);
    h->hist = nh;
    h->min_val = cmin;
    h->max_val = cmax;
    return QCAL_OK;
}

qcal_status qcal_torch_hist_merge(qcal_torch_hist *dst, const qcal_torch_hist *src)
{
    if (qcal_torch_hist_empty(src))
        return QCAL_OK;
    if (!qcal_torch_hist_empty(dst))
        return qcal_error(QCAL_ERR_UNSUPPORTED,
                          "grid=torch histograms cannot be merged: PyTorch's histogram "
                          "depends on batch order and has no merge (use grid=lattice, "
                          "whose merges are exact)");
    return qcal_torch_hist_set(dst, src->min_val, src->max_val, src->hist, src->bins);
}

void qcal_torch_hist_save(const qcal_torch_hist *h, qcal_buf *b)
{
    qcal_buf_u32(b, (uint32_t)h->bins);
    qcal_buf_u32(b, (uint32_t)h->upsample_rate);
    qcal_buf_f32(b, h->min_val);
    qcal_buf_f32(b, h->max_val);
    for (int32_t i = 0; i < h->bins; i++)
        qcal_buf_f32(b, h->hist[i]);
}

qcal_status qcal_torch_hist_set(qcal_torch_hist *h, float min_val, float max_val,
                                const float *hist, int32_t bins)
{
    if (bins != h->bins)
        return qcal_error(QCAL_ERR_FORMAT, "torch histogram has %d bins, the observer %d",
                          (int)bins, (int)h->bins);
    bool empty = min_val == INFINITY && max_val == -INFINITY;
    if (!empty && !(isfinite(min_val) && isfinite(max_val) && min_val <= max_val))
        return qcal_error(QCAL_ERR_FORMAT, "torch histogram range [%g, %g] is not a finite "
                          "range (or +inf, -inf when empty)", (double)min_val,
                          (double)max_val);
    for (int32_t i = 0; i < bins; i++)
        if (!(hist[i] >= 0.0f && hist[i] <= FLT_MAX) || (empty && hist[i] != 0.0f))
            return qcal_error(QCAL_ERR_FORMAT, "torch histogram bin %d holds %g (counts are "
                              "finite, >= 0, and 0 when empty)", (int)i, (double)hist[i]);
    float *nh = qcal_malloc((size_t)bins * sizeof *nh);
    if (!nh)
        return QCAL_ERR_NO_MEMORY;
    memcpy(nh, hist, (size_t)bins * sizeof *nh);
    free(h->hist);
    h->hist = nh;
    h->min_val = min_val;
    h->max_val = max_val;
    return QCAL_OK;
}

qcal_status qcal_torch_hist_load(qcal_torch_hist *h, qcal_cursor *c)
{
    uint32_t bins, up;
    float mn, mx;
    if (!qcal_cur_u32(c, &bins) || !qcal_cur_u32(c, &up) || !qcal_cur_f32(c, &mn) ||
        !qcal_cur_f32(c, &mx))
        return qcal_error(QCAL_ERR_FORMAT, "torch histogram state is truncated");
    if (bins != (uint32_t)h->bins || up != (uint32_t)h->upsample_rate)
        return qcal_error(QCAL_ERR_FORMAT, "torch histogram state has %u bins (upsample "
                          "%u), config says %d (upsample %d)", (unsigned)bins, (unsigned)up,
                          (int)h->bins, (int)h->upsample_rate);
    if (c->left < (size_t)bins * 4)
        return qcal_error(QCAL_ERR_FORMAT, "torch histogram state is truncated in its %u "
                          "counts", (unsigned)bins);
    float *tmp = qcal_malloc((size_t)bins * sizeof *tmp);
    if (!tmp)
        return QCAL_ERR_NO_MEMORY;
    for (uint32_t i = 0; i < bins; i++)
        qcal_cur_f32(c, &tmp[i]);
    qcal_status st = qcal_torch_hist_set(h, mn, mx, tmp, (int32_t)bins);
    free(tmp);
    return st;
}
