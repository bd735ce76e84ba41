/* Histogram family internals: the threaded binning drivers over the family's kernels
 * (histogram_dsp.h), the growable first-batch histogram shared by histogram / percentile /
 * entropy / mse, and their common observer ops. Bin arithmetic: histogram_dsp.h. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "core/cpu.h"
#include "observers/histogram_dsp.h"
#include "observers/histogram_kernels.h"
#include "observers/minmax_dsp.h"
#include "observers/minmax_kernels.h"
#include "qcal_config.h"
#if QCAL_HAVE_OPENMP
#include <omp.h>
#endif

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

/* ---- threaded binning (both grids) -------------------------------------------------- */

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

/* New grid for covering [a, b] from h's grid; see histogram_kernels.h. Returns true for an
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

/* ---- shared observer ops ------------------------------------------------------------- */

bool qcal_histobs_config_asymmetric(const qcal_observer_config *cfg)
{
    qcal_qscheme s = cfg->q.qscheme;
    bool affine = s == QCAL_PER_TENSOR_AFFINE || s == QCAL_PER_CHANNEL_AFFINE ||
                  s == QCAL_PER_CHANNEL_AFFINE_FLOAT_QPARAMS;
    return affine && !qcal_dtype_is_float8(cfg->q.dtype);
}

/* Histogram of |x| (symmetric targets: TensorRT's and NVIDIA's searches) or of x. */
static bool kind_uses_abs(const qcal_observer_config *cfg)
{
    switch (cfg->kind) {
    case QCAL_OBSERVER_ENTROPY:
    case QCAL_OBSERVER_MSE:
        return !qcal_histobs_config_asymmetric(cfg);
    case QCAL_OBSERVER_PERCENTILE:
        if (cfg->percentile_mode == QCAL_PERCENTILE_AUTO)
            return !qcal_histobs_config_asymmetric(cfg);
        return cfg->percentile_mode == QCAL_PERCENTILE_ABS;
    default:
        return false;
    }
}

static qcal_histobs *hobs(const qcal_observer *obs)
{
    return (qcal_histobs *)obs->impl;
}

qcal_hist *qcal_histobs_hist(const qcal_observer *obs)
{
    return &hobs(obs)->hist;
}

static bool is_lattice(const qcal_observer *obs)
{
    return obs->cfg.grid == QCAL_GRID_LATTICE;
}

static bool is_torch(const qcal_observer *obs)
{
    return obs->cfg.grid == QCAL_GRID_TORCH;
}

qcal_torch_hist *qcal_histobs_torch(const qcal_observer *obs)
{
    return is_torch(obs) ? &hobs(obs)->th : NULL;
}

qcal_status qcal_histobs_init(qcal_observer *obs)
{
    qcal_histobs *h = qcal_calloc(1, sizeof *h);
    if (!h)
        return QCAL_ERR_NO_MEMORY;
    obs->impl = h;
    bool absval = kind_uses_abs(&obs->cfg);
    if (is_torch(obs))
        return qcal_torch_hist_init(&h->th, obs->cfg.bins);
    if (is_lattice(obs)) {
        h->hist.bins = obs->cfg.bins;
        h->hist.absval = absval;
        return qcal_lattice_init(&h->lat, obs->cfg.bins, absval);
    }
    return qcal_hist_init(&h->hist, obs->cfg.bins, absval);
}

void qcal_histobs_fini(qcal_observer *obs)
{
    qcal_histobs *h = obs->impl;
    if (h) {
        qcal_hist_free(&h->hist);
        qcal_lattice_free(&h->lat);
        qcal_torch_hist_free(&h->th);
        free(h);
        obs->impl = NULL;
    }
}

qcal_status qcal_histobs_update(qcal_observer *obs, const qcal_tensor *x, int64_t numel,
                                uint64_t *nonfinite)
{
    if (is_torch(obs))
        return qcal_torch_hist_update(&hobs(obs)->th, x->data, numel, obs->cfg.nonfinite,
                                      nonfinite);
    if (is_lattice(obs))
        return qcal_lattice_update(&hobs(obs)->lat, x->data, numel, obs->cfg.nonfinite,
                                   nonfinite);
    return qcal_hist_update(&hobs(obs)->hist, x->data, numel, obs->cfg.nonfinite, nonfinite);
}

qcal_status qcal_histobs_channels(const qcal_observer *obs, int64_t *n)
{
    (void)obs;
    *n = 1;
    return QCAL_OK;
}

/* Data min / max (signed) and whether anything was seen. */
static bool data_minmax(const qcal_observer *obs, float *dmin, float *dmax)
{
    if (is_torch(obs)) {
        const qcal_torch_hist *t = &hobs(obs)->th;
        *dmin = t->min_val;
        *dmax = t->max_val;
        return !qcal_torch_hist_empty(t);
    }
    if (is_lattice(obs)) {
        const qcal_lattice *L = &hobs(obs)->lat;
        *dmin = L->dmin;
        *dmax = L->dmax;
        return L->total > 0;
    }
    const qcal_hist *h = &hobs(obs)->hist;
    *dmin = h->dmin;
    *dmax = h->dmax;
    return !qcal_hist_empty(h);
}

qcal_status qcal_histobs_data_range(const qcal_observer *obs, int64_t cap, float *mn,
                                    float *mx, int64_t *n)
{
    (void)cap;
    *n = 1;
    float dmin, dmax;
    if (!data_minmax(obs, &dmin, &dmax)) {
        qcal_range_set_empty(mn, mx, 1);
        return QCAL_NO_DATA;
    }
    if (is_torch(obs)) {   /* PyTorch's min_val / max_val buffers */
        mn[0] = dmin;
        mx[0] = dmax;
        return QCAL_OK;
    }
    if (is_lattice(obs)) {
        /* The data range (|x| kinds: [-max|x|, max|x|], or [0, max|x|] without negatives). */
        const qcal_lattice *L = &hobs(obs)->lat;
        if (L->absval) {
            float a = qcal_lattice_vmax(L);
            mn[0] = dmin < 0.0f ? -a : 0.0f;
            mx[0] = a;
        } else {
            mn[0] = dmin;
            mx[0] = dmax;
        }
        return QCAL_OK;
    }
    const qcal_hist *h = &hobs(obs)->hist;
    if (h->absval) {
        mn[0] = h->dmin < 0.0f ? -h->hi : 0.0f;
        mx[0] = h->hi;
    } else {
        mn[0] = h->lo;
        mx[0] = h->hi;
    }
    return QCAL_OK;
}

void qcal_histobs_reset(qcal_observer *obs)
{
    if (is_torch(obs))
        qcal_torch_hist_clear(&hobs(obs)->th);
    else if (is_lattice(obs))
        qcal_lattice_clear(&hobs(obs)->lat);
    else
        qcal_hist_clear(&hobs(obs)->hist);
}

qcal_status qcal_histobs_merge(qcal_observer *dst, const qcal_observer *src)
{
    if (is_torch(dst))
        return qcal_torch_hist_merge(&hobs(dst)->th, &hobs(src)->th);
    if (is_lattice(dst))
        return qcal_lattice_merge(&hobs(dst)->lat, &hobs(src)->lat);
    return qcal_hist_merge(&hobs(dst)->hist, &hobs(src)->hist);
}

void qcal_histobs_save(const qcal_observer *obs, qcal_buf *b)
{
    if (is_torch(obs))
        qcal_torch_hist_save(&hobs(obs)->th, b);
    else if (is_lattice(obs))
        qcal_lattice_save(&hobs(obs)->lat, b);
    else
        qcal_hist_save(&hobs(obs)->hist, b);
}

qcal_status qcal_histobs_load(qcal_observer *obs, qcal_cursor *c)
{
    if (is_torch(obs))
        return qcal_torch_hist_load(&hobs(obs)->th, c);
    if (is_lattice(obs))
        return qcal_lattice_load(&hobs(obs)->lat, c);
    return qcal_hist_load(&hobs(obs)->hist, c);
}

const qcal_hist *qcal_histobs_qrange_begin(const qcal_observer *obs, float *mn, float *mx,
                                           int64_t *n, qcal_hist *view, qcal_status *st)
{
    *n = 1;
    *st = QCAL_OK;
    memset(view, 0, sizeof *view);
    if (is_torch(obs)) {
        /* The torch grid keeps float counts; only the histogram kind reads them
         * (histogram.c), through qcal_histobs_torch. */
        qcal_range_set_empty(mn, mx, 1);
        *st = qcal_error(QCAL_ERR_UNSUPPORTED, "grid=torch keeps PyTorch's float32 counts: "
                         "read them with qcal_observer_torch_histogram");
        return NULL;
    }
    /* Two-ended entropy / mse searches model an affine grid, which always holds zero: their
     * histogram spans zero too (data away from zero leave bins empty between zero and the
     * data, as the |x| searches' [0, max|x|] does). */
    const bool with_zero = (obs->cfg.kind == QCAL_OBSERVER_ENTROPY ||
                            obs->cfg.kind == QCAL_OBSERVER_MSE) &&
                           !kind_uses_abs(&obs->cfg);
    if (!is_lattice(obs)) {
        const qcal_hist *h = &hobs(obs)->hist;
        if (qcal_hist_empty(h)) {
            qcal_range_set_empty(mn, mx, 1);
            *st = QCAL_NO_DATA;
            return NULL;
        }
        if (!with_zero || (h->lo <= 0.0f && 0.0f <= h->hi) || h->lo == h->hi)
            return h;
        /* First-batch grid away from zero: re-binned onto a grid from zero (linear spread
         * inside each bin, total exact). */
        *view = *h;
        view->lo = fminf(h->lo, 0.0f);
        view->hi = fmaxf(h->hi, 0.0f);
        view->top = 0;
        view->counts = qcal_calloc((size_t)h->bins, sizeof *view->counts);
        if (!view->counts) {
            *st = QCAL_ERR_NO_MEMORY;
            return NULL;
        }
        qcal_hist_rebin(h->counts, h->bins, h->lo, h->hi, view->counts, h->bins, view->lo,
                        view->hi);
        return view;
    }
    const qcal_lattice *L = &hobs(obs)->lat;
    if (L->total == 0) {
        qcal_range_set_empty(mn, mx, 1);
        *st = QCAL_NO_DATA;
        return NULL;
    }
    /* bins equal bins over the range of v seen, re-binned from the lattice. */
    view->bins = obs->cfg.bins;
    view->absval = L->absval;
    view->lo = qcal_lattice_vmin(L);
    view->hi = qcal_lattice_vmax(L);
    if (with_zero && view->lo != view->hi) {
        view->lo = fminf(view->lo, 0.0f);
        view->hi = fmaxf(view->hi, 0.0f);
    }
    view->dmin = L->dmin;
    view->dmax = L->dmax;
    view->total = L->total;
    view->top = 0;
    view->counts = qcal_calloc((size_t)view->bins, sizeof *view->counts);
    if (!view->counts) {
        *st = QCAL_ERR_NO_MEMORY;
        return NULL;
    }
    if (view->lo == view->hi)
        view->counts[0] = L->total;
    else
        qcal_lattice_view(L, view->lo, view->hi, view->bins, view->counts);
    return view;
}

void qcal_histobs_qrange_end(qcal_hist *view)
{
    free(view->counts);
    view->counts = NULL;
}

qcal_lattice *qcal_histobs_lattice(const qcal_observer *obs)
{
    return &hobs(obs)->lat;
}

bool qcal_histobs_is_lattice(const qcal_observer *obs)
{
    return is_lattice(obs);
}

int32_t qcal_hist_zero_bin(const qcal_hist *h)
{
    if (!(h->lo <= 0.0f && 0.0f <= h->hi))
        return -1;
    if (h->lo == h->hi)
        return 0;
    return qcal_hist_bin_of(0.0f, h->lo, h->hi, h->bins);
}

void qcal_histobs_window_range(const qcal_observer *obs, const qcal_hist *h, int32_t a,
                               int32_t b, double f, float *mn, float *mx)
{
    double lo = h->lo, hi = h->hi, w = (hi - lo) / h->bins;
    float fa = a <= 0 && f == 0.0 ? h->lo : (float)(lo + ((double)a + f) * w);
    float fb = b >= h->bins && f == 0.0 ? h->hi : (float)(lo + ((double)b + f) * w);
    if (is_lattice(obs)) {
        float dmin, dmax;
        data_minmax(obs, &dmin, &dmax);
        fa = fminf(fmaxf(fa, dmin), dmax);
        fb = fminf(fmaxf(fb, dmin), dmax);
    }
    *mn = fa;
    *mx = fb;
}

void qcal_histobs_clip_range(const qcal_observer *obs, double t, float *mn, float *mx)
{
    float dmin, dmax;
    data_minmax(obs, &dmin, &dmax);
    float ft = (float)t;
    if (!(ft <= FLT_MAX))
        ft = FLT_MAX;
    if (is_lattice(obs)) {
        /* Inside the data: t <= max|x| (the searches stay below it; rounding aside). */
        float a = fmaxf(-dmin, dmax);
        if (ft > a)
            ft = a;
    }
    *mx = ft;
    *mn = dmin < 0.0f ? -ft : 0.0f;
}
