/* The "mse" observer: NVIDIA pytorch-quantization HistogramCalibrator's MSE search over a
 * histogram of |x|: candidate amax = centre of bin i for i in [min(128, bins-1), bins);
 * error = sum over bins j of count_j * (dequant(quant(c_j)) - c_j)^2 with c_j the bin
 * centre, quant(c) = min(nearbyint(c / s), nlev) (round half to even), s = amax / nlev;
 * mse = error / bins; the first i with the smallest mse wins. See
 * include/qcal/observers/histogram.h.
 *
 * Exact integer evaluation. With w the bin width, c_j = w (2j+1)/2 and s = w (2i+1)/(2 nlev),
 * so c_j / s = (2j+1) nlev / (2i+1), which is never a half-integer ((2j+1) nlev / (2i+1) =
 * (2k+1) / 2 would need the even 2 (2j+1) nlev to equal the odd (2k+1)(2i+1)); hence
 * q_j = round((2j+1) nlev / (2i+1))
 * in integers is what nearbyint() of the double ratio gives (its error, ~1e-16 relative, is
 * far below the ratio's distance 1/(2(2i+1)) from a half-integer while (2j+1) nlev < 2^50).
 * Then q_j s - c_j = w / (2 nlev) * e_j with the integer e_j = q_j (2i+1) - (2j+1) nlev, and
 * error = (w / (2 nlev))^2 * E_i, E_i = sum_j count_j e_j^2, exactly. Bins sharing a level q
 * form a run; with prefix sums S0, S1, S2 of count_j, count_j (2j+1), count_j (2j+1)^2
 * (128-bit) each run adds (q(2i+1))^2 S0 - 2 q (2i+1) nlev S1 + nlev^2 S2: O(nlev) per
 * candidate instead of O(bins) (timings: docs/performance.md). Candidates compare
 * by the exact E_i, so near-ties are decided exactly where the former all-double loop (and
 * numpy) could pick either; the returned mse is E_i scaled in double (relative error a few
 * ulp; the float64 reference sums agree within 1e-12). Counts or sizes too large for 128
 * bits (8 nlev^2 (bins+1)^2 total >= 2^126) fall back to the direct O(bins^2) double loop. */
#include <math.h>
#include <string.h>

#include "observers/histogram_kinds.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

__extension__ typedef unsigned __int128 u128;

/* The former direct evaluation: every candidate over every bin, in double. */
static int32_t mse_search_direct(const uint64_t *counts, int32_t bins, double hi, int64_t nlev,
                                 double *best_mse, double *curve)
{
    double w = hi / bins;
    int32_t start = bins - 1 < 128 ? bins - 1 : 128;
    int32_t best = bins - 1;
    double best_v = INFINITY;
    const double lev = (double)nlev;
    for (int32_t i = start; i < bins; i++) {
        double amax = ((double)i + 0.5) * w;
        double s = amax / lev;
        double err = 0.0;
        for (int32_t j = 0; j < bins; j++) {
            if (!counts[j])
                continue;
            double c = ((double)j + 0.5) * w;
            double q = nearbyint(c / s);
            if (q > lev)
                q = lev;
            double d = q * s - c;
            double dd = d * d;
            err += dd * (double)counts[j];
        }
        double mse = err / bins;
        if (curve)
            curve[i - start] = mse;
        if (mse < best_v) {
            best_v = mse;
            best = i;
        }
    }
    if (best_mse)
        *best_mse = best_v;
    return best;
}

/* E_i = sum_j count_j e_j^2 for candidate i (see the top of this file). Level q + 1 starts
 * at the first bin j with round((2j+1) L / D) >= q + 1, i.e. (2j+1) 2L >= (2q+1) D:
 * j >= ceil(n_q / 4L) with n_q = (2q+1) D - 2L (0 when n_q <= 0). n_q grows by 2D per level,
 * so the ceiling is carried as a quotient and remainder (n_q = c 4L - r, 0 <= r < 4L)
 * instead of dividing at every level: the same integers, without a 64-bit division in the
 * search's inner loop (which dominated it). */
static u128 candidate_error(const u128 *P0, const u128 *P1, const u128 *P2, int32_t bins,
                            int32_t i, int64_t L)
{
    const int64_t D = 2 * (int64_t)i + 1;
    const int64_t M = 4 * L;
    const int64_t n0 = D - 2 * L;
    int64_t c = n0 >= 0 ? (n0 + M - 1) / M : -(-n0 / M);
    int64_t r = c * M - n0;
    const int64_t k = (2 * D) / M, s = (2 * D) % M;
    u128 E = 0;
    int64_t a = 0;
    for (int64_t q = 0; q <= L && a < bins; q++) {
        int64_t b = q == L ? bins : (c > 0 ? c : 0);
        c += k;
        r -= s;
        if (r < 0) {
            r += M;
            c++;
        }
        if (b > bins)
            b = bins;
        if (b <= a)
            continue;
        /* s0 <= the total count, which is a uint64_t */
        uint64_t s0 = (uint64_t)(P0[b] - P0[a]);
        u128 s1 = P1[b] - P1[a];
        a = b;
        if (s0 == 0)
            continue;
        uint64_t A = (uint64_t)q * (uint64_t)D;   /* < 2^50 */
        E += (u128)A * A * s0 - (u128)(2 * A * (uint64_t)L) * s1;
    }
    /* The levels partition [0, bins), so their L^2 s2 terms sum to L^2 P2[bins]: added once.
     * Every step is exact modulo 2^128 and the true sum of squares is below 2^126 (the
     * caller's bound), so the order of the terms does not change E. */
    return E + (u128)((uint64_t)L * (uint64_t)L) * P2[bins];
}

int32_t qcal_hist_mse_search(const uint64_t *counts, int32_t bins, double hi, int64_t nlev,
                             double *best_mse)
{
    return qcal_hist_mse_search_curve(counts, bins, hi, nlev, best_mse, NULL);
}

int32_t qcal_hist_mse_search_curve(const uint64_t *counts, int32_t bins, double hi,
                                   int64_t nlev, double *best_mse, double *curve)
{
    int64_t L = nlev < 1 ? 1 : nlev;
    uint64_t total = 0;
    for (int32_t j = 0; j < bins; j++)
        total += counts[j];
    /* Every term of candidate_error is below 8 L^2 (bins+1)^2 total; the levels must also
     * be few enough to walk (else bins are their own levels: the direct loop is as cheap). */
    double bound = 8.0 * (double)L * (double)L * ((double)bins + 1.0) * ((double)bins + 1.0) *
                   (double)total;
    double two_a_l = 2.0 * (double)L * (double)L * (2.0 * bins + 1.0);   /* >= 2 q D L */
    if (!(bound < 0x1p126) || L > bins || two_a_l >= 0x1p63)
        return mse_search_direct(counts, bins, hi, nlev, best_mse, curve);
    u128 *P = qcal_malloc(3 * ((size_t)bins + 1) * sizeof *P);
    int32_t start = bins - 1 < 128 ? bins - 1 : 128;
    int32_t ncand = bins - start;
    u128 *E = qcal_malloc((size_t)ncand * sizeof *E);
    if (!P || !E) {
        free(P);
        free(E);
        return mse_search_direct(counts, bins, hi, nlev, best_mse, curve);
    }
    u128 *P0 = P, *P1 = P + bins + 1, *P2 = P + 2 * ((size_t)bins + 1);
    P0[0] = P1[0] = P2[0] = 0;
    for (int32_t j = 0; j < bins; j++) {
        uint64_t o = 2 * (uint64_t)j + 1;
        P0[j + 1] = P0[j] + counts[j];
        P1[j + 1] = P1[j] + (u128)counts[j] * o;
        P2[j + 1] = P2[j] + (u128)counts[j] * (o * o);
    }
    for (int32_t c = 0; c < ncand; c++)
        E[c] = candidate_error(P0, P1, P2, bins, start + c, L);
    int32_t best = 0;
    for (int32_t c = 1; c < ncand; c++)
        if (E[c] < E[best])
            best = c;
    double f = hi / bins / (2.0 * (double)L);
    if (best_mse)
        *best_mse = (double)E[best] * (f * f) / bins;
    if (curve)
        for (int32_t c = 0; c < ncand; c++)
            curve[c] = (double)E[c] * (f * f) / bins;
    free(P);
    free(E);
    return start + best;
}

/* ---- two-ended search on a signed histogram (asymmetric targets) ----
 * Candidate [lo, hi] = the edges of the bins window [a, b), m = b - a bins (the whole
 * histogram, [0, bins), clips nothing; bin-centre ends, as the |x| search's, would clip half
 * of an edge bin that the centre model counts as unclipped - 70% of an image whose
 * background is its minimum). The grid lo + k s, s = (hi - lo) / L, k = 0..L (an affine grid;
 * the zero point's rounding, under half a step, is left out as NVIDIA leaves it out). Bin j's
 * centre sits t = (2 (j - a) + 1) L / 2m steps above lo and quantizes to q_j = clamp(round(t),
 * 0, L) (ties up); its error is (w / 2L) e_j with the integer e_j = 2 q_j m - (2 (j - a) + 1) L
 * = A_q - 2 j L, A_q = 2 q m + 2 a L - L. Runs of equal q add A^2 S0 - 4 A L S1 over prefix
 * sums of count_j and count_j j (128-bit, modulo 2^128: A may be negative, the true total is
 * below 2^126), plus 4 L^2 sum count_j j^2 once: E = sum count_j e_j^2 exactly,
 * O(min(L, bins)) per candidate. Bounds as the |x| search (32 L^2 (bins+1)^2 total < 2^126,
 * L <= bins), else each candidate is summed bin by bin in double. */
typedef struct mse_ctx {
    const uint64_t *counts;
    int32_t bins;
    int64_t L;
    bool exact;
    u128 *P0, *P1, *P2;   /* [bins + 1] */
} mse_ctx;

static u128 window_error(const mse_ctx *x, int32_t a, int32_t b)
{
    const int64_t m = (int64_t)b - a, L = x->L, M = 2 * L;
    const u128 *P0 = x->P0, *P1 = x->P1;
    /* Level q >= 1 starts at bin a + ceil(((2q - 1) m - L) / 2L): n = c M - r, 0 <= r < M. */
    int64_t n = m - L;   /* q = 1 */
    int64_t c = n >= 0 ? (n + M - 1) / M : -(-n / M), r = c * M - n;
    const int64_t k = (2 * m) / M, s = (2 * m) % M;
    u128 E = 0;
    int64_t start = 0;
    for (int64_t q = 0; q <= L && start < x->bins; q++) {
        int64_t end = x->bins;
        if (q < L) {
            end = a + c;
            c += k;
            r -= s;
            if (r < 0) {
                r += M;
                c++;
            }
            if (end > x->bins)
                end = x->bins;
        }
        if (end <= start)
            continue;
        uint64_t s0 = (uint64_t)(P0[end] - P0[start]);
        u128 s1 = P1[end] - P1[start];
        start = end;
        if (s0 == 0)
            continue;
        int64_t Ai = 2 * q * m + 2 * (int64_t)a * L - L;
        u128 A = (u128)(__int128)Ai;
        E += A * A * s0 - A * (u128)(4 * (uint64_t)L) * s1;
    }
    return E + (u128)(4 * (uint64_t)L * (uint64_t)L) * x->P2[x->bins];
}

/* The same error in double, bin by bin (counts or levels beyond the exact path's bounds). */
static double window_error_direct(const mse_ctx *x, int32_t a, int32_t b)
{
    const double m2 = 2.0 * ((double)b - a), L = (double)x->L;
    double err = 0.0;
    for (int32_t j = 0; j < x->bins; j++) {
        if (!x->counts[j])
            continue;
        double kk = (2.0 * ((double)j - a) + 1.0) * L;
        double q = floor(kk / m2 + 0.5);
        q = q < 0.0 ? 0.0 : q > L ? L : q;
        double e = q * m2 - kk;
        err += e * e * (double)x->counts[j];
    }
    return err;
}

/* Candidate error as a double in units of (w / 2L)^2 (exact path: E rounded once). */
static double window_value(const mse_ctx *x, int32_t a, int32_t b, u128 *exact)
{
    if (x->exact) {
        *exact = window_error(x, a, b);
        return (double)*exact;
    }
    *exact = 0;
    return window_error_direct(x, a, b);
}

/* a/b better than the current best (exact integers on the exact path). */
static bool window_less(const mse_ctx *x, u128 ea, double va, u128 eb, double vb)
{
    return x->exact ? ea < eb : va < vb;
}

bool qcal_hist_mse_window(const uint64_t *counts, int32_t bins, int64_t nlev, int32_t z,
                          int32_t *lo, int32_t *hi, double *best_err, double *curve)
{
    int64_t L = nlev < 1 ? 1 : nlev;
    *lo = 0;
    *hi = bins;
    if (best_err)
        *best_err = 0.0;
    if (bins < 2)
        return true;
    uint64_t total = 0;
    for (int32_t j = 0; j < bins; j++)
        total += counts[j];
    double bound = 32.0 * (double)L * (double)L * ((double)bins + 1.0) * ((double)bins + 1.0) *
                   (double)total;
    mse_ctx x = { .counts = counts, .bins = bins, .L = L,
                  .exact = bound < 0x1p126 && L <= bins &&
                           8.0 * (double)L * (double)L * (2.0 * bins + 1.0) < 0x1p62 };
    if (x.exact) {
        x.P0 = qcal_malloc(3 * ((size_t)bins + 1) * sizeof *x.P0);
        if (!x.P0)
            return false;
        x.P1 = x.P0 + bins + 1;
        x.P2 = x.P1 + bins + 1;
        x.P0[0] = x.P1[0] = x.P2[0] = 0;
        for (int32_t j = 0; j < bins; j++) {
            x.P0[j + 1] = x.P0[j] + counts[j];
            x.P1[j + 1] = x.P1[j] + (u128)counts[j] * (uint64_t)j;
            x.P2[j + 1] = x.P2[j] + (u128)counts[j] * ((uint64_t)j * (uint64_t)j);
        }
    }
    const int32_t minw = bins - 1 < 128 ? bins - 1 : 128;
    const int32_t amax_z = z >= 0 ? z : bins - 1, bmin_z = z >= 0 ? z + 1 : 1;
    int32_t a = 0, b = bins;
    u128 ecur;
    double vcur = window_value(&x, a, b, &ecur);
    /* Coordinate descent as the entropy window search: best b for the current a (smallest
     * on ties), then best a for that b (largest on ties), until a round gains nothing. */
    for (int round = 0; round < 64; round++) {
        u128 ebefore = ecur;
        double vbefore = vcur;
        int32_t bstart = a + minw > bmin_z ? a + minw : bmin_z;
        for (int32_t c = bstart; c <= bins; c++) {
            u128 e;
            double v = window_value(&x, a, c, &e);
            if (window_less(&x, e, v, ecur, vcur) ||
                (!window_less(&x, ecur, vcur, e, v) && c < b)) {
                ecur = e;
                vcur = v;
                b = c;
            }
        }
        int32_t astop = b - minw < amax_z ? b - minw : amax_z;
        for (int32_t c = astop; c >= 0; c--) {
            u128 e;
            double v = window_value(&x, c, b, &e);
            if (window_less(&x, e, v, ecur, vcur) ||
                (!window_less(&x, ecur, vcur, e, v) && c > a)) {
                ecur = e;
                vcur = v;
                a = c;
            }
        }
        if (!window_less(&x, ecur, vcur, ebefore, vbefore))
            break;
    }
    if (curve)
        for (int32_t c = minw; c <= bins; c++) {
            u128 e;
            curve[c - minw] = c - a >= minw && c >= bmin_z
                                  ? window_value(&x, a, c, &e) / bins
                                  : INFINITY;
        }
    free(x.P0);
    *lo = a;
    *hi = b;
    if (best_err)
        *best_err = vcur / bins;
    return true;
}

qcal_status qcal_histobs_mse_levels(const qcal_observer *obs, const qcal_hist *h,
                                    int64_t *nlev)
{
    int64_t qmin, qmax;
    qcal_status st = qcal_qconfig_range(&obs->cfg.q, &qmin, &qmax);
    if (st != QCAL_OK)
        return st;
    /* Non-negative data with an affine scheme uses every level for [0, amax]; otherwise
     * half of them serve each sign (127 for 8 bits, as NVIDIA's narrow range). */
    bool unsigned_range = h->dmin >= 0.0f && (obs->cfg.q.qscheme == QCAL_PER_TENSOR_AFFINE);
    *nlev = unsigned_range ? qmax - qmin : (qmax - qmin) / 2;
    if (*nlev < 1)
        *nlev = 1;
    return QCAL_OK;
}

static qcal_status mse_qrange(const qcal_observer *obs, int64_t cap, float *mn, float *mx,
                              int64_t *n)
{
    (void)cap;
    qcal_hist view;
    qcal_status st0;
    const qcal_hist *h = qcal_histobs_qrange_begin(obs, mn, mx, n, &view, &st0);
    if (!h)
        return st0;
    if (!h->absval) {
        /* Asymmetric target: both ends searched on the signed histogram, over every level
         * of the dtype (quant_max - quant_min). */
        int32_t a = 0, b = h->bins;
        if (h->lo != h->hi) {
            int64_t qmin, qmax;
            qcal_status st = qcal_qconfig_range(&obs->cfg.q, &qmin, &qmax);
            if (st == QCAL_OK &&
                !qcal_hist_mse_window(h->counts, h->bins, qmax - qmin, qcal_hist_zero_bin(h),
                                      &a, &b, NULL, NULL))
                st = QCAL_ERR_NO_MEMORY;
            if (st != QCAL_OK) {
                qcal_histobs_qrange_end(&view);
                return st;
            }
        }
        qcal_histobs_window_range(obs, h, a, b, 0.0, mn, mx);
        qcal_histobs_qrange_end(&view);
        return QCAL_OK;
    }
    double t = h->hi;
    if (h->lo != h->hi) {
        int64_t nlev;
        qcal_status st = qcal_histobs_mse_levels(obs, h, &nlev);
        if (st != QCAL_OK) {
            qcal_histobs_qrange_end(&view);
            return st;
        }
        int32_t i = qcal_hist_mse_search(h->counts, h->bins, h->hi, nlev, NULL);
        t = ((double)i + 0.5) * ((double)h->hi / h->bins);
    }
    qcal_histobs_qrange_end(&view);
    qcal_histobs_clip_range(obs, t, mn, mx);
    return QCAL_OK;
}

const qcal_observer_ops qcal_observer_mse_ops = {
    .kind = QCAL_OBSERVER_MSE,
    .init = qcal_histobs_init,
    .fini = qcal_histobs_fini,
    .update = qcal_histobs_update,
    .channels = qcal_histobs_channels,
    .data_range = qcal_histobs_data_range,
    .qrange = mse_qrange,
    .reset = qcal_histobs_reset,
    .merge = qcal_histobs_merge,
    .save = qcal_histobs_save,
    .load = qcal_histobs_load,
};
