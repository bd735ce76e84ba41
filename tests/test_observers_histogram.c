/* unit.observers_histogram: the "histogram" observer (PyTorch HistogramObserver L2 search)
 * and the growable histogram shared by the histogram family.
 * Reference data: tests/ref/gen_histogram.py -> tests/data/histogram/{l2,histc}.bin. */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/cpu.h"
#include "observers/histogram_kinds.h"
#include "observers/minmax_kernels.h"
#include "qcal/qcal.h"
#include "qcal/qparams.h"
#include "qcal_config.h"
#include "testutil.h"
#if QCAL_HAVE_OPENMP
#include <omp.h>
#endif

static uint32_t fbits(float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    return u;
}

/* ---- helpers ---- */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rng_next(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}
static float rng_normal(void)
{
    double u1 = ((rng_next() >> 11) + 0.5) / 9007199254740992.0;
    double u2 = ((rng_next() >> 11) + 0.5) / 9007199254740992.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static qcal_observer *make_obs(qcal_observer_kind kind)
{
    qcal_observer_config cfg;
    qcal_observer_config_default(&cfg, kind);
    cfg.grid = QCAL_GRID_FIRST_BATCH;   /* these tests check the first-batch grid */
    qcal_observer *obs = NULL;
    assert_int_equal(qcal_observer_create(&cfg, &obs), QCAL_OK);
    return obs;
}

static void feed(qcal_observer *obs, float *x, int64_t n)
{
    qcal_tensor t;
    assert_int_equal(qcal_tensor_init(&t, x, 1, &n), QCAL_OK);
    qcal_status st = qcal_observer_update(obs, &t);
    if (st != QCAL_OK)
        fail_msg("update failed: %s", qcal_last_error());
}

static void assert_counts_equal(const uint64_t *got, const uint64_t *want, int32_t bins,
                                const char *what)
{
    int32_t worst = -1;
    int64_t wd = 0;
    for (int32_t i = 0; i < bins; i++) {
        int64_t d = (int64_t)got[i] - (int64_t)want[i];
        if (llabs(d) > wd) {
            wd = llabs(d);
            worst = i;
        }
    }
    if (worst >= 0)
        fail_msg("%s: bin %d has %llu, expected %llu (worst of %d bins)", what, (int)worst,
                 (unsigned long long)got[worst], (unsigned long long)want[worst], (int)bins);
}

/* ---- L2 search vs PyTorch ---- */
static void test_l2_search_vs_pytorch(void **state)
{
    (void)state;
    tu_ref_file *r = tu_ref_load("histogram", "l2.bin");
    int n = (int)((int64_t *)tu_ref_get(r, "ncases")->data)[0];
    assert_true(n >= 10);
    for (int k = 0; k < n; k++) {
        const tu_ref_arr *h = tu_ref_get(r, "case%d/hist", k);
        const double *meta = tu_ref_get(r, "case%d/meta", k)->data;
        const float *out = tu_ref_get(r, "case%d/out", k)->data;
        const int64_t *zp = tu_ref_get(r, "case%d/zp", k)->data;
        int32_t bins = (int32_t)meta[0];
        assert_int_equal(h->count, (uint64_t)bins);
        float mn = (float)meta[2], mx = (float)meta[3], a = 0, b = 0;
        assert_int_equal(qcal_hist_l2_search(h->data, bins, mn, mx, meta[1], &a, &b), QCAL_OK);
        if (fbits(a) != fbits(out[0]) || fbits(b) != fbits(out[1]))
            fail_msg("case %d (%d bins over [%.9g, %.9g]): qcal chose [%.9g, %.9g], PyTorch "
                     "[%.9g, %.9g]", k, (int)bins, (double)mn, (double)mx, (double)a,
                     (double)b, (double)out[0], (double)out[1]);
        if (meta[1] != 256.0)
            continue;
        /* The scale / zero-point PyTorch derives from that range (quint8 affine, qint8
         * symmetric). */
        qcal_qconfig q;
        qcal_qconfig_default(&q);
        float s;
        int32_t z;
        assert_int_equal(qcal_qparams_compute_arrays(&q, 1, &a, &b, &s, &z, NULL), QCAL_OK);
        if (fbits(s) != fbits(out[2]) || z != zp[0])
            fail_msg("case %d quint8 affine: scale %.9g zp %d, PyTorch %.9g %d", k, (double)s,
                     (int)z, (double)out[2], (int)zp[0]);
        q.dtype = QCAL_QINT8;
        q.qscheme = QCAL_PER_TENSOR_SYMMETRIC;
        assert_int_equal(qcal_qparams_compute_arrays(&q, 1, &a, &b, &s, &z, NULL), QCAL_OK);
        if (fbits(s) != fbits(out[3]) || z != zp[1])
            fail_msg("case %d qint8 symmetric: scale %.9g zp %d, PyTorch %.9g %d", k,
                     (double)s, (int)z, (double)out[3], (int)zp[1]);
    }
    tu_ref_free(r);
}

static void test_torch_sum_small(void **state)
{
    (void)state;
    /* Exact small-integer sums are order independent: check the emulation's coverage of
     * every element for many lengths (vector body, ILP rows, cascade levels, tails). */
    float x[5000];
    for (int i = 0; i < 5000; i++)
        x[i] = (float)(i % 7);
    for (int n = 0; n <= 5000; n += (n < 100 ? 1 : 97)) {
        double want = 0;
        for (int i = 0; i < n; i++)
            want += x[i];
        assert_true((double)qcal_torch_sum_f32(x, n) == want);
    }
}

/* ---- histc ---- */
/* Runs one single-thread kernel of the histogram family (histogram_dsp.h) into counts[0..bins)
 * with the top edge folded into the last bin and counted into counts[bins], as qcal_f32_histc;
 * checks the canary past the counts and that the sub-histogram scratch comes back zeroed. */
static void run_kernel(qcal_f32_histc_fn fn, const float *x, int64_t n, float lo, float hi,
                       int32_t bins, bool absval, uint64_t *counts)
{
    qcal_hist_sub *sub = calloc((size_t)QCAL_HIST_SUB_COPIES * (bins + 2), sizeof *sub);
    memset(counts, 0, (size_t)(bins + 1) * 8);
    counts[bins + 1] = 0xC0FFEEull; /* canary */
    qcal_histc_grid g = { .lo = lo, .hi = hi, .bins = bins, .absval = absval };
    fn(x, n, &g, counts, sub);
    assert_true(counts[bins + 1] == 0xC0FFEEull);
    counts[bins - 1] += counts[bins];
    for (int32_t i = 0; i < QCAL_HIST_SUB_COPIES * (bins + 2); i++)
        assert_int_equal(sub[i], 0);
    free(sub);
}

static void test_histc_vs_torch(void **state)
{
    (void)state;
    tu_ref_file *r = tu_ref_load("histogram", "histc.bin");
    int n = (int)((int64_t *)tu_ref_get(r, "ncases")->data)[0];
    static const char *const names[3] = { "c", "avx2", "avx512" };
    qcal_isa isa = qcal_cpu_isa();
    for (int k = 0; k < n; k++) {
        const tu_ref_arr *x = tu_ref_get(r, "case%d/x", k);
        const double *meta = tu_ref_get(r, "case%d/meta", k)->data;
        const uint64_t *want = tu_ref_get(r, "case%d/counts", k)->data;
        int32_t bins = (int32_t)meta[0];
        uint64_t *got = calloc((size_t)bins + 2, 8);
        /* Every ISA's kernel (the table of each ISA up to this CPU's) against PyTorch. */
        for (int f = 0; f <= (int)isa && f < 3; f++) {
            qcal_histogram_dsp dsp;
            qcal_histogram_dsp_init(&dsp, (qcal_isa)f);
            run_kernel(dsp.histc, x->data, (int64_t)x->count, (float)meta[1], (float)meta[2],
                       bins, meta[3] != 0, got);
            char what[64];
            snprintf(what, sizeof what, "histc case %d (%s)", k, names[f]);
            assert_counts_equal(got, want, bins, what);
        }
        /* The dispatching entry point, accumulating. */
        memset(got, 0, (size_t)bins * 8);
        uint64_t top = 0;
        assert_int_equal(qcal_f32_histc(x->data, (int64_t)x->count, (float)meta[1],
                                        (float)meta[2], bins, meta[3] != 0, got, &top), QCAL_OK);
        assert_counts_equal(got, want, bins, "qcal_f32_histc");
        free(got);
    }
    /* One batch through the observer: its histogram is torch.histc(x, bins, min(x), max(x)). */
    const tu_ref_arr *x = tu_ref_get(r, "case0/x");
    const uint64_t *want = tu_ref_get(r, "case0/counts")->data;
    qcal_observer *obs = make_obs(QCAL_OBSERVER_HISTOGRAM);
    feed(obs, x->data, (int64_t)x->count);
    const qcal_hist *h = qcal_histobs_hist(obs);
    assert_true((double)h->lo == ((double *)tu_ref_get(r, "case0/meta")->data)[1]);
    assert_true((double)h->hi == ((double *)tu_ref_get(r, "case0/meta")->data)[2]);
    assert_counts_equal(h->counts, want, h->bins, "observer single batch");
    qcal_observer_destroy(&obs);
    assert_null(obs);
    tu_ref_free(r);
}

/* ---- fused min/max + binning (qcal_f32_histc_inside) ---- */
/* The fused C reference against its two halves: min/max and non-finite count always (as
 * qcal_f32_minmax__c); when it reports "binned", the counts of qcal_f32_histc__c. (Every
 * SIMD version is checked bit for bit against this reference by unit.checkasm.) */
static void check_inside_kernel(const float *x, int64_t n, float lo, float hi, int32_t bins,
                                bool absval, bool want_in)
{
    uint64_t *got = calloc((size_t)bins + 2, 8), *want = calloc((size_t)bins + 2, 8);
    qcal_hist_sub *sub = calloc((size_t)QCAL_HIST_SUB_COPIES * (bins + 2), sizeof *sub);
    float mn = 0, mx = 0, rmn, rmx;
    uint64_t nf = 99, rnf;
    got[bins + 1] = 0xC0FFEEull;
    qcal_histc_grid g = { .lo = lo, .hi = hi, .bins = bins, .absval = absval };
    bool in = qcal_f32_histc_inside__c(x, n, &g, got, sub, &mn, &mx, &nf);
    qcal_f32_minmax__c(x, n, &rmn, &rmx, &rnf);
    char what[128];
    snprintf(what, sizeof what, "inside c n=%lld bins=%d abs=%d", (long long)n, (int)bins,
             (int)absval);
    if (in != want_in)
        fail_msg("%s: binned %d, expected %d", what, (int)in, (int)want_in);
    if (!(mn == rmn && mx == rmx && nf == rnf))
        fail_msg("%s: min/max/nonfinite %g %g %llu, reference %g %g %llu", what, (double)mn,
                 (double)mx, (unsigned long long)nf, (double)rmn, (double)rmx,
                 (unsigned long long)rnf);
    assert_true(got[bins + 1] == 0xC0FFEEull);
    for (int32_t i = 0; i < QCAL_HIST_SUB_COPIES * (bins + 2); i++)
        assert_int_equal(sub[i], 0);
    if (in) {
        qcal_f32_histc__c(x, n, &g, want, sub);
        assert_counts_equal(got, want, bins + 1, what);
    }
    free(got);
    free(want);
    free(sub);
}

static void test_histc_inside_kernels(void **state)
{
    (void)state;
    /* Below, at and above the 64-element chunk, and across the 4096-element check blocks. */
    const int sizes[] = { 0, 1, 15, 16, 63, 64, 65, 127, 128, 129, 4095, 4096, 4097, 12357 };
    const int32_t binss[] = { 1, 7, 2048 };
    float *x = malloc(12357 * sizeof *x);
    for (unsigned si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        int n = sizes[si];
        for (unsigned bi = 0; bi < 3; bi++) {
            for (int absval = 0; absval < 2; absval++) {
                float lo = absval ? 0.0f : -3.0f, hi = 3.0f;
                for (int i = 0; i < n; i++)
                    x[i] = fmaxf(fminf(rng_normal(), 2.99f), -2.99f);
                if (n > 4) {
                    x[0] = hi;          /* top edge */
                    x[n / 2] = NAN;     /* skipped and counted, still binned */
                    x[n - 1] = -INFINITY;
                    x[1] = absval ? -hi : lo;
                }
                check_inside_kernel(x, n, lo, hi, binss[bi], absval != 0, true);
                if (n == 0)
                    continue;
                /* One finite value outside, at the start, in the middle, in the tail. */
                int pos[3] = { 0, n / 3, n - 1 };
                for (int p = 0; p < 3; p++) {
                    float keep = x[pos[p]];
                    x[pos[p]] = p == 1 ? -3.5f : 3.0001f;
                    check_inside_kernel(x, n, lo, hi, binss[bi], absval != 0, false);
                    x[pos[p]] = keep;
                }
            }
        }
    }
    free(x);
}

static void test_histc_inside_dispatch(void **state)
{
    (void)state;
    /* Large enough for two threads (OpenMP builds), plus an odd tail. */
    const int64_t n = (1 << 20) + 37;
    float *x = malloc((size_t)n * sizeof *x);
    for (int64_t i = 0; i < n; i++)
        x[i] = rng_normal();
    x[12345] = NAN;
    x[n - 3] = INFINITY;
    float rmn, rmx;
    uint64_t rnf;
    qcal_f32_minmax__c(x, n, &rmn, &rmx, &rnf);
    uint64_t *want = calloc(2049, 8), *got = calloc(2049, 8);
    uint64_t wtop = 0;
    assert_int_equal(qcal_f32_histc(x, n, rmn, rmx, 2048, false, want, &wtop), QCAL_OK);
    for (int threads = 1; threads <= 2; threads++) {
#if QCAL_HAVE_OPENMP
        omp_set_num_threads(threads);
#endif
        /* Inside: accumulates like qcal_f32_histc. */
        for (int b = 0; b < 2048; b++)
            got[b] = 5;
        uint64_t top = 1, nf = 0;
        float mn, mx;
        bool binned = false;
        assert_int_equal(qcal_f32_histc_inside(x, n, rmn, rmx, 2048, false, false, got, &top,
                                               &mn, &mx, &nf, &binned), QCAL_OK);
        assert_true(binned && mn == rmn && mx == rmx && nf == rnf && nf == 2);
        assert_true(top == wtop + 1);
        for (int b = 0; b < 2048; b++)
            if (got[b] != want[b] + 5)
                fail_msg("%d threads, bin %d: %llu, want %llu + 5", threads, b,
                         (unsigned long long)got[b], (unsigned long long)want[b]);
        /* Non-finite values under a rejecting policy, or a grid that misses the top value:
         * counts and top untouched, min/max/count still complete. */
        for (int pass = 0; pass < 2; pass++) {
            for (int b = 0; b < 2048; b++)
                got[b] = 7;
            top = 3;
            float hi = pass ? nextafterf(rmx, -INFINITY) : rmx;
            assert_int_equal(qcal_f32_histc_inside(x, n, rmn, hi, 2048, false, pass == 0, got,
                                                   &top, &mn, &mx, &nf, &binned), QCAL_OK);
            assert_false(binned);
            assert_true(mn == rmn && mx == rmx && nf == 2 && top == 3);
            for (int b = 0; b < 2048; b++)
                assert_true(got[b] == 7);
        }
    }
#if QCAL_HAVE_OPENMP
    omp_set_num_threads(2);
#endif
    free(want);
    free(got);
    free(x);
}

/* ---- multi-batch growth ---- */
static void direct_histc(const float *x, int64_t n, const qcal_hist *h, uint64_t *out)
{
    memset(out, 0, (size_t)h->bins * 8);
    uint64_t top = 0;
    assert_int_equal(qcal_f32_histc(x, n, h->lo, h->hi, h->bins, h->absval, out, &top),
                     QCAL_OK);
}

static float *growing_batches(int nb, int64_t per, float shift)
{
    float *x = malloc((size_t)nb * per * sizeof *x);
    for (int b = 0; b < nb; b++)
        for (int64_t i = 0; i < per; i++)
            x[b * per + i] = rng_normal() * (float)(b + 1) * 0.7f + shift * (float)b;
    return x;
}

static void test_growth_invariants(void **state)
{
    (void)state;
    const int nb = 8;
    const int64_t per = 20000;
    float *x = growing_batches(nb, per, 0.3f);
    qcal_observer *obs = make_obs(QCAL_OBSERVER_HISTOGRAM);
    float dmn = INFINITY, dmx = -INFINITY;
    for (int b = 0; b < nb; b++) {
        feed(obs, x + b * per, per);
        for (int64_t i = 0; i < per; i++) {
            dmn = fminf(dmn, x[b * per + i]);
            dmx = fmaxf(dmx, x[b * per + i]);
        }
        const qcal_hist *h = qcal_histobs_hist(obs);
        uint64_t s = 0;
        for (int32_t i = 0; i < h->bins; i++)
            s += h->counts[i];
        assert_true(s == (uint64_t)(b + 1) * per);
        assert_true(h->total == s);
        if (!(h->lo <= dmn && h->hi >= dmx))
            fail_msg("batch %d: grid [%g, %g] does not cover data [%g, %g]", b, (double)h->lo,
                     (double)h->hi, (double)dmn, (double)dmx);
    }
    /* Old bins move by whole-bin index maps: against re-binning all data on the final grid,
     * only values within float rounding of an edge may land one bin off. */
    const qcal_hist *h = qcal_histobs_hist(obs);
    uint64_t *d = malloc((size_t)h->bins * 8);
    direct_histc(x, nb * per, h, d);
    uint64_t l1 = 0;
    for (int32_t i = 0; i < h->bins; i++)
        l1 += (uint64_t)llabs((int64_t)d[i] - (int64_t)h->counts[i]);
    if (l1 > (uint64_t)(nb * per) / 1000)
        fail_msg("signed growth: L1 distance %llu to a direct histogram of all data",
                 (unsigned long long)l1);
    free(d);
    float a[1], b[1];
    int64_t n;
    assert_int_equal(qcal_observer_qrange(obs, 1, a, b, &n), QCAL_OK);
    assert_true(a[0] >= h->lo && b[0] <= h->hi && a[0] < b[0]);
    qcal_observer_destroy(&obs);

    /* |x| grids only double: bit-exact against a direct histogram of everything. */
    obs = make_obs(QCAL_OBSERVER_ENTROPY);
    assert_true(qcal_histobs_hist(obs)->absval == false);   /* affine target: x */
    qcal_observer_destroy(&obs);
    {
        qcal_observer_config cfg;   /* symmetric target: |x| (TensorRT's search) */
        qcal_observer_config_default(&cfg, QCAL_OBSERVER_ENTROPY);
        cfg.grid = QCAL_GRID_FIRST_BATCH;
        cfg.q.dtype = QCAL_QINT8;
        cfg.q.qscheme = QCAL_PER_TENSOR_SYMMETRIC;
        assert_int_equal(qcal_observer_create(&cfg, &obs), QCAL_OK);
    }
    assert_true(qcal_histobs_hist(obs)->absval);
    for (int b = 0; b < nb; b++)
        feed(obs, x + b * per, per);
    h = qcal_histobs_hist(obs);
    d = malloc((size_t)h->bins * 8);
    direct_histc(x, nb * per, h, d);
    assert_counts_equal(h->counts, d, h->bins, "|x| growth vs direct");
    free(d);
    qcal_observer_destroy(&obs);
    free(x);
}

/* Spare bins of a grown signed grid go where the data grew: symmetric growth stays
 * centred (the grid of the 8 N(0, 1 + b/2) batches was [-21, 1232] for data in [-21, 21]
 * when every spare bin went above), one-sided growth keeps lo. */
static void test_growth_keeps_resolution(void **state)
{
    (void)state;
    const int nb = 8;
    const int64_t per = 50000;
    float *x = malloc((size_t)nb * per * sizeof *x);
    for (int b = 0; b < nb; b++)
        for (int64_t i = 0; i < per; i++)
            x[b * per + i] = rng_normal() * (1.0f + 0.5f * (float)b);
    qcal_observer *obs = make_obs(QCAL_OBSERVER_HISTOGRAM);
    for (int b = 0; b < nb; b++)
        feed(obs, x + b * per, per);
    const qcal_hist *h = qcal_histobs_hist(obs);
    double span = (double)h->dmax - h->dmin, width = (double)h->hi - h->lo;
    if (!(width <= 4.0 * span && h->lo <= h->dmin && h->hi >= h->dmax))
        fail_msg("symmetric growth: grid [%g, %g] for data [%g, %g]", (double)h->lo,
                 (double)h->hi, (double)h->dmin, (double)h->dmax);
    /* Data below and above the centre of the grid in similar amounts. */
    assert_true(fabs(((double)h->hi + h->lo) / 2) < 0.25 * width);
    qcal_observer_destroy(&obs);
    /* Data >= 1 growing upward: at most the one bin needed for a slightly smaller minimum
     * goes below the first batch's minimum; the rest of the growth is above. */
    for (int b = 0; b < nb; b++)
        for (int64_t i = 0; i < per; i++)
            x[b * per + i] = 1.0f + fabsf(rng_normal()) * (float)(1 << b);
    obs = make_obs(QCAL_OBSERVER_HISTOGRAM);
    feed(obs, x, per);
    float lo0 = qcal_histobs_hist(obs)->lo;
    for (int b = 1; b < nb; b++)
        feed(obs, x + b * per, per);
    h = qcal_histobs_hist(obs);
    double bw = ((double)h->hi - h->lo) / h->bins;
    if (!((double)h->lo >= (double)lo0 - 1.0001 * bw && h->lo <= h->dmin && h->hi >= h->dmax))
        fail_msg("upward growth: grid [%g, %g], first lo %g, data [%g, %g]", (double)h->lo,
                 (double)h->hi, (double)lo0, (double)h->dmin, (double)h->dmax);
    assert_true((double)h->hi - h->lo <= 4.0 * ((double)h->dmax - h->dmin));
    qcal_observer_destroy(&obs);
    free(x);
}

static void test_merge(void **state)
{
    (void)state;
    const int nb = 8;
    const int64_t per = 10000;
    float *x = growing_batches(nb, per, -0.2f);
    /* |x| batches whose max|x| are powers-of-two multiples of the first: merge is exact. */
    for (int b = 0; b < nb; b++)
        x[b * per] = ldexpf(1.5f, b / 2);
    for (int b = 0; b < nb; b++)
        for (int64_t i = 1; i < per; i++)
            x[b * per + i] = fmaxf(fminf(x[b * per + i], x[b * per]), -x[b * per]);
    qcal_observer *seq = make_obs(QCAL_OBSERVER_MSE), *p = make_obs(QCAL_OBSERVER_MSE),
                  *q = make_obs(QCAL_OBSERVER_MSE), *e = make_obs(QCAL_OBSERVER_MSE);
    for (int b = 0; b < nb; b++) {
        feed(seq, x + b * per, per);
        feed(b % 2 ? q : p, x + b * per, per);
    }
    assert_int_equal(qcal_observer_merge(e, p), QCAL_OK);   /* into empty: a copy */
    assert_counts_equal(qcal_histobs_hist(e)->counts, qcal_histobs_hist(p)->counts, 2048,
                        "merge into empty");
    assert_int_equal(qcal_observer_merge(p, q), QCAL_OK);
    const qcal_hist *hs = qcal_histobs_hist(seq), *hp = qcal_histobs_hist(p);
    assert_true(hs->hi == hp->hi && hs->lo == hp->lo);
    assert_counts_equal(hp->counts, hs->counts, hs->bins, "|x| merge vs sequential");
    float a1, b1, a2, b2;
    int64_t n;
    assert_int_equal(qcal_observer_qrange(seq, 1, &a1, &b1, &n), QCAL_OK);
    assert_int_equal(qcal_observer_qrange(p, 1, &a2, &b2, &n), QCAL_OK);
    assert_true(fbits(a1) == fbits(a2) && fbits(b1) == fbits(b2));
    uint64_t c1, c2;
    qcal_observer_batches(seq, &c1);
    qcal_observer_batches(p, &c2);
    assert_true(c1 == c2);
    qcal_observer_destroy(&seq);
    qcal_observer_destroy(&p);
    qcal_observer_destroy(&q);
    qcal_observer_destroy(&e);

    /* Signed grids with unrelated origins: linear spreading, total preserved, cumulative
     * counts within one source bin of the sequential histogram. */
    float *y = growing_batches(nb, per, 0.45f);
    seq = make_obs(QCAL_OBSERVER_HISTOGRAM);
    p = make_obs(QCAL_OBSERVER_HISTOGRAM);
    q = make_obs(QCAL_OBSERVER_HISTOGRAM);
    for (int b = 0; b < nb; b++) {
        feed(seq, y + b * per, per);
        feed(b < nb / 2 ? p : q, y + b * per, per);
    }
    assert_int_equal(qcal_observer_merge(p, q), QCAL_OK);
    hs = qcal_histobs_hist(seq);
    hp = qcal_histobs_hist(p);
    const qcal_hist *hq = qcal_histobs_hist(q);
    assert_true(hp->total == hs->total && hp->total == (uint64_t)nb * per);
    assert_true(hp->lo <= hq->lo && hp->hi >= hq->hi);
    uint64_t maxq = 0, s = 0;
    for (int32_t i = 0; i < hq->bins; i++)
        maxq = hq->counts[i] > maxq ? hq->counts[i] : maxq;
    for (int32_t i = 0; i < hp->bins; i++)
        s += hp->counts[i];
    assert_true(s == hp->total);
    if (hp->lo == hs->lo && hp->hi == hs->hi) {
        int64_t cs = 0, cp = 0;
        for (int32_t i = 0; i < hp->bins; i++) {
            cs += (int64_t)hs->counts[i];
            cp += (int64_t)hp->counts[i];
            if (llabs(cs - cp) > (int64_t)maxq + 1)
                fail_msg("bin %d: cumulative %lld merged vs %lld sequential", (int)i,
                         (long long)cp, (long long)cs);
        }
    }
    qcal_observer_destroy(&seq);
    qcal_observer_destroy(&p);
    qcal_observer_destroy(&q);
    /* Different configs do not merge. */
    qcal_observer *m = make_obs(QCAL_OBSERVER_MSE), *hh = make_obs(QCAL_OBSERVER_HISTOGRAM);
    assert_int_equal(qcal_observer_merge(m, hh), QCAL_ERR_MISMATCH);
    qcal_observer_destroy(&m);
    qcal_observer_destroy(&hh);
    free(x);
    free(y);
}

/* ---- policies and edge cases ---- */
static void test_nonfinite(void **state)
{
    (void)state;
    float x[100];
    for (int i = 0; i < 100; i++)
        x[i] = (float)i * 0.1f - 3.0f;
    x[5] = NAN;
    x[50] = INFINITY;
    x[99] = -INFINITY;
    qcal_observer *obs = make_obs(QCAL_OBSERVER_HISTOGRAM);
    feed(obs, x, 100);
    uint64_t nf;
    assert_int_equal(qcal_observer_nonfinite(obs, &nf), QCAL_OK);
    assert_true(nf == 3);
    const qcal_hist *h = qcal_histobs_hist(obs);
    assert_true(h->total == 97);
    assert_true(h->lo == -3.0f && h->hi == x[98]);
    qcal_observer_destroy(&obs);

    /* Strict: error, state (save blob) unchanged, count unchanged. */
    qcal_observer_config cfg;
    qcal_observer_config_default(&cfg, QCAL_OBSERVER_HISTOGRAM);
    cfg.grid = QCAL_GRID_FIRST_BATCH;
    cfg.nonfinite = QCAL_NONFINITE_ERROR;
    assert_int_equal(qcal_observer_create(&cfg, &obs), QCAL_OK);
    float ok[4] = { 1, 2, 3, 4 };
    feed(obs, ok, 4);
    void *b1, *b2;
    size_t l1, l2;
    assert_int_equal(qcal_observer_save(obs, &b1, &l1), QCAL_OK);
    qcal_tensor t;
    int64_t n = 100;
    qcal_tensor_init(&t, x, 1, &n);
    assert_int_equal(qcal_observer_update(obs, &t), QCAL_ERR_NONFINITE);
    assert_non_null(strstr(qcal_last_error(), "3 NaN/Inf"));
    assert_int_equal(qcal_observer_save(obs, &b2, &l2), QCAL_OK);
    assert_true(l1 == l2 && !memcmp(b1, b2, l1));
    qcal_free(b1);
    qcal_free(b2);
    qcal_observer_destroy(&obs);

    /* All non-finite: counted, no data. */
    obs = make_obs(QCAL_OBSERVER_HISTOGRAM);
    float bad[3] = { NAN, INFINITY, NAN };
    feed(obs, bad, 3);
    float a, b;
    assert_int_equal(qcal_observer_qrange(obs, 1, &a, &b, &n), QCAL_NO_DATA);
    float s;
    int32_t z;
    assert_int_equal(tu_observer_qparams(obs, 1, &s, &z, NULL, &n), QCAL_NO_DATA);
    assert_true(s == 1.0f && z == 0);
    qcal_observer_destroy(&obs);
}

static void test_empty_constant_zero(void **state)
{
    (void)state;
    qcal_observer *obs = make_obs(QCAL_OBSERVER_HISTOGRAM);
    qcal_tensor t;
    int64_t zero = 0, n;
    float dummy = 0;
    qcal_tensor_init(&t, &dummy, 1, &zero);
    assert_int_equal(qcal_observer_update(obs, &t), QCAL_ERR_EMPTY);
    uint64_t nb;
    qcal_observer_batches(obs, &nb);
    assert_true(nb == 0);
    /* Constant tensor: zero-width grid, qrange (c, c), finite positive scale. */
    float c[1000];
    for (int i = 0; i < 1000; i++)
        c[i] = 2.5f;
    feed(obs, c, 1000);
    float a, b, s;
    int32_t z;
    assert_int_equal(qcal_observer_qrange(obs, 1, &a, &b, &n), QCAL_OK);
    assert_true(a == 2.5f && b == 2.5f);
    assert_int_equal(tu_observer_qparams(obs, 1, &s, &z, NULL, &n), QCAL_OK);
    assert_true(s > 0 && isfinite(s));
    /* Then a wider batch: the point mass lands in its bin of the new grid. */
    float w[3] = { -1.0f, 2.5f, 4.0f };
    feed(obs, w, 3);
    const qcal_hist *h = qcal_histobs_hist(obs);
    assert_true(h->lo == -1.0f && h->hi == 4.0f && h->total == 1003);
    assert_true(h->counts[qcal_hist_bin_of(2.5f, -1.0f, 4.0f, 2048)] == 1001);
    qcal_observer_destroy(&obs);
    /* All zeros for every kind: range (0, 0), finite scale. */
    qcal_observer_kind kinds[4] = { QCAL_OBSERVER_HISTOGRAM, QCAL_OBSERVER_PERCENTILE,
                                    QCAL_OBSERVER_ENTROPY, QCAL_OBSERVER_MSE };
    for (int k = 0; k < 4; k++) {
        obs = make_obs(kinds[k]);
        memset(c, 0, sizeof c);
        feed(obs, c, 1000);
        assert_int_equal(qcal_observer_qrange(obs, 1, &a, &b, &n), QCAL_OK);
        assert_true(a == 0.0f && b == 0.0f);
        assert_int_equal(tu_observer_qparams(obs, 1, &s, &z, NULL, &n), QCAL_OK);
        assert_true(s > 0 && isfinite(s));
        qcal_observer_destroy(&obs);
    }
}

static void test_near_flt_max(void **state)
{
    (void)state;
    qcal_observer_kind kinds[4] = { QCAL_OBSERVER_HISTOGRAM, QCAL_OBSERVER_PERCENTILE,
                                    QCAL_OBSERVER_ENTROPY, QCAL_OBSERVER_MSE };
    for (int k = 0; k < 4; k++) {
        qcal_observer *obs = make_obs(kinds[k]);
        float x[64];
        for (int i = 0; i < 64; i++)
            x[i] = rng_normal();
        feed(obs, x, 64);
        x[0] = FLT_MAX;
        x[1] = -FLT_MAX;
        x[2] = 3e38f;
        feed(obs, x, 64);
        x[3] = -FLT_MAX;
        feed(obs, x, 64);
        const qcal_hist *h = qcal_histobs_hist(obs);
        assert_true(isfinite(h->lo) && isfinite(h->hi));
        assert_true(h->total == 192);
        float a, b, s;
        int32_t z;
        int64_t n;
        assert_int_equal(qcal_observer_qrange(obs, 1, &a, &b, &n), QCAL_OK);
        assert_true(isfinite(a) && isfinite(b) && a <= b);
        qcal_status st = tu_observer_qparams(obs, 1, &s, &z, NULL, &n);
        if (st != QCAL_OK || !(s > 0 && isfinite(s)))
            fail_msg("kind %d: qparams status %d scale %g (%s)", k, (int)st, (double)s,
                     qcal_last_error());
        qcal_observer_destroy(&obs);
    }
}

static void test_threads_identical(void **state)
{
    (void)state;
#if QCAL_HAVE_OPENMP
    const int64_t n = 1 << 20;
    float *x = malloc((size_t)n * 3 * sizeof *x);
    for (int64_t i = 0; i < 3 * n; i++)
        x[i] = rng_normal() * (1.0f + (float)(i / n));
    void *blob[2];
    size_t len[2];
    float qa[2], qb[2];
    for (int t = 0; t < 2; t++) {
        omp_set_num_threads(t + 1);
        qcal_observer *obs = make_obs(QCAL_OBSERVER_HISTOGRAM);
        /* Three growing batches, then the first again: inside the grid (fused pass). */
        for (int b = 0; b < 4; b++)
            feed(obs, x + (b % 3) * n, n);
        int64_t m;
        assert_int_equal(qcal_observer_qrange(obs, 1, &qa[t], &qb[t], &m), QCAL_OK);
        assert_int_equal(qcal_observer_save(obs, &blob[t], &len[t]), QCAL_OK);
        qcal_observer_destroy(&obs);
    }
    omp_set_num_threads(2);
    assert_true(len[0] == len[1] && !memcmp(blob[0], blob[1], len[0]));
    assert_true(fbits(qa[0]) == fbits(qa[1]) && fbits(qb[0]) == fbits(qb[1]));
    qcal_free(blob[0]);
    qcal_free(blob[1]);
    free(x);
#else
    skip();
#endif
}

static void test_save_load(void **state)
{
    (void)state;
    float x[5000];
    for (int i = 0; i < 5000; i++)
        x[i] = rng_normal();
    qcal_observer_kind kinds[4] = { QCAL_OBSERVER_HISTOGRAM, QCAL_OBSERVER_PERCENTILE,
                                    QCAL_OBSERVER_ENTROPY, QCAL_OBSERVER_MSE };
    for (int k = 0; k < 4; k++) {
        qcal_observer *obs = make_obs(kinds[k]), *back = NULL;
        feed(obs, x, 5000);
        void *buf, *buf2;
        size_t len, len2;
        assert_int_equal(qcal_observer_save(obs, &buf, &len), QCAL_OK);
        assert_int_equal(qcal_observer_load(buf, len, &back), QCAL_OK);
        assert_int_equal(qcal_observer_save(back, &buf2, &len2), QCAL_OK);
        assert_true(len == len2 && !memcmp(buf, buf2, len));
        float a1, b1, a2, b2;
        int64_t n;
        qcal_observer_qrange(obs, 1, &a1, &b1, &n);
        qcal_observer_qrange(back, 1, &a2, &b2, &n);
        assert_true(fbits(a1) == fbits(a2) && fbits(b1) == fbits(b2));
        qcal_observer_destroy(&back);
        /* Truncated and corrupted blobs are format errors. */
        assert_int_equal(qcal_observer_load(buf, len - 8, &back), QCAL_ERR_FORMAT);
        assert_null(back);
        uint8_t *bad = malloc(len);
        memcpy(bad, buf, len);
        bad[len - 8] ^= 1;   /* last count: sum no longer matches the total */
        assert_int_equal(qcal_observer_load(bad, len, &back), QCAL_ERR_FORMAT);
        assert_null(back);
        free(bad);
        qcal_free(buf);
        qcal_free(buf2);
        /* Empty observers round-trip too. */
        qcal_observer_reset(obs);
        assert_int_equal(qcal_observer_save(obs, &buf, &len), QCAL_OK);
        assert_int_equal(qcal_observer_load(buf, len, &back), QCAL_OK);
        assert_int_equal(qcal_observer_qrange(back, 1, &a2, &b2, &n), QCAL_NO_DATA);
        qcal_free(buf);
        qcal_observer_destroy(&back);
        qcal_observer_destroy(&obs);
    }
}

/* qcal_observer_update_part: a batch fed in parts (cut anywhere) leaves the saved state,
 * batch counter included, byte for byte as one update of the whole batch (the histogram
 * family on the lattice grid, and minmax); kinds whose result depends on the split are
 * refused and left unchanged. */
static qcal_observer *make_default(qcal_observer_kind kind)
{
    qcal_observer_config cfg;
    qcal_observer_config_default(&cfg, kind);   /* histogram family: the lattice grid */
    qcal_observer *obs = NULL;
    assert_int_equal(qcal_observer_create(&cfg, &obs), QCAL_OK);
    return obs;
}

static void test_update_parts(void **state)
{
    (void)state;
    enum { N = 20000 };
    float *x = malloc(3 * N * sizeof *x);
    assert_non_null(x);
    for (int i = 0; i < 3 * N; i++)
        x[i] = rng_normal() * (float)(1 + i / N) + (i >= 2 * N ? 40.0f : 0.0f);   /* growth */
    x[123] = NAN;
    x[N + 7] = INFINITY;
    qcal_observer_kind kinds[5] = { QCAL_OBSERVER_HISTOGRAM, QCAL_OBSERVER_PERCENTILE,
                                    QCAL_OBSERVER_ENTROPY, QCAL_OBSERVER_MSE,
                                    QCAL_OBSERVER_MINMAX };
    for (int k = 0; k < 5; k++) {
        for (int trial = 0; trial < 20; trial++) {
            qcal_observer *whole = make_default(kinds[k]), *parts = make_default(kinds[k]);
            for (int b = 0; b < 3; b++) {
                assert_int_equal(qcal_observer_update(whole, tu_vec(x + b * N, N)), QCAL_OK);
                int64_t pos = 0;
                while (pos < N) {
                    int64_t len = trial == 0 ? 1 + (pos % 3) * 4096
                                             : 1 + (int64_t)(rng_next() % (N / (1 + trial % 5)));
                    if (len > N - pos)
                        len = N - pos;
                    assert_int_equal(qcal_observer_update_part(parts, tu_vec(x + b * N + pos, len),
                                                               pos + len == N), QCAL_OK);
                    pos += len;
                }
            }
            void *a, *b;
            size_t la, lb;
            assert_int_equal(qcal_observer_save(whole, &a, &la), QCAL_OK);
            assert_int_equal(qcal_observer_save(parts, &b, &lb), QCAL_OK);
            if (la != lb || memcmp(a, b, la))
                fail_msg("%s trial %d: state of the parts differs from whole batches",
                         qcal_observer_kind_name(kinds[k]), trial);
            uint64_t nb = 0, nf = 0;
            assert_int_equal(qcal_observer_batches(parts, &nb), QCAL_OK);
            assert_int_equal(nb, 3);
            assert_int_equal(qcal_observer_nonfinite(parts, &nf), QCAL_OK);
            assert_int_equal(nf, 2);
            qcal_free(a);
            qcal_free(b);
            qcal_observer_destroy(&whole);
            qcal_observer_destroy(&parts);
        }
    }
    /* minmax with zero bounds: a batch holding both zeros and nothing below (or above)
     * them, cut at every position, gives the state of the whole batch (+0 bounds). */
    {
        float z[6] = { -0.0f, 2.0f, 0.0f, -0.0f, 1.0f, 0.0f }, nz[6];
        for (int i = 0; i < 6; i++)
            nz[i] = -z[i];
        float *zs[2] = { z, nz };
        for (int sgn = 0; sgn < 2; sgn++)
            for (int cut = 1; cut < 6; cut++) {
                qcal_observer *whole = make_default(QCAL_OBSERVER_MINMAX),
                              *parts = make_default(QCAL_OBSERVER_MINMAX);
                assert_int_equal(qcal_observer_update(whole, tu_vec(zs[sgn], 6)), QCAL_OK);
                assert_int_equal(qcal_observer_update_part(parts, tu_vec(zs[sgn], cut), false),
                                 QCAL_OK);
                assert_int_equal(qcal_observer_update_part(parts, tu_vec(zs[sgn] + cut, 6 - cut),
                                                           true), QCAL_OK);
                void *a, *b;
                size_t la, lb;
                assert_int_equal(qcal_observer_save(whole, &a, &la), QCAL_OK);
                assert_int_equal(qcal_observer_save(parts, &b, &lb), QCAL_OK);
                assert_int_equal(la, lb);
                assert_memory_equal(a, b, la);
                float lo, hi;
                int64_t n;
                assert_int_equal(qcal_observer_data_range(parts, 1, &lo, &hi, &n), QCAL_OK);
                assert_false(signbit(sgn ? hi : lo));   /* the zero bound is +0 */
                qcal_free(a);
                qcal_free(b);
                qcal_observer_destroy(&whole);
                qcal_observer_destroy(&parts);
            }
    }
    /* Refused: moving averages, per-channel kinds, the first-batch grid, the error
     * non-finite policy (minmax included). */
    qcal_observer_config c;
    for (int v = 0; v < 5; v++) {
        qcal_observer_config_default(&c, v == 0 ? QCAL_OBSERVER_PER_CHANNEL_MINMAX
                                         : v == 1 ? QCAL_OBSERVER_MOVING_AVERAGE_MINMAX
                                         : v == 4 ? QCAL_OBSERVER_MINMAX
                                                  : QCAL_OBSERVER_HISTOGRAM);
        if (v == 2)
            c.grid = QCAL_GRID_FIRST_BATCH;
        if (v == 3 || v == 4)
            c.nonfinite = QCAL_NONFINITE_ERROR;
        assert_false(qcal_observer_config_splits(&c));
        qcal_observer *o = NULL;
        assert_int_equal(qcal_observer_create(&c, &o), QCAL_OK);
        assert_int_equal(qcal_observer_update_part(o, tu_vec(x + 200, 100), true),
                         QCAL_ERR_UNSUPPORTED);
        uint64_t nb = 9;
        qcal_observer_batches(o, &nb);
        assert_int_equal(nb, 0);
        float lo, hi;
        int64_t n;
        assert_int_equal(qcal_observer_data_range(o, 1, &lo, &hi, &n), QCAL_NO_DATA);
        qcal_observer_destroy(&o);
    }
    qcal_observer_config_default(&c, QCAL_OBSERVER_ENTROPY);
    assert_true(qcal_observer_config_splits(&c));
    assert_false(qcal_observer_config_splits(NULL));
    qcal_observer *o = make_default(QCAL_OBSERVER_HISTOGRAM);
    int64_t zero = 0;
    qcal_tensor empty;
    assert_int_equal(qcal_tensor_init(&empty, x, 1, &zero), QCAL_OK);
    assert_int_equal(qcal_observer_update_part(o, &empty, true), QCAL_ERR_EMPTY);
    qcal_observer_destroy(&o);
    free(x);
}

static void test_histogram_qparams_end_to_end(void **state)
{
    (void)state;
    /* One batch whose data min/max are integers: PyTorch 1.13's int() truncation of the
     * histc bounds is then harmless, so qcal's chosen range equals the search on
     * torch.histc(x, bins, min, max): check the observer path wires the search. */
    tu_ref_file *r = tu_ref_load("histogram", "histc.bin");
    const tu_ref_arr *x = tu_ref_get(r, "case0/x");
    const uint64_t *want = tu_ref_get(r, "case0/counts")->data;
    const double *meta = tu_ref_get(r, "case0/meta")->data;
    float *fh = malloc(2048 * sizeof *fh);
    for (int i = 0; i < 2048; i++)
        fh[i] = (float)want[i];
    float ea, eb;
    assert_int_equal(qcal_hist_l2_search(fh, 2048, (float)meta[1], (float)meta[2], 256.0, &ea,
                                         &eb), QCAL_OK);
    qcal_observer *obs = make_obs(QCAL_OBSERVER_HISTOGRAM);
    feed(obs, x->data, (int64_t)x->count);
    float a, b;
    int64_t n;
    assert_int_equal(qcal_observer_qrange(obs, 1, &a, &b, &n), QCAL_OK);
    assert_true(fbits(a) == fbits(ea) && fbits(b) == fbits(eb));
    assert_true(a >= (float)meta[1] && b <= (float)meta[2] && a < b);
    free(fh);
    qcal_observer_destroy(&obs);
    tu_ref_free(r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_torch_sum_small),
        cmocka_unit_test(test_l2_search_vs_pytorch),
        cmocka_unit_test(test_histc_vs_torch),
        cmocka_unit_test(test_histc_inside_kernels),
        cmocka_unit_test(test_histc_inside_dispatch),
        cmocka_unit_test(test_growth_invariants),
        cmocka_unit_test(test_growth_keeps_resolution),
        cmocka_unit_test(test_merge),
        cmocka_unit_test(test_update_parts),
        cmocka_unit_test(test_nonfinite),
        cmocka_unit_test(test_empty_constant_zero),
        cmocka_unit_test(test_near_flt_max),
        cmocka_unit_test(test_threads_identical),
        cmocka_unit_test(test_save_load),
        cmocka_unit_test(test_histogram_qparams_end_to_end),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
