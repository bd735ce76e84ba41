/* The first-batch grid's histogram (grid = QCAL_GRID_FIRST_BATCH) kept by the histogram
 * observer family: `bins` equal bins over the first batch's range, grown exactly by
 * power-of-two widths, merged, saved and loaded. See histogram_first_batch.h. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "observers/histogram_bin.h"
#include "observers/histogram_first_batch.h"
#include "observers/minmax_kernels.h"

/* Bin indices must be computed op by op (no fused multiply-add) to match torch.histc. */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* ---- bin index ---------------------------------------------------------------------- */

int32_t qcal_hist_bin_of(float v, float lo, float hi, int32_t bins)
{
    if (!(hi > lo))
        return 0;
    if (v <= lo)
        return 0;
    if (v >= hi)
        return bins - 1;
    int32_t i = qcal_histc_index(v, lo, hi, bins, qcal_histc_float_ok(lo, hi));
    return i >= bins ? bins - 1 : i;
}

/* ---- growable histogram --------------------------------------------------------------- */

qcal_status qcal_hist_init(qcal_hist *h, int32_t bins, bool absval)
{
    memset(h, 0, sizeof *h);
    h->bins = bins;
    h->absval = absval;
    h->counts = qcal_calloc((size_t)bins, sizeof *h->counts);
    if (!h->counts)
        return QCAL_ERR_NO_MEMORY;
    qcal_hist_clear(h);
    return QCAL_OK;
}

void qcal_hist_free(qcal_hist *h)
{
    if (!h)
        return;
    free(h->counts);
    h->counts = NULL;
}

void qcal_hist_clear(qcal_hist *h)
{
    h->lo = h->dmin = INFINITY;
    h->hi = h->dmax = -INFINITY;
    h->total = 0;
    h->top = 0;
    if (h->counts)
        memset(h->counts, 0, (size_t)h->bins * sizeof *h->counts);
}

bool qcal_hist_empty(const qcal_hist *h)
{
    return h->total == 0;
}

void qcal_hist_rebin(const uint64_t *counts, int32_t bins, double lo, double hi,
                     uint64_t *dst_counts, int32_t dst_bins, double dlo, double dhi)
{
    uint64_t total = 0;
    for (int32_t i = 0; i < bins; i++)
        total += counts[i];
    double w = (hi - lo) / bins, dw = (dhi - dlo) / dst_bins;
    int32_t i = 0;          /* source bin containing the current edge */
    uint64_t below = 0;     /* counts of source bins < i */
    uint64_t prev = 0;      /* rounded cumulative mass at the previous destination edge */
    for (int32_t j = 1; j <= dst_bins; j++) {
        uint64_t cum;
        if (j == dst_bins) {
            cum = total;
        } else {
            double e = dlo + dw * j;
            double u = (e - lo) / w;
            if (!(u > 0.0)) {
                cum = 0;
            } else if (u >= bins) {
                cum = total;
            } else {
                int32_t iu = (int32_t)u;
                while (i < iu) {
                    below += counts[i];
                    i++;
                }
                double f = below + (u - iu) * (double)counts[iu];
                cum = (uint64_t)floor(f + 0.5);
                if (cum < below)
                    cum = below;
                if (cum > below + counts[iu])
                    cum = below + counts[iu];
            }
        }
        if (cum < prev)
            cum = prev;
        dst_counts[j - 1] += cum - prev;
        prev = cum;
    }
}

/* New grid for covering [a, b] from h's grid; see histogram_first_batch.h. Returns true for an
 * exact index map (old bin i -> m + (i >> k)); false for the linear re-bin fallback. */
static bool grow_grid(const qcal_hist *h, float a, float b, float *nlo, float *nhi,
                      int *kout, int64_t *mout)
{
    int32_t B = h->bins;
    double lo = h->lo, hi = h->hi;
    double w = (hi - lo) / B;
    for (int k = 1; k <= 62 && w > 0.0 && isfinite(w); k++) {
        double W = ldexp(w, k);
        double blocks = a < h->lo ? ceil((lo - (double)a) / W) : 0.0;
        for (int extra = 0; extra < 2; extra++) {
            double mb = blocks + extra;
            int64_t last_old = (int64_t)(B - 1) >> (k > 31 ? 31 : k);
            if (mb + (double)last_old > (double)(B - 1))
                break;
            double dlo = lo - mb * W, dhi = dlo + (double)B * W;
            float flo = (float)dlo, fhi = (float)dhi;
            if (!isfinite(flo) || !isfinite(fhi))
                goto fallback;
            if (flo <= a && fhi >= b && flo <= h->lo && fhi >= h->hi && flo < fhi) {
                /* The new grid has spare bins; signed grids share them out in proportion
                 * to how far the batch went past the data seen so far on each side (all to
                 * the top when only the top grows, as for ReLU data; half each side for
                 * data growing symmetrically). |x| grids keep lo = 0. Placing them all above
                 * (the smallest m) made symmetric growth double the width on every batch
                 * that reached a little below lo: for 8 batches of N(0, 1 + b/2) the grid
                 * ended as [-21, 1232] for data in [-21, 21] (3% of the bins used). */
                double top = (double)b > hi ? (double)b : hi;
                double up = (double)b > h->dmax ? (double)b - h->dmax : 0.0;
                double down = (double)a < h->dmin ? (double)h->dmin - a : 0.0;
                double mb_max = floor((lo + (double)B * W - top) / W);
                if (mb_max > (double)(B - 1 - last_old))
                    mb_max = (double)(B - 1 - last_old);
                if (!h->absval && down > 0.0 && mb_max > mb) {
                    double mc = mb + floor((mb_max - mb) * (down / (down + up)) + 0.5);
                    double clo = lo - mc * W, chi = clo + (double)B * W;
                    float cflo = (float)clo, cfhi = (float)chi;
                    if (isfinite(cflo) && isfinite(cfhi) && cflo <= a && cfhi >= b &&
                        cflo <= h->lo && cfhi >= h->hi && cflo < cfhi) {
                        mb = mc;
                        flo = cflo;
                        fhi = cfhi;
                    }
                }
                *nlo = flo;
                *nhi = fhi;
                *kout = k;
                *mout = (int64_t)mb;
                return true;
            }
        }
    }
fallback:
    *nlo = a < h->lo ? a : h->lo;
    *nhi = b > h->hi ? b : h->hi;
    return false;
}

/* Target grid covering h's grid and [a, b] (h non-empty); fills a fresh counts array with
 * h's counts mapped onto it. */
static qcal_status regrid(const qcal_hist *h, float a, float b, float *nlo, float *nhi,
                          uint64_t **out)
{
    uint64_t *nc = qcal_calloc((size_t)h->bins, sizeof *nc);
    if (!nc)
        return QCAL_ERR_NO_MEMORY;
    if (h->lo == h->hi) {
        /* Degenerate: a point mass at lo. */
        *nlo = a < h->lo ? a : h->lo;
        *nhi = b > h->hi ? b : h->hi;
        nc[qcal_hist_bin_of(h->lo, *nlo, *nhi, h->bins)] += h->total;
    } else {
        int k = 0;
        int64_t m = 0;
        int32_t B = h->bins;
        if (grow_grid(h, a, b, nlo, nhi, &k, &m)) {
            for (int32_t i = 0; i < B; i++)
                nc[m + ((int64_t)i >> k)] += h->counts[i];
            nc[m + ((int64_t)(B - 1) >> k)] -= h->top;
        } else {
            h->counts[B - 1] -= h->top;   /* restored below */
            qcal_hist_rebin(h->counts, B, h->lo, h->hi, nc, B, *nlo, *nhi);
            h->counts[B - 1] += h->top;
        }
        /* Values on the old top edge go where hi falls in the new grid. */
        nc[qcal_hist_bin_of(h->hi, *nlo, *nhi, B)] += h->top;
    }
    *out = nc;
    return QCAL_OK;
}

qcal_status qcal_hist_update(qcal_hist *h, const float *x, int64_t n,
                             qcal_nonfinite_policy policy, uint64_t *nonfinite)
{
    float mn, mx;
    uint64_t nf = 0;
    qcal_status st;
    if (!qcal_hist_empty(h) && h->lo < h->hi) {
        /* Most batches after the first fit the grid: one fused pass (min/max + binning).
         * When one does not, that pass stops binning at the first block holding a value
         * outside and finishes the min/max; the batch is then binned on the grown grid. */
        bool binned = false;
        uint64_t top = 0;
        st = qcal_f32_histc_inside(x, n, h->lo, h->hi, h->bins, h->absval,
                                   policy == QCAL_NONFINITE_ERROR, h->counts, &top, &mn, &mx,
                                   &nf, &binned);
        if (st != QCAL_OK)
            return st;
        if (binned) {
            *nonfinite = nf;
            h->top += top;
            h->dmin = fminf(h->dmin, mn);
            h->dmax = fmaxf(h->dmax, mx);
            h->total += (uint64_t)n - nf;
            return QCAL_OK;
        }
    } else {
        qcal_f32_minmax(x, n, &mn, &mx, &nf);
    }
    *nonfinite = nf;
    if (nf > 0 && policy == QCAL_NONFINITE_ERROR)
        return qcal_error(QCAL_ERR_NONFINITE,
                          "batch of %lld values holds %llu NaN/Inf (non-finite policy: error)",
                          (long long)n, (unsigned long long)nf);
    uint64_t finite = (uint64_t)n - nf;
    if (finite == 0)
        return QCAL_OK;
    float a = mn, b = mx;
    if (h->absval) {
        a = 0.0f;
        b = fmaxf(-mn, mx);
    }
    float nlo, nhi;
    uint64_t *nc = NULL;
    if (qcal_hist_empty(h)) {
        nlo = a;
        nhi = b;
    } else if (a >= h->lo && b <= h->hi) {
        nlo = h->lo;
        nhi = h->hi;
    } else {
        st = regrid(h, a, b, &nlo, &nhi, &nc);
        if (st != QCAL_OK)
            return st;
    }
    uint64_t *dst = nc ? nc : h->counts;
    uint64_t top = 0;
    if (nlo == nhi) {
        dst[0] += finite;
    } else {
        st = qcal_f32_histc(x, n, nlo, nhi, h->bins, h->absval, dst, &top);
        if (st != QCAL_OK) {
            free(nc);
            return st;
        }
    }
    if (nlo == nhi)
        h->top = 0;
    else if (nc || h->lo == h->hi)
        h->top = top;      /* the old top edge is now inside the grid */
    else
        h->top += top;
    if (nc) {
        free(h->counts);
        h->counts = nc;
    }
    h->lo = nlo;
    h->hi = nhi;
    h->dmin = fminf(h->dmin, mn);
    h->dmax = fmaxf(h->dmax, mx);
    h->total += finite;
    return QCAL_OK;
}

static void src_rebin_without_top(const qcal_hist *src, uint64_t *out, float nlo, float nhi)
{
    /* Linear spreading of every bin but the top-edge values, which the caller places. */
    uint64_t last = src->counts[src->bins - 1];
    ((qcal_hist *)src)->counts[src->bins - 1] = last - src->top;
    qcal_hist_rebin(src->counts, src->bins, src->lo, src->hi, out, src->bins, nlo, nhi);
    ((qcal_hist *)src)->counts[src->bins - 1] = last;
}

qcal_status qcal_hist_merge(qcal_hist *dst, const qcal_hist *src)
{
    if (qcal_hist_empty(src))
        return QCAL_OK;
    if (qcal_hist_empty(dst)) {
        memcpy(dst->counts, src->counts, (size_t)src->bins * sizeof *src->counts);
        dst->lo = src->lo;
        dst->hi = src->hi;
        dst->dmin = src->dmin;
        dst->dmax = src->dmax;
        dst->total = src->total;
        dst->top = src->top;
        return QCAL_OK;
    }
    float a = src->lo, b = src->hi, nlo = dst->lo, nhi = dst->hi;
    uint64_t *nc = NULL;
    if (!(a >= dst->lo && b <= dst->hi)) {
        qcal_status st = regrid(dst, a, b, &nlo, &nhi, &nc);
        if (st != QCAL_OK)
            return st;
    }
    uint64_t *out = nc ? nc : dst->counts;
    int32_t B = src->bins;
    uint64_t new_top = (nhi == dst->hi && dst->lo != dst->hi) ? dst->top : 0;
    if (src->lo == src->hi || nlo == nhi) {
        out[qcal_hist_bin_of(src->lo, nlo, nhi, B)] += src->total;
    } else {
        /* Exact when src's bins nest in the target's: width ratio 2^j and an offset of a
         * whole number of src bins (checked in double, where these quantities are exact). */
        double ws = ((double)src->hi - src->lo) / B, W = ((double)nhi - nlo) / B;
        double r = W / ws, q = ((double)src->lo - nlo) / ws;
        int e;
        bool exact = frexp(r, &e) == 0.5 && e >= 1 && e <= 31 && q == floor(q) && q >= 0 &&
                     ws * r == W && (double)nlo + q * ws == (double)src->lo;
        if (exact) {
            int64_t ri = (int64_t)r, qi = (int64_t)q;
            for (int32_t i = 0; i < B; i++) {
                int64_t t = (qi + i) / ri;
                uint64_t c = src->counts[i] - (i == B - 1 ? src->top : 0);
                out[t < B ? t : B - 1] += c;
            }
        } else {
            src_rebin_without_top(src, out, nlo, nhi);
        }
        out[qcal_hist_bin_of(src->hi, nlo, nhi, B)] += src->top;
        if (src->hi == nhi)
            new_top += src->top;
    }
    dst->top = new_top;
    if (nc) {
        free(dst->counts);
        dst->counts = nc;
    }
    dst->lo = nlo;
    dst->hi = nhi;
    dst->dmin = fminf(dst->dmin, src->dmin);
    dst->dmax = fmaxf(dst->dmax, src->dmax);
    dst->total += src->total;
    return QCAL_OK;
}

/* State: u32 bins, u32 absval, f32 lo, hi, dmin, dmax, u64 total, u64 top,
 * u64 counts[bins]. */
void qcal_hist_save(const qcal_hist *h, qcal_buf *b)
{
    qcal_buf_u32(b, (uint32_t)h->bins);
    qcal_buf_u32(b, h->absval ? 1u : 0u);
    qcal_buf_f32(b, h->lo);
    qcal_buf_f32(b, h->hi);
    qcal_buf_f32(b, h->dmin);
    qcal_buf_f32(b, h->dmax);
    qcal_buf_u64(b, h->total);
    qcal_buf_u64(b, h->top);
    for (int32_t i = 0; i < h->bins; i++)
        qcal_buf_u64(b, h->counts[i]);
}

qcal_status qcal_hist_load(qcal_hist *h, qcal_cursor *c)
{
    uint32_t bins, absval;
    float lo, hi, dmin, dmax;
    uint64_t total, top;
    if (!qcal_cur_u32(c, &bins) || !qcal_cur_u32(c, &absval) || !qcal_cur_f32(c, &lo) ||
        !qcal_cur_f32(c, &hi) || !qcal_cur_f32(c, &dmin) || !qcal_cur_f32(c, &dmax) ||
        !qcal_cur_u64(c, &total) || !qcal_cur_u64(c, &top))
        return qcal_error(QCAL_ERR_FORMAT, "histogram state is truncated");
    if (bins != (uint32_t)h->bins || absval != (h->absval ? 1u : 0u))
        return qcal_error(QCAL_ERR_FORMAT,
                          "histogram state has %u bins (abs %u), config says %d (abs %d)",
                          (unsigned)bins, (unsigned)absval, (int)h->bins, (int)h->absval);
    size_t bytes = (size_t)bins * 8;
    if (c->left < bytes)
        return qcal_error(QCAL_ERR_FORMAT, "histogram state is truncated in its %u counts",
                          (unsigned)bins);
    uint64_t *nc = qcal_malloc(bytes);
    if (!nc)
        return QCAL_ERR_NO_MEMORY;
    uint64_t sum = 0;
    bool overflow = false, deg_ok = true;
    for (uint32_t i = 0; i < bins; i++) {
        qcal_cur_u64(c, &nc[i]);
        overflow |= __builtin_add_overflow(sum, nc[i], &sum);
        if (i > 0 && nc[i] != 0)
            deg_ok = false;
    }
    qcal_status st = QCAL_OK;
    if (overflow || sum != total) {
        st = qcal_error(QCAL_ERR_FORMAT, "histogram counts sum to %llu, state says %llu",
                        (unsigned long long)sum, (unsigned long long)total);
    } else if (total == 0) {
        if (!(lo == INFINITY && hi == -INFINITY && dmin == INFINITY && dmax == -INFINITY))
            st = qcal_error(QCAL_ERR_FORMAT, "empty histogram state has range [%g, %g]",
                            (double)lo, (double)hi);
    } else if (!(isfinite(lo) && isfinite(hi) && isfinite(dmin) && isfinite(dmax) &&
                 lo <= hi && dmin <= dmax && (absval || (lo <= dmin && dmax <= hi)) &&
                 (!absval || (lo == 0.0f && fmaxf(-dmin, dmax) <= hi)))) {
        st = qcal_error(QCAL_ERR_FORMAT,
                        "histogram state grid [%g, %g] / data [%g, %g] is inconsistent",
                        (double)lo, (double)hi, (double)dmin, (double)dmax);
    } else if (top > nc[bins - 1] || (lo == hi && top != 0)) {
        st = qcal_error(QCAL_ERR_FORMAT, "histogram state has %llu top-edge values, last bin %llu",
                        (unsigned long long)top, (unsigned long long)nc[bins - 1]);
    } else if (lo == hi && !deg_ok) {
        st = qcal_error(QCAL_ERR_FORMAT, "zero-width histogram state has counts past bin 0");
    }
    if (st != QCAL_OK) {
        free(nc);
        return st;
    }
    free(h->counts);
    h->counts = nc;
    h->lo = lo;
    h->hi = hi;
    h->dmin = dmin;
    h->dmax = dmax;
    h->total = total;
    h->top = top;
    return QCAL_OK;
}
