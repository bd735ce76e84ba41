/* The lattice histogram (see histogram_lattice.h): cells of width 2^e anchored at zero, e a
 * function of the data range, exact growth and merges, a canonical saved payload, and the
 * re-binned view the range searches run on. The binning kernels are the histogram kernel
 * family (histogram_dsp.h); its single-pass update runs them threaded itself, smaller
 * batches go through the driver (histogram_bin.h). */
#include <float.h>
#include <math.h>
#include <string.h>

#include "core/cpu.h"
#include "observers/histogram_bin.h"
#include "observers/histogram_lattice.h"
#include "observers/minmax_dsp.h"
#include "observers/minmax_kernels.h"
#include "qcal_config.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* ---- cell index ------------------------------------------------------------------------ */

/* The same index in double (exact: no underflow or overflow for float v and |e| <= 149). */
static inline int64_t cell_exact(float v, int32_t e)
{
    return (int64_t)floor(ldexp((double)v, -e));
}

static bool exponent_ok(float vmin, float vmax, int32_t e, int32_t cells)
{
    int64_t a = cell_exact(vmin, e), b = cell_exact(vmax, e);
    return a >= -QCAL_LATTICE_JLIM && b < QCAL_LATTICE_JLIM && b - a + 1 <= cells;
}

int32_t qcal_lattice_exponent(float vmin, float vmax, int32_t cells)
{
    float m = fmaxf(fabsf(vmin), fabsf(vmax));
    int32_t e = QCAL_LATTICE_EMIN;
    if (m > 0.0f) {
        /* Below ilogb(m) - 24 the index bound fails, so start a little under it. */
        int32_t s = ilogbf(m) - 25;
        if (s > e)
            e = s;
    }
    while (e < 149 && !exponent_ok(vmin, vmax, e, cells))
        e++;
    return e;
}

static inline float scale_of(int32_t e)
{
    return ldexpf(1.0f, -e);   /* 2^-e, a normal or subnormal float for e in [-127, 149] */
}

/* ---- state ----------------------------------------------------------------------------- */

qcal_status qcal_lattice_init(qcal_lattice *L, int32_t bins, bool absval)
{
    memset(L, 0, sizeof *L);
    L->cells = bins >= 1 ? 2 * bins : 2;
    L->absval = absval;
    L->counts = qcal_calloc((size_t)L->cells, sizeof *L->counts);
    if (!L->counts)
        return QCAL_ERR_NO_MEMORY;
    qcal_lattice_clear(L);
    return QCAL_OK;
}

void qcal_lattice_free(qcal_lattice *L)
{
    if (!L)
        return;
    free(L->counts);
    L->counts = NULL;
}

void qcal_lattice_clear(qcal_lattice *L)
{
    L->e = 0;
    L->jlo = 0;
    L->dmin = INFINITY;
    L->dmax = -INFINITY;
    L->total = 0;
    if (L->counts)
        memset(L->counts, 0, (size_t)L->cells * sizeof *L->counts);
}

static float vmin_of(bool absval, float dmin, float dmax)
{
    (void)dmax;
    return absval ? 0.0f : dmin;
}

static float vmax_of(bool absval, float dmin, float dmax)
{
    return absval ? fmaxf(-dmin, dmax) + 0.0f : dmax;
}

float qcal_lattice_vmin(const qcal_lattice *L)
{
    return vmin_of(L->absval, L->dmin, L->dmax);
}

float qcal_lattice_vmax(const qcal_lattice *L)
{
    return vmax_of(L->absval, L->dmin, L->dmax);
}

int64_t qcal_lattice_jmin(const qcal_lattice *L)
{
    return cell_exact(qcal_lattice_vmin(L), L->e);
}

int64_t qcal_lattice_jmax(const qcal_lattice *L)
{
    return cell_exact(qcal_lattice_vmax(L), L->e);
}

uint64_t qcal_lattice_count(const qcal_lattice *L, int64_t j)
{
    int64_t i = j - L->jlo;
    return (i >= 0 && i < L->cells) ? L->counts[i] : 0;
}

/* Window start for data in cells [jmin, jmax]: |x| lattices start at 0 (all spare cells
 * above); signed ones centre the data so growth on either side stays inside. */
static int64_t window_start(bool absval, int64_t jmin, int64_t jmax, int32_t cells)
{
    if (absval)
        return 0;
    int64_t spare = (int64_t)cells - (jmax - jmin + 1);
    int64_t jlo = jmin - spare / 2;
    if (jlo < -QCAL_LATTICE_JLIM)
        jlo = -QCAL_LATTICE_JLIM;
    if (jlo + cells > QCAL_LATTICE_JLIM)
        jlo = QCAL_LATTICE_JLIM - cells;
    return jlo;
}

static qcal_lattice_grid grid_of(const qcal_lattice *L)
{
    qcal_lattice_grid g;
    g.scale = scale_of(L->e);
    g.jlo = (int32_t)L->jlo;
    int64_t acc = QCAL_LATTICE_JLIM - L->jlo;
    g.accept = (int32_t)(acc < L->cells ? acc : L->cells);
    g.absval = L->absval;
    return g;
}

/* ---- growth, update, merge ------------------------------------------------------------- */

/* floor(v / 2^k) for k >= 0: an arithmetic shift, defined for any k (a window that grew by 64
 * or more doublings at once, e.g. from values near 1e-30 to 1e+30, maps every old cell to
 * 0 or -1; a shift by 64 or more would be undefined). */
static inline int64_t floor_shift(int64_t v, int k)
{
    return k >= 63 ? (v < 0 ? -1 : 0) : v >> k;
}

/* A new window of counts for exponent e and data cells [jmin, jmax], holding L's counts
 * (shifted down by e - L->e doublings) and, if src, src's likewise. */
static qcal_status regrid(const qcal_lattice *L, const qcal_lattice *src, int32_t e,
                          int64_t jmin, int64_t jmax, uint64_t **out, int64_t *jlo_out)
{
    uint64_t *nc = qcal_calloc((size_t)L->cells, sizeof *nc);
    if (!nc)
        return QCAL_ERR_NO_MEMORY;
    int64_t jlo = window_start(L->absval, jmin, jmax, L->cells);
    const qcal_lattice *parts[2] = { L, src };
    for (int p = 0; p < 2; p++) {
        const qcal_lattice *s = parts[p];
        if (!s || s->total == 0)
            continue;
        int k = e - s->e;
        for (int32_t i = 0; i < s->cells; i++) {
            if (!s->counts[i])
                continue;
            int64_t j = floor_shift(s->jlo + i, k);
            nc[j - jlo] += s->counts[i];
        }
    }
    *out = nc;
    *jlo_out = jlo;
    return QCAL_OK;
}

/* ---- single-pass update ------------------------------------------------------------------
 * A batch is split into one part per thread. Each part bins into its own window of counts,
 * which starts as L's window and grows when the kernel (lattice_bin_until) stops at a chunk
 * holding a value outside it: the window is moved to the exponent of everything seen so far
 * (L's range, the part's binned values and that chunk), its counts are carried over exactly
 * (doubling the width adds adjacent cells) and binning goes on from that chunk. Every part's
 * exponent is at most the final one (the exponent only grows with the range), so the parts
 * are added into L's final window exactly, in thread order; the result is the one binning
 * the whole batch on the final lattice gives, without reading the batch twice. */

/* After this many growths a part takes the min / max of the rest of its values first and
 * grows once to cover them (bounds the cost on data whose range grows with every chunk, as
 * sorted data does; each growth costs a pass over the window). */
#define PART_MAX_GROWS 16

typedef struct lattice_part {
    int32_t e;
    int64_t jlo;
    bool open;                  /* has a window (L had data, or the part grew) */
    uint64_t *counts, *spare;   /* [cells] */
    qcal_hist_sub *sub;         /* [QCAL_HIST_SUB_COPIES * (cells + 1)] */
    float mn, mx;               /* of the part's finite values */
    uint64_t nonfinite;
} lattice_part;

static qcal_lattice_grid window_grid(int32_t e, int64_t jlo, int32_t cells, bool absval)
{
    qcal_lattice_grid g;
    g.scale = scale_of(e);
    g.jlo = (int32_t)jlo;
    int64_t acc = QCAL_LATTICE_JLIM - jlo;
    g.accept = (int32_t)(acc < cells ? acc : cells);
    g.absval = absval;
    return g;
}

/* dst (cells counts for cell dlo..dlo+cells at exponent de) += src likewise at (se, slo),
 * se <= de, every non-zero source cell inside dst's window. */
static void add_cells(uint64_t *dst, int32_t de, int64_t dlo, const uint64_t *src, int32_t se,
                      int64_t slo, int32_t cells)
{
    int k = de - se;
    if (k == 0 && slo == dlo) {
        for (int32_t i = 0; i < cells; i++)
            dst[i] += src[i];
        return;
    }
    for (int32_t i = 0; i < cells; i++)
        if (src[i])
            dst[floor_shift(slo + i, k) - dlo] += src[i];
}

static void part_run(const qcal_lattice *L, const float *x, int64_t n, lattice_part *P,
                     const qcal_histogram_dsp *dsp, const qcal_minmax_dsp *mm)
{
    const int32_t cells = L->cells;
    int grows = 0;
    int64_t pos = 0;
    while (pos < n) {
        /* A part without a window has none inside: it stops at its first finite value. */
        qcal_lattice_grid g = window_grid(P->e, P->jlo, cells, L->absval);
        if (!P->open)
            g.accept = 0;
        float l, h;
        uint64_t b;
        int64_t r = dsp->lattice_bin_until(x + pos, n - pos, &g, P->counts, P->sub, &l, &h, &b);
        P->mn = fminf(P->mn, l);
        P->mx = fmaxf(P->mx, h);
        P->nonfinite += b;
        pos += r;
        if (pos >= n)
            break;
        /* Grow to cover the chunk it stopped at (or, after PART_MAX_GROWS, all the rest). */
        int64_t m = n - pos;
        if (grows < PART_MAX_GROWS && m > QCAL_HIST_CH)
            m = QCAL_HIST_CH;
        mm->minmax(x + pos, m, &l, &h, &b);
        float dmin = fminf(fminf(L->dmin, P->mn), l) + 0.0f;
        float dmax = fmaxf(fmaxf(L->dmax, P->mx), h) + 0.0f;
        float vmin = vmin_of(L->absval, dmin, dmax), vmax = vmax_of(L->absval, dmin, dmax);
        int32_t e = qcal_lattice_exponent(vmin, vmax, cells);
        int64_t jmin = cell_exact(vmin, e), jmax = cell_exact(vmax, e);
        int64_t jlo = window_start(L->absval, jmin, jmax, cells);
        memset(P->spare, 0, (size_t)cells * sizeof *P->spare);
        if (P->open)
            add_cells(P->spare, e, jlo, P->counts, P->e, P->jlo, cells);
        uint64_t *t = P->counts;
        P->counts = P->spare;
        P->spare = t;
        P->e = e;
        P->jlo = jlo;
        P->open = true;
        grows++;
    }
}

static qcal_status update_single_pass(qcal_lattice *L, const float *x, int64_t n,
                                      qcal_nonfinite_policy policy, uint64_t *nonfinite)
{
    enum { MAXT = 64 };
    const int32_t cells = L->cells;
    int threads = qcal_threads_for(n);
    if (threads > MAXT)
        threads = MAXT;
    /* Per part: counts and spare (cells words each), then the sub-histograms. */
    size_t sub_words = ((size_t)QCAL_HIST_SUB_COPIES * ((size_t)cells + 1) *
                        sizeof(qcal_hist_sub) + 7) / 8;
    size_t per = 2 * (size_t)cells + sub_words;
    uint64_t *scratch = qcal_malloc(per * (size_t)threads * sizeof(uint64_t));
    if (!scratch)
        return QCAL_ERR_NO_MEMORY;
    lattice_part parts[MAXT];
    const qcal_histogram_dsp *dsp = qcal_histogram_dsp_get();
    const qcal_minmax_dsp *mm = qcal_minmax_dsp_get();
#if QCAL_HAVE_OPENMP
#pragma omp parallel for num_threads(threads) schedule(static, 1) if (threads > 1)
#endif
    for (int t = 0; t < threads; t++) {
        int64_t s = (int64_t)((__int128)n * t / threads);
        int64_t e = (int64_t)((__int128)n * (t + 1) / threads);
        lattice_part *P = &parts[t];
        uint64_t *w = scratch + (size_t)t * per;
        P->e = L->e;
        P->jlo = L->jlo;
        P->open = L->total > 0;
        P->counts = w;
        P->spare = w + cells;
        P->sub = (qcal_hist_sub *)(w + 2 * (size_t)cells);
        P->mn = INFINITY;
        P->mx = -INFINITY;
        P->nonfinite = 0;
        memset(P->counts, 0, (size_t)cells * sizeof *P->counts);
        memset(P->sub, 0, sub_words * sizeof(uint64_t));
        part_run(L, x + s, e - s, P, dsp, mm);
    }
    float mn = INFINITY, mx = -INFINITY;
    uint64_t nf = 0;
    for (int t = 0; t < threads; t++) {
        mn = fminf(mn, parts[t].mn);
        mx = fmaxf(mx, parts[t].mx);
        nf += parts[t].nonfinite;
    }
    *nonfinite = nf;
    qcal_status st = QCAL_OK;
    if (nf > 0 && policy == QCAL_NONFINITE_ERROR) {
        st = qcal_error(QCAL_ERR_NONFINITE,
                        "batch of %lld values holds %llu NaN/Inf (non-finite policy: error)",
                        (long long)n, (unsigned long long)nf);
        goto done;
    }
    uint64_t finite = (uint64_t)n - nf;
    if (finite == 0)
        goto done;
    /* The final window: the one the two-pass update picks (L's, unless the batch needs a
     * new exponent or cells outside it). */
    float dmin = fminf(L->dmin, mn) + 0.0f, dmax = fmaxf(L->dmax, mx) + 0.0f;
    float vmin = vmin_of(L->absval, dmin, dmax), vmax = vmax_of(L->absval, dmin, dmax);
    int32_t e = qcal_lattice_exponent(vmin, vmax, cells);
    int64_t jmin = cell_exact(vmin, e), jmax = cell_exact(vmax, e);
    uint64_t *nc = NULL;
    int64_t jlo = L->jlo;
    if (L->total == 0 || e != L->e || jmin < L->jlo || jmax >= L->jlo + cells) {
        st = regrid(L, NULL, e, jmin, jmax, &nc, &jlo);
        if (st != QCAL_OK)
            goto done;
    }
    uint64_t *dst = nc ? nc : L->counts;
    for (int t = 0; t < threads; t++)
        if (parts[t].open)
            add_cells(dst, e, jlo, parts[t].counts, parts[t].e, parts[t].jlo, cells);
    if (nc) {
        free(L->counts);
        L->counts = nc;
    }
    L->e = e;
    L->jlo = jlo;
    L->dmin = dmin;
    L->dmax = dmax;
    L->total += finite;
done:
    free(scratch);
    return st;
}

/* Batches from this size on take the single pass. Below it, re-reading the batch (from
 * cache, at that size) costs less than the single pass's fixed work per batch (a window per
 * part, the carry-over at each growth, the final adds); 128K is where the single pass
 * overtook the two passes (docs/performance.md, "Figures behind the kernels' code"). */
#define SINGLE_PASS_MIN ((int64_t)1 << 17)

qcal_status qcal_lattice_update(qcal_lattice *L, const float *x, int64_t n,
                                qcal_nonfinite_policy policy, uint64_t *nonfinite)
{
    /* Large grids take the two-pass path, which bins them straight into the counts
     * (QCAL_HIST_DIRECT_SLOTS): a window per part would cost 2 * cells words each. */
    if (n >= SINGLE_PASS_MIN && L->cells < QCAL_HIST_DIRECT_SLOTS)
        return update_single_pass(L, x, n, policy, nonfinite);
    /* Smaller batches: a fused pass on the current window; if the batch does not fit, its
     * min / max, the grown window, and binning the batch there. */
    float mn, mx;
    uint64_t nf = 0;
    qcal_status st;
    if (L->total > 0) {
        bool binned = false;
        qcal_lattice_grid g = grid_of(L);
        st = qcal_hist_bin_threaded(x, n, NULL, &g, true, policy == QCAL_NONFINITE_ERROR,
                                    L->counts, NULL, &mn, &mx, &nf, &binned);
        if (st != QCAL_OK)
            return st;
        if (binned) {
            *nonfinite = nf;
            if (nf < (uint64_t)n) {
                L->dmin = fminf(L->dmin, mn) + 0.0f;
                L->dmax = fmaxf(L->dmax, mx) + 0.0f;
                L->total += (uint64_t)n - nf;
            }
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
    float dmin = fminf(L->dmin, mn) + 0.0f, dmax = fmaxf(L->dmax, mx) + 0.0f;
    float vmin = vmin_of(L->absval, dmin, dmax), vmax = vmax_of(L->absval, dmin, dmax);
    int32_t e = qcal_lattice_exponent(vmin, vmax, L->cells);
    int64_t jmin = cell_exact(vmin, e), jmax = cell_exact(vmax, e);
    uint64_t *nc = NULL;
    int64_t jlo = L->jlo;
    if (L->total == 0 || e != L->e || jmin < L->jlo || jmax >= L->jlo + L->cells) {
        st = regrid(L, NULL, e, jmin, jmax, &nc, &jlo);
        if (st != QCAL_OK)
            return st;
    }
    qcal_lattice_grid g = grid_of(L);
    g.scale = scale_of(e);
    g.jlo = (int32_t)jlo;
    int64_t acc = QCAL_LATTICE_JLIM - jlo;
    g.accept = (int32_t)(acc < L->cells ? acc : L->cells);
    st = qcal_hist_bin_threaded(x, n, NULL, &g, false, false, nc ? nc : L->counts, NULL, NULL,
                                NULL, NULL, NULL);
    if (st != QCAL_OK) {
        free(nc);
        return st;
    }
    if (nc) {
        free(L->counts);
        L->counts = nc;
    }
    L->e = e;
    L->jlo = jlo;
    L->dmin = dmin;
    L->dmax = dmax;
    L->total += finite;
    return QCAL_OK;
}

qcal_status qcal_lattice_merge(qcal_lattice *dst, const qcal_lattice *src)
{
    if (src->total == 0)
        return QCAL_OK;
    float dmin = fminf(dst->dmin, src->dmin) + 0.0f, dmax = fmaxf(dst->dmax, src->dmax) + 0.0f;
    float vmin = vmin_of(dst->absval, dmin, dmax), vmax = vmax_of(dst->absval, dmin, dmax);
    int32_t e = qcal_lattice_exponent(vmin, vmax, dst->cells);
    int64_t jmin = cell_exact(vmin, e), jmax = cell_exact(vmax, e);
    if (dst->total > 0 && e == dst->e && jmin >= dst->jlo && jmax < dst->jlo + dst->cells) {
        /* dst's window already holds the merged range at its width: src's cells are added
         * in place (the same counts a regrid gives; only the window's start, which is not
         * part of the state, may differ). */
        add_cells(dst->counts, e, dst->jlo, src->counts, src->e, src->jlo, src->cells);
    } else {
        uint64_t *nc = NULL;
        int64_t jlo;
        qcal_status st = regrid(dst, src, e, jmin, jmax, &nc, &jlo);
        if (st != QCAL_OK)
            return st;
        free(dst->counts);
        dst->counts = nc;
        dst->e = e;
        dst->jlo = jlo;
    }
    dst->dmin = dmin;
    dst->dmax = dmax;
    dst->total += src->total;
    return QCAL_OK;
}

/* ---- canonical payload -------------------------------------------------------------------- */

void qcal_lattice_save(const qcal_lattice *L, qcal_buf *b)
{
    if (L->total == 0) {
        qcal_buf_u32(b, 0u);
        qcal_buf_u64(b, 0u);
        qcal_buf_u32(b, 0u);
        qcal_buf_f32(b, INFINITY);
        qcal_buf_f32(b, -INFINITY);
        qcal_buf_u64(b, 0u);
        return;
    }
    int64_t jmin = qcal_lattice_jmin(L), jmax = qcal_lattice_jmax(L);
    qcal_buf_u32(b, (uint32_t)L->e);
    qcal_buf_u64(b, (uint64_t)jmin);
    qcal_buf_u32(b, (uint32_t)(jmax - jmin + 1));
    qcal_buf_f32(b, L->dmin);
    qcal_buf_f32(b, L->dmax);
    qcal_buf_u64(b, L->total);
    /* The counts of cells jmin..jmax lie contiguous in the window: one append writes the
     * bytes the per-count qcal_buf_u64 calls wrote (host order, as every field). */
    qcal_buf_append(b, L->counts + (jmin - L->jlo),
                    (size_t)(jmax - jmin + 1) * sizeof(uint64_t));
}

qcal_status qcal_lattice_load(qcal_lattice *L, qcal_cursor *c)
{
    uint32_t eu, nu;
    uint64_t jmin_u, total;
    float dmin, dmax;
    if (!qcal_cur_u32(c, &eu) || !qcal_cur_u64(c, &jmin_u) || !qcal_cur_u32(c, &nu) ||
        !qcal_cur_f32(c, &dmin) || !qcal_cur_f32(c, &dmax) || !qcal_cur_u64(c, &total))
        return qcal_error(QCAL_ERR_FORMAT, "lattice histogram state is truncated");
    int32_t e = (int32_t)eu;
    int64_t jmin = (int64_t)jmin_u;
    if (total == 0) {
        if (e != 0 || jmin != 0 || nu != 0 || dmin != INFINITY || dmax != -INFINITY)
            return qcal_error(QCAL_ERR_FORMAT, "empty lattice histogram state is not canonical");
        qcal_lattice_clear(L);
        return QCAL_OK;
    }
    if (!(isfinite(dmin) && isfinite(dmax) && dmin <= dmax) || (signbit(dmin) && dmin == 0.0f) ||
        (signbit(dmax) && dmax == 0.0f))
        return qcal_error(QCAL_ERR_FORMAT, "lattice histogram state has data range [%g, %g]",
                          (double)dmin, (double)dmax);
    float vmin = vmin_of(L->absval, dmin, dmax), vmax = vmax_of(L->absval, dmin, dmax);
    int32_t want_e = qcal_lattice_exponent(vmin, vmax, L->cells);
    int64_t wmin = cell_exact(vmin, want_e), wmax = cell_exact(vmax, want_e);
    if (e != want_e || jmin != wmin || (int64_t)nu != wmax - wmin + 1)
        return qcal_error(QCAL_ERR_FORMAT,
                          "lattice histogram state has cell width 2^%d, cells %lld + %u; its "
                          "data range [%g, %g] gives 2^%d, cells %lld + %lld",
                          (int)e, (long long)jmin, (unsigned)nu, (double)dmin, (double)dmax,
                          (int)want_e, (long long)wmin, (long long)(wmax - wmin + 1));
    if (c->left / 8 < nu)
        return qcal_error(QCAL_ERR_FORMAT, "lattice histogram state is truncated in its %u counts",
                          (unsigned)nu);
    uint64_t *nc = qcal_calloc((size_t)L->cells, sizeof *nc);
    if (!nc)
        return QCAL_ERR_NO_MEMORY;
    int64_t jlo = window_start(L->absval, wmin, wmax, L->cells);
    uint64_t *cnt = nc + (wmin - jlo);   /* cells wmin..wmax, read in one copy */
    (void)qcal_cur_read(c, cnt, (size_t)nu * sizeof(uint64_t));   /* length checked above */
    uint64_t sum = 0;
    bool overflow = false;
    for (uint32_t i = 0; i < nu; i++)
        overflow |= __builtin_add_overflow(sum, cnt[i], &sum);
    qcal_status st = QCAL_OK;
    if (overflow || sum != total)
        st = qcal_error(QCAL_ERR_FORMAT, "lattice histogram counts sum to %llu, state says %llu",
                        (unsigned long long)sum, (unsigned long long)total);
    else if (nc[wmax - jlo] == 0 || (!L->absval && nc[wmin - jlo] == 0))
        st = qcal_error(QCAL_ERR_FORMAT,
                        "lattice histogram state has no count in the cell of its min or max");
    if (st != QCAL_OK) {
        free(nc);
        return st;
    }
    free(L->counts);
    L->counts = nc;
    L->e = e;
    L->jlo = jlo;
    L->dmin = dmin;
    L->dmax = dmax;
    L->total = total;
    return QCAL_OK;
}

/* ---- view ---------------------------------------------------------------------------------- */

void qcal_lattice_view(const qcal_lattice *L, double lo, double hi, int32_t bins,
                       uint64_t *out)
{
    memset(out, 0, (size_t)bins * sizeof *out);
    if (L->total == 0)
        return;
    const double vmin = qcal_lattice_vmin(L), vmax = qcal_lattice_vmax(L);
    const double W = ldexp(1.0, L->e), w = (hi - lo) / bins;
    const int64_t jmin = qcal_lattice_jmin(L), jmax = qcal_lattice_jmax(L);
    int64_t j = jmin;
    uint64_t below = 0, prev = 0;
    for (int32_t k = 1; k <= bins; k++) {
        uint64_t cum;
        double edge = lo + w * k;
        if (k == bins) {
            cum = L->total;
        } else {
            /* Skip the cells whose clipped part lies at or below the edge. */
            while (j <= jmax && fmin((double)(j + 1) * W, vmax) <= edge) {
                below += qcal_lattice_count(L, j);
                j++;
            }
            if (j > jmax) {
                cum = L->total;
            } else {
                double clo = fmax((double)j * W, vmin), chi = fmin((double)(j + 1) * W, vmax);
                uint64_t cnt = qcal_lattice_count(L, j);
                double f = (double)below;
                if (edge > clo && chi > clo)
                    f += (double)cnt * ((edge - clo) / (chi - clo));
                cum = (uint64_t)floor(f + 0.5);
                if (cum < below)
                    cum = below;
                if (cum > below + cnt)
                    cum = below + cnt;
            }
        }
        if (cum < prev)
            cum = prev;
        out[k - 1] = cum - prev;
        prev = cum;
    }
}
