/* The "histogram" observer: PyTorch 1.13 HistogramObserver's L2-norm range search on a
 * histogram grown exactly (histogram_lattice.c, histogram_first_batch.c). See
 * include/qcal/observers/histogram.h. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "observers/histogram_kinds.h"
#include "qcal/observers/histogram.h"

/* Every float operation below mirrors one PyTorch tensor op; none may be fused. */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* ---- torch.sum emulation --------------------------------------------------------------
 * ATen 1.13 SumKernel.cpp cascade_sum, contiguous inner reduction, acc type float,
 * Vectorized<float> of 8 lanes (this PyTorch build's CPU capability is AVX2):
 *   row_sum over n/8 vectors: multi_row_sum of 4 interleaved rows (ILP) with 4 cascade
 *   levels, leftover vectors into row 0, rows 1..3 added into row 0; then a scalar
 *   accumulator takes the n % 8 trailing elements and then the 8 lanes in order.
 * n < 8 takes the same path with 1-lane "vectors". */
#define TS_LANES 8

static int64_t ceil_log2(int64_t x)
{
    if (x <= 2)
        return 1;
    return 64 - __builtin_clzll((unsigned long long)(x - 1));
}

/* acc[k][0..lanes) = sum over rows i of element (i, k); element (i, k) is the `lanes`
 * floats at x + i * row_stride + k * lanes. */
static void multi_row_sum(const float *x, int64_t row_stride, int64_t size, int lanes,
                          float out[4][TS_LANES])
{
    const int levels = 4;
    int64_t level_power = ceil_log2(size) / levels;
    if (level_power < 4)
        level_power = 4;
    const int64_t level_step = (int64_t)1 << level_power;
    const int64_t level_mask = level_step - 1;
    float acc[4][4][TS_LANES];
    memset(acc, 0, sizeof acc);
    int64_t i = 0;
    while (i + level_step <= size) {
        for (int64_t j = 0; j < level_step; ++j, ++i)
            for (int k = 0; k < 4; k++)
                for (int l = 0; l < lanes; l++)
                    acc[0][k][l] += x[i * row_stride + k * lanes + l];
        for (int j = 1; j < levels; ++j) {
            for (int k = 0; k < 4; k++)
                for (int l = 0; l < lanes; l++) {
                    acc[j][k][l] += acc[j - 1][k][l];
                    acc[j - 1][k][l] = 0.0f;
                }
            int64_t mask = level_mask << (j * level_power);
            if ((i & mask) != 0)
                break;
        }
    }
    for (; i < size; ++i)
        for (int k = 0; k < 4; k++)
            for (int l = 0; l < lanes; l++)
                acc[0][k][l] += x[i * row_stride + k * lanes + l];
    for (int j = 1; j < levels; ++j)
        for (int k = 0; k < 4; k++)
            for (int l = 0; l < lanes; l++)
                acc[0][k][l] += acc[j][k][l];
    memcpy(out, acc[0], sizeof acc[0]);
}

/* row_sum over `count` elements of `lanes` floats: result lanes into res. */
static void row_sum(const float *x, int64_t count, int lanes, float res[TS_LANES])
{
    float part[4][TS_LANES];
    int64_t size_ilp = count / 4;
    multi_row_sum(x, 4 * (int64_t)lanes, size_ilp, lanes, part);
    for (int64_t i = size_ilp * 4; i < count; ++i)
        for (int l = 0; l < lanes; l++)
            part[0][l] += x[i * lanes + l];
    for (int k = 1; k < 4; ++k)
        for (int l = 0; l < lanes; l++)
            part[0][l] += part[k][l];
    memcpy(res, part[0], sizeof part[0]);
}

float qcal_torch_sum_f32(const float *x, int64_t n)
{
    float res[TS_LANES];
    if (n < TS_LANES) {
        row_sum(x, n, 1, res);
        return 0.0f + res[0];
    }
    int64_t nvec = n / TS_LANES;
    row_sum(x, nvec, TS_LANES, res);
    float acc = 0.0f;
    for (int64_t k = nvec * TS_LANES; k < n; ++k)
        acc += x[k];
    for (int l = 0; l < TS_LANES; l++)
        acc += res[l];
    return 0.0f + acc;   /* the output tensor is zero-filled, then accumulated into */
}

/* ---- _compute_quantization_error ------------------------------------------------------ */

/* torch.div(a, b, rounding_mode='floor') for float (c10 div_floor_floating). */
static inline float div_floor_f(float a, float b)
{
    if (b == 0.0f)
        return a / b;
    float mod = fmodf(a, b);
    float div = (a - mod) / b;
    if (mod != 0.0f && (b < 0.0f) != (mod < 0.0f))
        div -= 1.0f;
    float fl;
    if (div != 0.0f) {
        fl = floorf(div);
        if (div - fl > 0.5f)
            fl += 1.0f;
    } else {
        fl = copysignf(0.0f, a / b);
    }
    return fl;
}

static inline float clampf(float v, float lo, float hi)
{
    /* torch.clamp: min then max, NaN propagates. */
    if (isnan(v))
        return v;
    return v < lo ? lo : (v > hi ? hi : v);
}

/* _get_norm: density * ((e^3 - b^3) / 3), each op rounded to float. */
static inline float get_norm(float b, float e, float density)
{
    float e3 = e * e;
    e3 = e3 * e;
    float b3 = b * b;
    b3 = b3 * b;
    float norm = (e3 - b3) / 3.0f;
    return density * norm;
}

static double quantization_error(const float *hist, int32_t bins, float min_val,
                                 float max_val, double dst_nbins, int32_t s, int32_t e,
                                 float *norm)
{
    /* Python floats (double) first, as in the PyTorch code. */
    double bin_width = ((double)max_val - (double)min_val) / bins;
    double dst_bin_width = bin_width * (double)(e - s + 1) / dst_nbins;
    if (dst_bin_width == 0.0)
        return 0.0;
    /* Python scalars meet float32 tensors: cast to float. */
    const float bw = (float)bin_width, dbw = (float)dst_bin_width;
    const float half = (float)(dst_bin_width / 2), nhalf = (float)(-dst_bin_width / 2);
    const float top = (float)(dst_nbins - 1);
    /* The middle term's norm is a 0-dim tensor: ((half^3) - (nhalf^3)) / 3 in float. */
    float h3 = half * half;
    h3 = h3 * half;
    float n3 = nhalf * nhalf;
    n3 = n3 * nhalf;
    const float mid_norm = (h3 - n3) / 3.0f;
    for (int32_t i = 0; i < bins; i++) {
        float sb = (float)(i - s) * bw;
        float se = sb + bw;
        float db = clampf(div_floor_f(sb, dbw), 0.0f, top);
        float dbc = (db + 0.5f) * dbw;
        float de = clampf(div_floor_f(se, dbw), 0.0f, top);
        float density = hist[i] / bw;
        float acc = 0.0f + get_norm(sb - dbc, half, density);
        float cnt = (de - db) - 1.0f;
        acc = acc + cnt * (density * mid_norm);
        float dec = de * dbw + half;
        acc = acc + get_norm(nhalf, se - dec, density);
        norm[i] = acc;
    }
    return (double)qcal_torch_sum_f32(norm, bins);
}

/* First index in [lo, hi) with c[i] >= t, or hi (c is non-decreasing). */
static int32_t first_ge(const float *c, int32_t lo, int32_t hi, float t)
{
    while (lo < hi) {
        int32_t m = lo + (hi - lo) / 2;
        if (c[m] < t)
            lo = m + 1;
        else
            hi = m;
    }
    return lo;
}

qcal_status qcal_hist_l2_search(const float *hist, int32_t bins, float min_val,
                                float max_val, double dst_nbins, float *new_min,
                                float *new_max)
{
    return qcal_hist_l2_search_trace(hist, bins, min_val, max_val, dst_nbins, new_min,
                                     new_max, NULL);
}

static void trace_add(qcal_l2_trace *tr, int32_t s, int32_t e, double norm, bool accepted)
{
    if (!tr)
        return;
    if (tr->n < tr->cap) {
        tr->start[tr->n] = s;
        tr->end[tr->n] = e;
        tr->norm[tr->n] = norm;
    }
    if (accepted)
        tr->chosen = tr->n;
    tr->n++;
}

qcal_status qcal_hist_l2_search_trace(const float *hist, int32_t bins, float min_val,
                                      float max_val, double dst_nbins, float *new_min,
                                      float *new_max, qcal_l2_trace *trace)
{
    if (!hist || bins < 1 || !(min_val <= max_val) || !isfinite(min_val) ||
        !isfinite(max_val) || !(dst_nbins >= 1.0))
        return qcal_error(QCAL_ERR_INVALID_ARG,
                          "L2 search needs bins >= 1 and a finite range, got %d bins over "
                          "[%g, %g], %g destination bins",
                          (int)bins, (double)min_val, (double)max_val, dst_nbins);
    if (!isfinite(max_val - min_val)) {
        /* A range wider than FLT_MAX overflows PyTorch's float32 bin width (its search then
         * returns NaN). Scaling by 2^-2 is exact and scales every float op of the search
         * exactly, so the answer is the one the same arithmetic gives without overflow. */
        float a, b;
        qcal_status st = qcal_hist_l2_search_trace(hist, bins, min_val * 0.25f,
                                                   max_val * 0.25f, dst_nbins, &a, &b, trace);
        if (trace)   /* norms scale by 2^-6 (squared errors times a width) */
            for (int64_t k = 0; k < trace->n && k < trace->cap; k++)
                trace->norm[k] *= 64.0;
        if (st == QCAL_OK) {
            *new_min = a * 4.0f;
            *new_max = b * 4.0f;
        }
        return st;
    }
    float *csum = qcal_malloc((size_t)bins * 2 * sizeof(float));
    if (!csum)
        return QCAL_ERR_NO_MEMORY;
    float *norm = csum + bins;
    /* bin_width = (self.max_val - self.min_val) / self.bins: float32 tensors. */
    const float bin_width = (max_val - min_val) / (float)bins;
    const double total = (double)qcal_torch_sum_f32(hist, bins);
    /* torch.cumsum on CPU accumulates float in double (acc_type<float, false>). */
    double run = 0.0;
    for (int32_t i = 0; i < bins; i++) {
        run += hist[i];
        csum[i] = (float)run;
    }
    const double stepsize = 1e-5;
    double alpha = 0.0, beta = 1.0;
    int32_t start_bin = 0, end_bin = bins - 1;
    double norm_min = INFINITY;
    while (alpha < beta) {
        double next_alpha = alpha + stepsize, next_beta = beta - stepsize;
        /* cSum[l] < next_alpha * total: the Python float is cast to float32 for the compare. */
        float ta = (float)(next_alpha * total), tb = (float)(next_beta * total);
        /* while l < end_bin and cSum[l] < ta: l += 1 */
        int32_t l = first_ge(csum, start_bin, end_bin, ta);
        /* while r > start_bin and cSum[r] > tb: r -= 1  ->  last r in (start, end] with
         * cSum[r] <= tb, else start_bin. */
        int32_t lo = start_bin + 1, hi = end_bin + 1;
        while (lo < hi) {
            int32_t m = lo + (hi - lo) / 2;
            if (csum[m] <= tb)
                lo = m + 1;
            else
                hi = m;
        }
        int32_t r = lo - 1;
        if (r < start_bin + 1)
            r = start_bin;
        int32_t next_start = start_bin, next_end = end_bin;
        if ((l - start_bin) > (end_bin - r)) {
            next_start = l;
            alpha = next_alpha;
        } else {
            next_end = r;
            beta = next_beta;
        }
        if (next_start == start_bin && next_end == end_bin)
            continue;
        double nrm = quantization_error(hist, bins, min_val, max_val, dst_nbins, next_start,
                                        next_end, norm);
        trace_add(trace, next_start, next_end, nrm, !(nrm > norm_min));
        if (nrm > norm_min)
            break;
        norm_min = nrm;
        start_bin = next_start;
        end_bin = next_end;
    }
    free(csum);
    /* new_min = self.min_val + bin_width * start_bin (float32 tensor ops). */
    *new_min = min_val + bin_width * (float)start_bin;
    *new_max = min_val + bin_width * (float)(end_bin + 1);
    return QCAL_OK;
}

/* ---- the observer kind ---------------------------------------------------------------- */

/* dst_nbins = 2 ** torch.iinfo(dtype).bits, independent of quant_min/quant_max. */
static double dst_nbins(const qcal_observer *obs)
{
    return obs->cfg.q.dtype == QCAL_QINT32 ? 4294967296.0 : 256.0;
}

/* grid=torch: calculate_qparams on PyTorch's own buffers. */
static qcal_status torch_qrange(const qcal_observer *obs, const qcal_torch_hist *t, float *mn,
                                float *mx, int64_t *n)
{
    *n = 1;
    if (qcal_torch_hist_empty(t)) {
        qcal_range_set_empty(mn, mx, 1);
        return QCAL_NO_DATA;
    }
    if (t->min_val == t->max_val) {   /* bin_width 0: the search returns (min, max) */
        mn[0] = t->min_val;
        mx[0] = t->max_val;
        return QCAL_OK;
    }
    return qcal_hist_l2_search(t->hist, t->bins, t->min_val, t->max_val, dst_nbins(obs), mn,
                               mx);
}

qcal_status qcal_observer_histogram_torch_get(const qcal_observer *obs, int64_t cap, float *counts,
                                              float *min_val, float *max_val, int64_t *n)
{
    const qcal_torch_hist *t = obs && obs->cfg.kind == QCAL_OBSERVER_HISTOGRAM
                                   ? qcal_histobs_torch(obs) : NULL;
    if (!t || !min_val || !max_val || !n || (cap > 0 && !counts))
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_observer_histogram_torch_get needs a "
                          "histogram observer with grid=torch and outputs");
    if (cap < t->bins)
        return qcal_error(QCAL_ERR_INVALID_ARG, "torch histogram has %d bins, capacity %lld",
                          (int)t->bins, (long long)cap);
    memcpy(counts, t->hist, (size_t)t->bins * sizeof *counts);
    *min_val = t->min_val;
    *max_val = t->max_val;
    *n = t->bins;
    return QCAL_OK;
}

qcal_status qcal_observer_histogram_torch_set(qcal_observer *obs, const float *counts,
                                              int64_t n, float min_val, float max_val)
{
    qcal_torch_hist *t = obs && obs->cfg.kind == QCAL_OBSERVER_HISTOGRAM
                             ? qcal_histobs_torch(obs) : NULL;
    if (!t || !counts)
        return qcal_error(QCAL_ERR_INVALID_ARG, "qcal_observer_histogram_torch_set needs a "
                          "histogram observer with grid=torch and counts");
    if (n != t->bins)
        return qcal_error(QCAL_ERR_INVALID_ARG, "torch histogram has %lld bins, the observer "
                          "%d", (long long)n, (int)t->bins);
    qcal_status st = qcal_torch_hist_set(t, min_val, max_val, counts, (int32_t)n);
    if (st != QCAL_OK)
        return st;
    bool empty = qcal_torch_hist_empty(t);
    obs->batches = empty ? 0 : (obs->batches ? obs->batches : 1);
    return QCAL_OK;
}

static qcal_status histogram_qrange(const qcal_observer *obs, int64_t cap, float *mn, float *mx,
                                    int64_t *n)
{
    (void)cap;
    const qcal_torch_hist *t = qcal_histobs_torch(obs);
    if (t)
        return torch_qrange(obs, t, mn, mx, n);
    qcal_hist view;
    qcal_status st;
    const qcal_hist *h = qcal_histobs_qrange_begin(obs, mn, mx, n, &view, &st);
    if (!h)
        return st;
    if (h->lo == h->hi) {
        /* PyTorch: bin_width 0, every error 0, the search returns (min, max). */
        mn[0] = h->lo;
        mx[0] = h->hi;
        qcal_histobs_qrange_end(&view);
        return QCAL_OK;
    }
    float *fh = qcal_malloc((size_t)h->bins * sizeof *fh);
    if (!fh) {
        qcal_histobs_qrange_end(&view);
        return QCAL_ERR_NO_MEMORY;
    }
    /* PyTorch keeps the histogram as float32; so does the search. */
    for (int32_t i = 0; i < h->bins; i++)
        fh[i] = (float)h->counts[i];
    double dst = dst_nbins(obs);
    float a, b;
    st = qcal_hist_l2_search(fh, h->bins, h->lo, h->hi, dst, &a, &b);
    free(fh);
    if (st == QCAL_OK && qcal_histobs_is_lattice(obs)) {
        /* The search's float edges may round a hair past the data: keep inside it. */
        a = fminf(fmaxf(a, h->lo), h->hi);
        b = fminf(fmaxf(b, h->lo), h->hi);
    }
    qcal_histobs_qrange_end(&view);
    if (st != QCAL_OK)
        return st;
    mn[0] = a;
    mx[0] = b;
    return QCAL_OK;
}

const qcal_observer_ops qcal_observer_histogram_ops = {
    .kind = QCAL_OBSERVER_HISTOGRAM,
    .init = qcal_histobs_init,
    .fini = qcal_histobs_fini,
    .update = qcal_histobs_update,
    .channels = qcal_histobs_channels,
    .data_range = qcal_histobs_data_range,
    .qrange = histogram_qrange,
    .reset = qcal_histobs_reset,
    .merge = qcal_histobs_merge,
    .save = qcal_histobs_save,
    .load = qcal_histobs_load,
};
