/* The "entropy" observer: TensorRT-style KL-divergence threshold search over a histogram
 * of |x| for symmetric targets; for affine ones the two-ended window search on a histogram
 * of x further down (qcal_hist_entropy_window). |x| variant (documented in
 * include/qcal/observers/histogram.h):
 *   B = the histogram with B[0] = min(B[0], B[1]) (the first bin's spike clamped to its
 *       neighbour; NVIDIA pytorch-quantization sets B[0] = B[1]; see below);
 *   for each candidate i in [levels, bins]:
 *     P = B[0..i-1] with the mass of B[i..] (outliers) added to P[i-1];
 *     Q = the unclipped B[0..i-1] merged into levels (bin j -> level (j * levels) / i,
 *         integer division) and spread evenly back over each level's non-zero bins;
 *     p = P / total, q = Q / (total - outliers)   (totals of B);
 *     KL_i = sum_{j: P_j > 0} p_j * (log p_j - log q_j), +inf if some q_j = 0 < p_j;
 *   threshold = i * bin width for the first i with the smallest KL_i; a candidate with
 *   clipped mass and no data but in bin i-1 is none (P = Q: the degenerate minimum).
 * Building Q from the unclipped bins is what penalises clipping (TensorRT, MXNet); a Q
 * built from P would make KL = 0 at i = levels.
 *
 * Why B[0] = min(B[0], B[1]). ReLU / max-pool outputs hold many exact zeros (31.5%, 50.6% and 63.8% at
 * the conv2, fc1 and fc2 inputs of the demo CNN), all in bin 0. Q spreads each level's mass
 * evenly over its bins, so the level holding that spike smears it over i / levels bins and
 * the KL of a candidate grows with i: the search clips hard (demo conv2: t = 0.39 of 3.22,
 * -7.84 points top-1, 85.93% agreement). A quantizer reproduces 0 exactly for every t, so
 * the spike says nothing about the threshold. Two fixes were measured on the demo's real
 * activations: excluding the exact zeros from P and Q (ncnn) and NVIDIA's B[0] = B[1]. Both
 * pick the same bins on all three layers (conv2 1383 -> t 2.17, fc1 874 -> 3.68, fc2
 * 1191 -> 21.9 of hi 3.22 / 8.61 / 37.7) and give -0.01 points, 99.74% agreement.
 * The first-bin clamp was chosen: it needs no exact-zero count (no extra pass over the
 * data in collection, no change to the histogram state, its merge or its saved format),
 * and it also flattens a first-bin spike of tiny non-zero values (on demo conv2 bin 0
 * still held 63,325 non-zero values against 11,565 in bin 1 once the zeros were removed).
 * min() rather than NVIDIA's plain copy: a first bin emptier than the second is real
 * density (lognormal data) and is kept instead of being filled with mass that is not
 * there (NVIDIA's copy moves the reference lognormal case from bin 128 to 242). Where
 * bin 0 is the fuller one (every demo layer) the two are the same. On smooth data the
 * clamp removes at most a small genuine excess. If only bin 0 holds data the search
 * returns bins (t = hi).
 *
 * Levels: TensorRT searches 128 levels because its int8 is symmetric (|x| -> 0..127);
 * NVIDIA uses 1 << (bits - 1 + unsigned) = 256 for unsigned 8-bit, the analogue for
 * quint8 [0, t]. qcal keeps entropy_levels (default 128) for every data sign: with 256
 * levels on the demo (non-negative inputs, same first-bin clamp) the KL prefers clipping
 * (conv2 t 1.05 instead of 2.17) and loses 0.30 points (97.87% agreement). KL is a
 * proxy that weighs resolution of the dense region above clipping error; 128 levels
 * assume a coarser grid than quint8 has, which offsets that. entropy_levels = 256 gives
 * NVIDIA's unsigned search for those who want it.
 *
 * Evaluation: O(levels) per candidate instead of O(i + levels); 2048 bins: ~2.5 ms on one
 * core (was ~18 ms, measured the same way; 42 ms under heavier load). Level l holds the
 * run of bins [ceil(l i / levels), ceil((l+1) i / levels)) and one q, so its terms sum to
 *   sum_j p_j log p_j - log q_l * sum_j p_j   over the run
 * (j < i - 1; the outlier-laden P[i-1] is added on its own as p (log p - log q)). The two
 * run sums come from prefix sums over j of p_j = count_j / total and of the exact product
 * p_j log p_j (Dekker), kept as double-double pairs, so they are exact to ~1e-32; their
 * difference, which cancels heavily (a level's share of KL ~1e-6 against sums ~1e-2), is
 * formed with an exact product for log q_l * sum p. Runs whose non-zero counts are all
 * equal (sparse or discrete data) have equal terms and take the definition's term times
 * their number instead, so a KL that is 0 by definition comes out exactly 0 (a first
 * minimum at 0 is then found as in the definition). p_j, log p_j and log q_l are the doubles
 * the per-term definition uses (same expressions, the C library's log()), so KL_i is that
 * definition with its terms summed almost exactly: it agrees with the ascending float64 sum
 * of the Python reference to ~1e-13 relative (tests require 1e-12), and the chosen i is the
 * same unless two candidates' KL differ by less than that (tested on 12 reference
 * histograms and against the direct O(bins^2) sum on synthetic ones). Single-threaded: the
 * search is a few ms, and an OpenMP team on a loaded machine cost more than it saved.
 * Per level the bounds are stepped without an integer division and the run's p and log p
 * come from a per-bin table (same doubles as before: the same KL curve bit for bit on 3000
 * random histograms, 0.87-0.93x the time; the log() for log q_l is ~30% of what remains). */
#include <math.h>
#include <string.h>

#include "observers/histogram_kinds.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* ---- error-free transforms ---- */
typedef struct dd {
    double hi, lo;   /* value hi + lo, |lo| <= ulp(hi) / 2 */
} dd;

static inline dd two_sum(double a, double b)
{
    double s = a + b;
    double bb = s - a;
    double e = (a - (s - bb)) + (b - bb);
    return (dd){ s, e };
}

/* a * b = hi + lo exactly (Dekker; no fma: the default build targets any x86-64, where
 * fma() is a library call). |a|, |b| < 2^996. */
static inline dd two_prod(double a, double b)
{
    const double split = 134217729.0;   /* 2^27 + 1 */
    double p = a * b;
    double ca = split * a, cb = split * b;
    double ah = ca - (ca - a), al = a - ah;
    double bh = cb - (cb - b), bl = b - bh;
    double e = ((ah * bh - p) + ah * bl + al * bh) + al * bl;
    return (dd){ p, e };
}

static inline dd dd_add(dd a, dd b)
{
    dd s = two_sum(a.hi, b.hi);
    s.lo += a.lo + b.lo;
    return two_sum(s.hi, s.lo);
}

/* x[e] - x[a] of a double-double prefix sum, unnormalised (hi, lo). */
static inline dd dd_diff(const dd *x, int64_t e, int64_t a)
{
    dd d = two_sum(x[e].hi, -x[a].hi);
    d.lo += x[e].lo - x[a].lo;
    return d;
}

/* Value and n of the first non-zero count at or after bin a, and the first bin past a
 * whose non-zero count differs from it (uniform runs have the same p_j and log p_j). */
typedef struct run_info {
    uint64_t value;
    int64_t differs;
} run_info;

/* The search on counts as given (no first-bin change). */
static int32_t entropy_search_raw(const uint64_t *counts, int32_t bins, int32_t levels,
                                  double *best_kl, double *curve)
{
    uint64_t total = 0;
    for (int32_t j = 0; j < bins; j++)
        total += counts[j];
    if (total == 0 || levels > bins || levels < 1) {
        if (best_kl)
            *best_kl = 0.0;
        return bins;
    }
    size_t nb = (size_t)bins + 1;
    uint64_t *C = qcal_malloc(2 * nb * sizeof *C);     /* prefix counts, non-zero bins */
    dd *PP = qcal_malloc(2 * nb * sizeof *PP);         /* prefix p_j, p_j log p_j */
    run_info *R = qcal_malloc(nb * sizeof *R);
    double *RL = qcal_malloc(2 * nb * sizeof *RL);     /* per R[a]: p and log p */
    int32_t ncand = bins - levels + 1;
    double *kls = qcal_malloc((size_t)ncand * sizeof *kls);
    if (!C || !PP || !R || !RL || !kls) {
        free(C);
        free(PP);
        free(R);
        free(RL);
        free(kls);
        if (best_kl)
            *best_kl = 0.0;
        return bins;
    }
    uint64_t *NZ = C + nb;
    dd *PL = PP + nb;
    const double S = (double)total;
    C[0] = NZ[0] = 0;
    PP[0] = PL[0] = (dd){ 0.0, 0.0 };
    for (int32_t j = 0; j < bins; j++) {
        C[j + 1] = C[j] + counts[j];
        NZ[j + 1] = NZ[j] + (counts[j] > 0);
        dd p = { 0.0, 0.0 }, pl = { 0.0, 0.0 };
        if (counts[j]) {
            double pj = (double)counts[j] / S;
            p.hi = pj;
            pl = two_prod(pj, log(pj));
        }
        PP[j + 1] = dd_add(PP[j], p);
        PL[j + 1] = dd_add(PL[j], pl);
    }
    R[bins] = (run_info){ 0, bins };
    int64_t next_nz = bins;   /* first non-zero bin after j */
    for (int32_t j = bins - 1; j >= 0; j--) {
        if (counts[j] == 0) {
            R[j] = R[j + 1];
            continue;
        }
        bool same = next_nz == bins || counts[next_nz] == counts[j];
        R[j] = (run_info){ counts[j], same ? R[j + 1].differs : next_nz };
        next_nz = j;
    }
    /* p = R[a].value / S and log p of every run start, computed once here instead of once
     * per (candidate, level) below (the same doubles: same expressions). */
    double *RP = RL + nb;
    for (int32_t j = 0; j <= bins; j++) {
        RP[j] = (double)R[j].value / S;
        RL[j] = R[j].value ? log(RP[j]) : 0.0;
    }
    for (int32_t c = 0; c < ncand; c++) {
        const int32_t i = levels + c;
        const uint64_t sq = C[i], outl = total - sq;
        /* Not a candidate: clipped mass with an empty last bin (KL undefined), or clipped
         * mass with no data but the last bin's, whose shape alone P and Q then both are
         * (P = Q, KL 0: the degenerate minimum of one-sided data away from zero). */
        if (sq == 0 || (outl > 0 && (counts[i - 1] == 0 || NZ[i - 1] == 0))) {
            kls[c] = INFINITY;
            continue;
        }
        const double SQ = (double)sq;
        double kl = 0.0, lq = 0.0;
        int64_t a = 0;
        /* Level l ends at b = ceil((l + 1) i / levels), stepped without a division:
         * (l + 1) i = bq levels + br with 0 <= br < levels. */
        const int64_t iq = i / levels, ir = i % levels;
        int64_t bq = 0, br = 0;
        for (int32_t l = 0; l < levels; l++) {
            bq += iq;
            br += ir;
            if (br >= levels) {
                br -= levels;
                bq++;
            }
            int64_t b = bq + (br > 0);   /* ceil */
            uint64_t nz = NZ[b] - NZ[a];
            lq = 0.0;
            if (nz > 0) {
                lq = log(((double)(C[b] - C[a]) / (double)nz) / SQ);
                int64_t e = b == i ? i - 1 : b;   /* P[i-1] is added on its own */
                if (e > a && NZ[e] > NZ[a]) {
                    double d;
                    if (R[a].differs >= e) {
                        /* Equal counts: the terms are equal, as the definition's. */
                        double t = RP[a] * (RL[a] - lq);
                        dd k = two_prod(t, (double)(NZ[e] - NZ[a]));
                        d = k.hi + k.lo;
                    } else {
                        /* sum p log p - lq sum p: the two cancel to the level's share. */
                        dd run = dd_diff(PL, e, a), mass = dd_diff(PP, e, a);
                        dd m = two_prod(lq, mass.hi);
                        d = (run.hi - m.hi) + ((run.lo - m.lo) - lq * mass.lo);
                    }
                    kl += d;
                }
            }
            a = b;
        }
        /* P[i-1] (lq is its level's); zero only without outliers and then skipped, as
         * every P_j = 0 term. */
        uint64_t last = counts[i - 1] + outl;
        if (last > 0) {
            double p = (double)last / S;
            kl += p * (log(p) - lq);
        }
        kls[c] = kl;
    }
    int32_t best = bins;
    double best_v = INFINITY;
    if (curve)
        memcpy(curve, kls, (size_t)ncand * sizeof *kls);
    for (int32_t c = 0; c < ncand; c++)
        if (kls[c] < best_v) {
            best_v = kls[c];
            best = levels + c;
        }
    free(C);
    free(PP);
    free(R);
    free(RL);
    free(kls);
    if (best_kl)
        *best_kl = best_v;
    return best;
}

int32_t qcal_hist_entropy_search(const uint64_t *counts, int32_t bins, int32_t levels,
                                 double *best_kl)
{
    return qcal_hist_entropy_search_curve(counts, bins, levels, best_kl, NULL);
}

int32_t qcal_hist_entropy_search_curve(const uint64_t *counts, int32_t bins, int32_t levels,
                                       double *best_kl, double *kl)
{
    if (bins < 2)
        return entropy_search_raw(counts, bins, levels, best_kl, kl);
    uint64_t *b = qcal_malloc((size_t)bins * sizeof *b);
    if (!b) {
        if (best_kl)
            *best_kl = 0.0;
        return bins;
    }
    memcpy(b, counts, (size_t)bins * sizeof *b);
    if (b[0] > b[1])
        b[0] = b[1];   /* the first bin's spike clamped (see the header comment) */
    int32_t i = entropy_search_raw(b, bins, levels, best_kl, kl);
    free(b);
    return i;
}

/* ---- two-ended search on a signed histogram (asymmetric targets) ----
 * Window [a, b) of bins, n = b - a >= levels: P = counts[a..b) with the mass below a added to
 * P[a] and the mass from b on added to P[b-1]; Q = the unclipped counts[a..b) merged into
 * levels (bin a + k -> level k * levels / n) and spread evenly over each level's non-zero
 * bins; p = P / total, q = Q / (mass inside). Each KL is evaluated as the |x| search's: run
 * sums from double-double prefix sums, equal-count runs term by term.
 *
 * Which windows may clip (issue 36). TensorRT's KL prices a clipped tail by its mass, never
 * by its reach: lumped into P's edge bin, a tail reaching 290 costs what one reaching 21
 * does, and at the narrowest window (levels bins, one bin per level) P = Q inside. On
 * PP-OCRv4 recognition's hard-swish outputs and final Softmax the unbounded search took that
 * window everywhere (int8 exact-match 0%). A KL over the full support cannot see the reach
 * either: moving the clipped mass to Q's edge bin while P keeps it where it was leaves the
 * tail's bins with q = 0, and any smoothing prices each by p log(p / eps), its mass again
 * (measured: with ONNX Runtime's smoothing, eps = 1e-4, that objective kept the whole
 * range, to within one value, on the three PP-OCRv4 tensors tried). Earlier rules bounded
 * the clipped mass by the edge bin's count (66.67%: the outliers alone, ranges 1.2-1.6x
 * histogram's) or the edge level's (19%: a background spike let it clip 14.6%). So the
 * reach is priced by squared error, which is what clipping does to the values: each end
 * moves in from the data's extreme, one bin at a time, only while the window's squared
 * error does not rise (clipped values moved to the edge, kept ones s^2 / 12, s the grid
 * step), i.e. while clipping still pays for itself in resolution; the KL chooses among the
 * ends reached (on peaked data it takes the innermost one, on flat data it may keep more).
 * The limit is recomputed for the current other end in every round of the coordinate
 * descent. Measured on PP-OCRv4
 * recognition (64 calibration lines, 300 held-out, ort profile): 99.00% exact-match
 * (histogram 97.67%, float 99.67%); ranges within 0.92-1.35x of histogram's (median 1.005).
 * A fixed bound, clipping error <= k x rounding error, gave 93.33% (k = 1), 98.67% (1/4)
 * and 96.67% (1/16): not monotone in k, and k has no reason to be any value. */
__extension__ typedef unsigned __int128 u128;

typedef struct kl_ctx {
    const uint64_t *counts;
    int32_t bins, levels;
    int64_t steps;      /* quant_max - quant_min of the target grid */
    uint64_t total;
    u128 *P1, *P2;      /* prefix sums of c_j (2j + 1) and c_j (2j + 1)^2 [bins + 1] */
    uint64_t *C, *NZ;   /* prefix counts, prefix non-zero bins [bins + 1] */
    dd *PP, *PL;        /* prefix p_j and p_j log p_j [bins + 1] */
    run_info *R;        /* [bins + 1] */
    double *RP, *RL;    /* p and log p of R[j].value [bins + 1] */
} kl_ctx;

static void kl_ctx_free(kl_ctx *k)
{
    free(k->C);
    free(k->PP);
    free(k->R);
    free(k->RP);
    free(k->P1);
}

static bool kl_ctx_init(kl_ctx *k, const uint64_t *counts, int32_t bins, int32_t levels,
                        int64_t steps)
{
    memset(k, 0, sizeof *k);
    k->counts = counts;
    k->bins = bins;
    k->levels = levels;
    k->steps = steps;
    size_t nb = (size_t)bins + 1;
    k->C = qcal_malloc(2 * nb * sizeof *k->C);
    k->PP = qcal_malloc(2 * nb * sizeof *k->PP);
    k->R = qcal_malloc(nb * sizeof *k->R);
    k->RP = qcal_malloc(2 * nb * sizeof *k->RP);
    k->P1 = qcal_malloc(2 * nb * sizeof *k->P1);
    if (!k->C || !k->PP || !k->R || !k->RP || !k->P1) {
        kl_ctx_free(k);
        return false;
    }
    k->NZ = k->C + nb;
    k->PL = k->PP + nb;
    k->RL = k->RP + nb;
    k->P2 = k->P1 + nb;
    k->P1[0] = k->P2[0] = 0;
    for (int32_t j = 0; j < bins; j++) {
        k->total += counts[j];
        u128 o = (u128)(2 * (uint64_t)j + 1);
        k->P1[j + 1] = k->P1[j] + o * counts[j];
        k->P2[j + 1] = k->P2[j] + o * o * counts[j];
    }
    const double S = (double)k->total;
    k->C[0] = k->NZ[0] = 0;
    k->PP[0] = k->PL[0] = (dd){ 0.0, 0.0 };
    for (int32_t j = 0; j < bins; j++) {
        k->C[j + 1] = k->C[j] + counts[j];
        k->NZ[j + 1] = k->NZ[j] + (counts[j] > 0);
        dd p = { 0.0, 0.0 }, pl = { 0.0, 0.0 };
        if (counts[j]) {
            double pj = (double)counts[j] / S;
            p.hi = pj;
            pl = two_prod(pj, log(pj));
        }
        k->PP[j + 1] = dd_add(k->PP[j], p);
        k->PL[j + 1] = dd_add(k->PL[j], pl);
    }
    k->R[bins] = (run_info){ 0, bins };
    int64_t next_nz = bins;
    for (int32_t j = bins - 1; j >= 0; j--) {
        if (counts[j] == 0) {
            k->R[j] = k->R[j + 1];
            continue;
        }
        bool same = next_nz == bins || counts[next_nz] == counts[j];
        k->R[j] = (run_info){ counts[j], same ? k->R[j + 1].differs : next_nz };
        next_nz = j;
    }
    for (int32_t j = 0; j <= bins; j++) {
        k->RP[j] = (double)k->R[j].value / S;
        k->RL[j] = k->R[j].value ? log(k->RP[j]) : 0.0;
    }
    return true;
}

/* Sum of p_j (log p_j - lq) over bins [s, e) (no clipped mass in them). */
static double kl_run(const kl_ctx *k, int64_t s, int64_t e, double lq)
{
    if (e <= s || k->NZ[e] == k->NZ[s])
        return 0.0;
    if (k->R[s].differs >= e) {
        double t = k->RP[s] * (k->RL[s] - lq);
        dd m = two_prod(t, (double)(k->NZ[e] - k->NZ[s]));
        return m.hi + m.lo;
    }
    dd run = dd_diff(k->PL, e, s), mass = dd_diff(k->PP, e, s);
    dd m = two_prod(lq, mass.hi);
    return (run.hi - m.hi) + ((run.lo - m.lo) - lq * mass.lo);
}

/* Squared error of quantizing to window [a, b), up to a constant factor: every value at its
 * bin's centre; a value outside is moved to the edge it is clamped to, a value inside is
 * given the rounding error of a grid of `steps` steps over the window, s^2 / 12 (s = (b - a)
 * / steps bins). In units of (bin width / 2)^2 / (3 steps^2): 3 steps^2 clip4 + kept (b - a)^2
 * with clip4 = sum_{j<a} c_j (2a - 2j - 1)^2 + sum_{j>=b} c_j (2j + 1 - 2b)^2, exact in
 * 128-bit integers from the prefix sums (every term < 2^115 for bins <= 2^24, the config's
 * limit, and any uint64 total), then rounded once to double. */
static double window_sq_error(const kl_ctx *k, int32_t a, int32_t b)
{
    const u128 *P1 = k->P1, *P2 = k->P2;
    const uint64_t *C = k->C;
    const int32_t N = k->bins;
    const u128 A = 2 * (u128)(uint64_t)a, B = 2 * (u128)(uint64_t)b;
    const u128 below = (A * A * C[a] + P2[a]) - 2 * A * P1[a];
    const u128 above = ((P2[N] - P2[b]) + B * B * (C[N] - C[b])) - 2 * B * (P1[N] - P1[b]);
    const double n = (double)b - a, steps = (double)k->steps;
    return (double)(below + above) * 3.0 * steps * steps + (double)(C[b] - C[a]) * n * n;
}

/* How far the high end may move in for low end a: from `bins` down, one bin at a time,
 * while the squared error does not rise; never below `floor`. */
static int32_t hi_limit(const kl_ctx *k, int32_t a, int32_t floor)
{
    int32_t c = k->bins;
    double ec = window_sq_error(k, a, c);
    while (c - 1 >= floor) {
        double en = window_sq_error(k, a, c - 1);
        if (en > ec)
            break;
        ec = en;
        c--;
    }
    return c;
}

/* The same for the low end with high end b: from 0 up while the error does not rise, never
 * above `ceil`. */
static int32_t lo_limit(const kl_ctx *k, int32_t b, int32_t ceil)
{
    int32_t c = 0;
    double ec = window_sq_error(k, c, b);
    while (c + 1 <= ceil) {
        double en = window_sq_error(k, c + 1, b);
        if (en > ec)
            break;
        ec = en;
        c++;
    }
    return c;
}

/* KL of window [a, b); +inf if it is not a candidate: nothing inside, clipped mass landing
 * on an empty edge bin (KL undefined), or clipped mass with no data inside but the edge bins
 * that receive it (P = Q whatever is clipped: the degenerate minimum). Which windows the
 * search may clip to at all is hi_limit / lo_limit's. */
static double kl_window(const kl_ctx *k, int32_t a, int32_t b)
{
    const uint64_t *counts = k->counts;
    const uint64_t below = k->C[a], above = k->total - k->C[b], sq = k->C[b] - k->C[a];
    if (sq == 0 || (below > 0 && counts[a] == 0) || (above > 0 && counts[b - 1] == 0))
        return INFINITY;
    if (below + above > 0) {
        uint64_t nz = k->NZ[b] - k->NZ[a];
        uint64_t edges = (below > 0) + (above > 0 && (b - 1 != a || below == 0));
        if (nz <= edges)
            return INFINITY;
    }
    const int64_t n = (int64_t)b - a, levels = k->levels;
    const double S = (double)k->total, SQ = (double)sq;
    double kl = 0.0, lq_first = 0.0, lq_last = 0.0;
    int64_t s = 0;
    for (int64_t l = 0; l < levels; l++) {
        int64_t e = ((l + 1) * n + levels - 1) / levels;   /* ceil((l+1) n / levels) */
        if (e > s) {
            int64_t ga = a + s, gb = a + e;
            uint64_t nz = k->NZ[gb] - k->NZ[ga];
            double lq = 0.0;
            if (nz > 0)
                lq = log(((double)(k->C[gb] - k->C[ga]) / (double)nz) / SQ);
            if (s == 0)
                lq_first = lq;
            if (e == n)
                lq_last = lq;
            /* Interior bins; bins a and b - 1 (clipped mass added) on their own below. */
            int64_t rs = ga > a ? ga : a + 1, re = gb < b ? gb : b - 1;
            if (nz > 0)
                kl += kl_run(k, rs, re, lq);
        }
        s = e;
    }
    if (b - 1 == a) {
        double p = (double)(counts[a] + below + above) / S;
        kl += p * (log(p) - lq_first);
    } else {
        uint64_t pa = counts[a] + below, pb = counts[b - 1] + above;
        if (pa > 0) {
            double p = (double)pa / S;
            kl += p * (log(p) - lq_first);
        }
        if (pb > 0) {
            double p = (double)pb / S;
            kl += p * (log(p) - lq_last);
        }
    }
    return kl;
}

bool qcal_hist_entropy_window(const uint64_t *counts, int32_t bins, int32_t levels,
                              int64_t steps, int32_t z, int32_t *lo, int32_t *hi,
                              double *best_kl, double *curve)
{
    *lo = 0;
    *hi = bins;
    if (best_kl)
        *best_kl = 0.0;
    if (levels < 1 || levels > bins)
        return true;
    uint64_t *b = qcal_malloc((size_t)bins * sizeof *b);
    if (!b)
        return false;
    memcpy(b, counts, (size_t)bins * sizeof *b);
    /* The zero bin's spike clamped to its fuller neighbour (bin 0 for non-negative data:
     * min(B[0], B[1]), the |x| search's clamp). */
    if (z >= 0 && z < bins && bins >= 2) {
        uint64_t nb = 0;
        if (z > 0)
            nb = b[z - 1];
        if (z + 1 < bins && b[z + 1] > nb)
            nb = b[z + 1];
        if (b[z] > nb)
            b[z] = nb;
    }
    kl_ctx k;
    if (!kl_ctx_init(&k, b, bins, levels, steps)) {
        free(b);
        return false;
    }
    if (k.total == 0) {
        kl_ctx_free(&k);
        free(b);
        return true;
    }
    /* Windows contain the zero bin when the data reach zero: an affine grid always holds
     * zero, so a window without it is not the grid the quantizer would use. */
    const int32_t amax_z = z >= 0 ? z : bins, bmin_z = z >= 0 ? z + 1 : 0;
    int32_t a = 0, e = bins;
    double cur = kl_window(&k, a, e);
    /* Coordinate descent: the best b for the current a (smallest b of the minimum: the
     * tighter end on ties), then the best a for that b (largest a), until a round no longer
     * lowers the KL. Each step never raises it. */
    for (int round = 0; round < 64; round++) {
        double before = cur;
        int32_t bstart = a + levels > bmin_z ? a + levels : bmin_z;
        bstart = hi_limit(&k, a, bstart);
        for (int32_t c = bstart; c <= bins; c++) {
            double v = kl_window(&k, a, c);
            if (v < cur || (v == cur && c < e)) {
                cur = v;
                e = c;
            }
        }
        int32_t astop = e - levels < amax_z ? e - levels : amax_z;
        if (astop >= 0)
            astop = lo_limit(&k, e, astop);
        for (int32_t c = astop; c >= 0; c--) {
            double v = kl_window(&k, c, e);
            if (v < cur || (v == cur && c > a)) {
                cur = v;
                a = c;
            }
        }
        if (!(cur < before))
            break;
    }
    if (curve) {
        int32_t lim = hi_limit(&k, a, a + levels > bmin_z ? a + levels : bmin_z);
        for (int32_t c = levels; c <= bins; c++)
            curve[c - levels] = c >= lim ? kl_window(&k, a, c) : INFINITY;
    }
    kl_ctx_free(&k);
    free(b);
    *lo = a;
    *hi = e;
    if (best_kl)
        *best_kl = cur;
    return true;
}

static qcal_status entropy_qrange(const qcal_observer *obs, int64_t cap, float *mn, float *mx,
                                  int64_t *n)
{
    (void)cap;
    qcal_hist view;
    qcal_status st;
    const qcal_hist *h = qcal_histobs_qrange_begin(obs, mn, mx, n, &view, &st);
    if (!h)
        return st;
    if (!h->absval) {
        /* Asymmetric target: both ends searched on the signed histogram. */
        int32_t a = 0, b = h->bins;
        if (h->lo != h->hi) {
            int64_t qmin, qmax;
            qcal_status st2 = qcal_qconfig_range(&obs->cfg.q, &qmin, &qmax);
            if (st2 == QCAL_OK &&
                !qcal_hist_entropy_window(h->counts, h->bins, obs->cfg.entropy_levels,
                                          qmax - qmin, qcal_hist_zero_bin(h), &a, &b, NULL,
                                          NULL))
                st2 = QCAL_ERR_NO_MEMORY;
            if (st2 != QCAL_OK) {
                qcal_histobs_qrange_end(&view);
                return st2;
            }
        }
        qcal_histobs_window_range(obs, h, a, b, 0.0, mn, mx);
        qcal_histobs_qrange_end(&view);
        return QCAL_OK;
    }
    double t = h->hi;
    if (h->lo != h->hi) {
        int32_t i = qcal_hist_entropy_search(h->counts, h->bins, obs->cfg.entropy_levels, NULL);
        t = (double)i * ((double)h->hi / h->bins);
    }
    qcal_histobs_qrange_end(&view);
    qcal_histobs_clip_range(obs, t, mn, mx);
    return QCAL_OK;
}

const qcal_observer_ops qcal_observer_entropy_ops = {
    .kind = QCAL_OBSERVER_ENTROPY,
    .init = qcal_histobs_init,
    .fini = qcal_histobs_fini,
    .update = qcal_histobs_update,
    .channels = qcal_histobs_channels,
    .data_range = qcal_histobs_data_range,
    .qrange = entropy_qrange,
    .reset = qcal_histobs_reset,
    .merge = qcal_histobs_merge,
    .save = qcal_histobs_save,
    .load = qcal_histobs_load,
};
